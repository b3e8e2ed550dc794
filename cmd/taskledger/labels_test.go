package main

import (
	"context"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/crashpoint"
)

// TestCLILabelsAndRetry drives the real binary: schedule with labels, a
// retry policy and a concurrency key, list by label, retry a canceled task
// (idempotent with --request-id), the new task's show and history say
// where it came from and that it keeps the policy and the key; a periodic
// schedule's task takes the same flags and passes them to its runs.
func TestCLILabelsAndRetry(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	run := cliAgainst(t, srv)
	out := run(0, "schedule", "--queue", "cli-labels", "--delay", "1h", "--label", "repo=example/storefront", "--label", "team=red", "--message", "flaky",
		"--max-attempts", "3", "--retry-on", "failed,timed_out", "--concurrency-key", "repo:example/storefront", "--concurrency-limit", "5")
	const policy, key = "attempt 1 of 3, backoff 10s up to 3600s, on failed,timed_out", "repo:example/storefront (limit 5)"
	id := strings.Fields(out)[1]
	run(0, "schedule", "--queue", "cli-labels", "--delay", "1h", "--label", "repo=example/other")
	if out := run(0, "list", "--label", "repo=example/storefront", "--label", "team=red"); !strings.Contains(out, id) || strings.Count(out, "\n") != 2 {
		t.Fatalf("list by labels:\n%s", out)
	}
	if out := run(0, "show", id); !strings.Contains(out, "repo=example/storefront,team=red") || !strings.Contains(out, policy) || !strings.Contains(out, key) {
		t.Fatalf("show lacks the labels, the policy or the key:\n%s", out)
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
	if out := run(0, "show", first[3]); !strings.Contains(out, "retry of") || !strings.Contains(out, "try again") || !strings.Contains(out, "team=red") ||
		!strings.Contains(out, policy) || !strings.Contains(out, key) {
		t.Fatalf("show of the retry:\n%s", out)
	}
	if out := run(0, "history", first[3]); !strings.Contains(out, "retry of "+id) {
		t.Fatalf("history of the retry:\n%s", out)
	}
	if out := run(0, "list", "--request-id", "cli-retry"); !strings.Contains(out, first[3]) || strings.Count(out, "\n") != 2 {
		t.Fatalf("list by request id:\n%s", out)
	}

	run(0, "schedules", "create", "cli-spec", "--every", "1h", "--paused", "--queue", "cli-labels", "--label", "kind=nightly",
		"--max-attempts", "3", "--retry-on", "failed,timed_out", "--concurrency-key", "repo:example/storefront", "--concurrency-limit", "5")
	if out := run(0, "schedules", "show", "cli-spec"); !strings.Contains(out, "kind=nightly") ||
		!strings.Contains(out, "3 attempts, backoff 10s up to 3600s, on failed,timed_out") || !strings.Contains(out, key) {
		t.Fatalf("schedules show lacks the task's labels, policy or key:\n%s", out)
	}
	fired := strings.Fields(run(0, "schedules", "trigger", "cli-spec"))[3]
	if out := run(0, "show", fired); !strings.Contains(out, "kind=nightly") || !strings.Contains(out, policy) || !strings.Contains(out, key) {
		t.Fatalf("show of a run's task:\n%s", out)
	}
	if out := run(1, "schedules", "create", "cli-bad", "--every", "1h", "--label", "Bad=key"); !strings.Contains(out, "invalid_argument") {
		t.Fatalf("a schedule with a bad label:\n%s", out)
	}
}

// TestCrashAtRetry kills the server right after a retry's new task is
// appended, before the answer: after a restart the repeated retry (same
// requestId) answers that one task, not a second, and the log verifies.
func TestCrashAtRetry(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "crashpoints")
	data, addr := t.TempDir(), freeAddr(t)
	// The first Scheduled hit is the old task's; the second, the retry's, crashes.
	srv := mustLaunch(t, bin, data, addr, "TASKLEDGER_CRASH_AT="+crashpoint.Scheduled, "TASKLEDGER_CRASH_AFTER=1")
	ctx := context.Background()
	old, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "crash-retry", Labels: map[string]string{"repo": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.client.Cancel(ctx, old.ID, "retry it"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := srv.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{RequestID: "crash-retry"}); err == nil {
		t.Fatal("the retry was answered; the server should have died first")
	}
	srv.mustCrashAt(t, crashpoint.Scheduled)
	srv = mustLaunch(t, bin, data, addr)
	retry, created, err := srv.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{RequestID: "crash-retry"})
	if err != nil || created || retry.RetryOf != old.ID || retry.Labels["repo"] != "x" {
		t.Fatalf("repeated retry after the crash: created=%v %+v %v; want the task stored before the crash", created, retry, err)
	}
	l, err := srv.client.List(ctx, api.ListOptions{Queue: "crash-retry"})
	if err != nil || len(l.Tasks) != 2 {
		t.Fatalf("tasks after the crash: %v %v, want the old one and one retry", taskIDsOf(l.Tasks), err)
	}
	srv.mustStop(t)
	mustVerify(t, bin, data)
}

func taskIDsOf(tasks []api.Task) []string {
	ids := make([]string, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	return ids
}
