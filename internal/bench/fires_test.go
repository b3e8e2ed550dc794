package bench

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/taskledger/taskledger/internal/node"
)

// TestFireLateness runs only the fire lateness section of the bench, on
// a fresh embedded server, and logs its figures: a look at that one
// figure without the whole run. It is skipped unless BENCH_FIRES is set;
// BENCH_SCALE scales it as it does make bench (default 0.1), and
// BENCH_PROFILE names a directory for the section's CPU profile.
func TestFireLateness(t *testing.T) {
	if os.Getenv("BENCH_FIRES") == "" {
		t.Skip("BENCH_FIRES is not set")
	}
	scale := 0.1
	if v := os.Getenv("BENCH_SCALE"); v != "" {
		var err error
		if scale, err = strconv.ParseFloat(v, 64); err != nil || !(scale > 0) {
			t.Fatalf("BENCH_SCALE=%q: want a positive number", v)
		}
	}
	r := &run{cfg: Config{Scale: scale, ProfileDir: os.Getenv("BENCH_PROFILE")}, log: os.Stderr, dir: t.TempDir(), report: &Report{}}
	srv, nc, err := startServer(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	defer nc.Close()
	ctx := context.Background()
	if err := r.withNode(ctx, nc, node.Config{}, func(nd *node.Node) error {
		return r.section(ctx, "fires", func(ctx context.Context) error { return r.fires(ctx, nd) })
	}); err != nil {
		t.Fatal(err)
	}
	for _, f := range r.report.Figures {
		t.Logf("%s: %s %s", f.Name, formatValue(f.Value), f.Unit)
	}
}
