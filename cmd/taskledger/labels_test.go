package main

import (
	"strings"
	"testing"
)

// TestCLILabelsAndRetry drives the real binary: schedule with labels,
// list by label, retry a canceled task (idempotent with --request-id),
// and the new task's show and history say where it came from.
func TestCLILabelsAndRetry(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	server := []string{"--server", srv.client.BaseURL}
	run := func(wantCode int, args ...string) string {
		t.Helper()
		out, errOut, code := replayCLI(t, append(args, server...)...)
		if code != wantCode {
			t.Fatalf("taskledger %v: exit %d, want %d\nstdout %s\nstderr %s", args, code, wantCode, out, errOut)
		}
		return out + errOut
	}
	out := run(0, "schedule", "--queue", "cli-labels", "--delay", "1h", "--label", "repo=example/storefront", "--label", "team=red", "--message", "flaky")
	id := strings.Fields(out)[1]
	run(0, "schedule", "--queue", "cli-labels", "--delay", "1h", "--label", "repo=example/other")
	if out := run(0, "list", "--label", "repo=example/storefront", "--label", "team=red"); !strings.Contains(out, id) || strings.Count(out, "\n") != 2 {
		t.Fatalf("list by labels:\n%s", out)
	}
	if out := run(0, "show", id); !strings.Contains(out, "repo=example/storefront,team=red") {
		t.Fatalf("show lacks the labels:\n%s", out)
	}
	run(2, "list", "--label", "no-equals")
	if out := run(1, "list", "--label", "Bad=key"); !strings.Contains(out, "invalid_argument") {
		t.Fatalf("a bad label filter:\n%s", out)
	}
	if out := run(1, "retry", id); !strings.Contains(out, "not_terminal") {
		t.Fatalf("retry of a live task:\n%s", out)
	}
	run(0, "cancel", id)
	first := strings.Fields(run(0, "retry", id, "--message", "try again", "--request-id", "cli-retry"))
	if first[0] != "retried" || first[1] != id || first[3] == id {
		t.Fatalf("retry: %v", first)
	}
	again := strings.Fields(run(0, "retry", id, "--request-id", "cli-retry"))
	if again[0] != "exists" || again[6] != first[3] {
		t.Fatalf("repeated retry: %v, want the task %s", again, first[3])
	}
	if out := run(0, "show", first[3]); !strings.Contains(out, "retry of") || !strings.Contains(out, "try again") || !strings.Contains(out, "team=red") {
		t.Fatalf("show of the retry:\n%s", out)
	}
	if out := run(0, "history", first[3]); !strings.Contains(out, "retry of "+id) {
		t.Fatalf("history of the retry:\n%s", out)
	}
}
