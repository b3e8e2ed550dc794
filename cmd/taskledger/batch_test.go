package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
)

// TestScheduleFile schedules an NDJSON file through the batch route with
// the real binary: more lines than one batch holds, one refused line, and
// a second run of the same file that finds every task again.
func TestScheduleFile(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	server := strings.TrimPrefix(srv.client.BaseURL, "http://")
	const n = api.MaxBatchItems + 5
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"queue":"file","requestId":"line-%d","delaySeconds":3600}`+"\n", i)
		if i == 7 {
			b.WriteString("\n" + `{"queue":"bad.queue"}` + "\n")
		}
	}
	path := filepath.Join(t.TempDir(), "tasks.ndjson")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, round := range []string{"scheduled", "exists"} {
		out, errOut, code := replayCLI(t, "schedule", "--server", "http://"+server, "--file", path)
		if code != 1 || !strings.Contains(errOut, fmt.Sprintf("1 of %d tasks were refused", n+1)) {
			t.Fatalf("exit %d, stderr %q; want 1 and the refused count", code, errOut)
		}
		if got := strings.Count(out, " "+round+" "); got != n {
			t.Fatalf("%d lines say %q, want %d:\n%.500s", got, round, n, out)
		}
		if !strings.Contains(out, "line 10 refused: invalid_argument") {
			t.Fatalf("the bad line (10) is not reported refused:\n%.2000s", out)
		}
	}
	var total int
	for after := ""; ; {
		l, err := srv.client.List(context.Background(), api.ListOptions{Queue: "file", Limit: api.MaxListLimit, After: after})
		if err != nil {
			t.Fatal(err)
		}
		total += len(l.Tasks)
		if l.Next == "" {
			break
		}
		after = l.Next
	}
	if total != n {
		t.Fatalf("%d tasks in the queue after two runs, want %d", total, n)
	}
}
