package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/internal/node"
)

// BenchmarkFireLateness runs only the fire lateness section of the bench
// on a fresh embedded server and reports its figures: a look at that one
// figure without the whole run (`go test -run '^$' -bench FireLateness
// -benchtime 1x ./internal/bench`). BENCH_SCALE scales it as it does make
// bench (default 0.1); BENCH_PROFILE names a directory for the section's
// CPU profile. The section's length is its own, not b.N's.
func BenchmarkFireLateness(b *testing.B) {
	scale := 0.1
	if v := os.Getenv("BENCH_SCALE"); v != "" {
		var err error
		if scale, err = strconv.ParseFloat(v, 64); err != nil || !(scale > 0) {
			b.Fatalf("BENCH_SCALE=%q: want a positive number", v)
		}
	}
	for b.Loop() {
		r := &run{cfg: Config{Scale: scale, ProfileDir: os.Getenv("BENCH_PROFILE")}, log: os.Stderr, dir: b.TempDir(), report: &Report{}}
		srv, nc, err := startServer(b.TempDir(), false)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		err = r.withNode(ctx, nc, node.Config{}, func(nd *node.Node) error {
			return r.section(ctx, "fires", func(ctx context.Context) error { return r.fires(ctx, nd) })
		})
		nc.Close()
		srv.Shutdown()
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range r.report.Figures {
			b.ReportMetric(f.Value, f.Unit+"/"+strings.ReplaceAll(f.Name, " ", "-"))
		}
	}
}
