package executor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestWorkerHandlerFailure reports a handler's error, and a panic, as a
// failed result; the worker keeps serving its queue.
func TestWorkerHandlerFailure(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	e.start(t, e.httpCfg("failing", "exec-x"), func(_ context.Context, run *executor.Run) (string, error) {
		switch run.Task.Message.Content[0].Text {
		case "error":
			return "half done", errors.New("tests are red")
		case "panic":
			panic("nil map")
		case "huge":
			return strings.Repeat("s", 1<<20), errors.New(strings.Repeat("e", 1<<20))
		}
		return "fine", nil
	})
	for _, tc := range []struct{ msg, status, errText string }{
		{"error", "failed", "tests are red"},
		{"panic", "failed", "handler panicked: nil map"},
		{"ok", "succeeded", ""},
		// Over the server's limits: cut to them, so the result is recorded.
		{"huge", "failed", strings.Repeat("e", events.MaxErrorBytes)},
	} {
		task := e.schedule(t, api.ScheduleRequest{Queue: "failing", Message: wkText(tc.msg)})
		done := e.waitStatus(t, task.ID, tc.status)
		if done.Result == nil || done.Result.Error != tc.errText {
			t.Fatalf("%s: result %+v, want error %q", tc.msg, done.Result, tc.errText)
		}
	}
}

// TestWorkerStaleNotification gives a NATS-mode worker the notification
// of a task canceled while queued: the rejected claim is dropped without
// running anything, and the next task runs.
func TestWorkerStaleNotification(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	stale := e.schedule(t, api.ScheduleRequest{Queue: "stale", Message: wkText("stale")})
	e.waitStatus(t, stale.ID, "queued")
	if _, err := e.client.Cancel(ctx, stale.ID, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 2)
	e.start(t, e.natsCfg("stale", "exec-s", e.kv(t, "stale")), func(_ context.Context, run *executor.Run) (string, error) {
		ran <- run.Task.ID
		return "ran", nil
	})
	fresh := e.schedule(t, api.ScheduleRequest{Queue: "stale", Message: wkText("fresh")})
	e.waitStatus(t, fresh.ID, "succeeded")
	if got := wkRecv(t, "handler", ran); got != fresh.ID {
		t.Fatalf("handler ran %s, want %s", got, fresh.ID)
	}
	if got, err := e.client.Get(ctx, stale.ID); err != nil || got.Status != "canceled" || !strings.Contains(got.Reason, "changed") {
		t.Fatalf("stale task %+v, %v", got, err)
	}
	if n := e.countEvents(t, stale.ID, "Claimed"); n != 0 {
		t.Fatalf("stale task claimed %d times", n)
	}
}

// TestWorkerRetryContinuesRun: a task with two attempts fails its first
// after one step; the second attempt, claimed by the same worker, starts
// from the first's Run (the step is not run again) and succeeds.
func TestWorkerRetryContinuesRun(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ran := make(chan string, 4)
	e.start(t, e.httpCfg("retrying", "exec-r"), func(ctx context.Context, run *executor.Run) (string, error) {
		if err := run.Step(ctx, "prepare", func(context.Context) error { ran <- "prepare"; return nil }); err != nil {
			return "", err
		}
		ran <- fmt.Sprintf("attempt %d", run.Task.Attempt)
		if run.Task.Attempt == 1 {
			return "", errors.New("flaky")
		}
		return "done", nil
	})
	two, zero := 2, 0
	task := e.schedule(t, api.ScheduleRequest{Queue: "retrying", Retry: &api.RetryRequest{MaxAttempts: &two, BackoffSeconds: &zero}})
	done := e.waitStatus(t, task.ID, "succeeded")
	if done.Attempt != 2 || len(done.Attempts) != 2 || done.Attempts[0].Outcome != "failed" || done.Attempts[0].Error != "flaky" {
		t.Fatalf("attempts %+v", done.Attempts)
	}
	var got []string
	for range 3 {
		got = append(got, wkRecv(t, "a step", ran))
	}
	if want := []string{"prepare", "attempt 1", "attempt 2"}; !slices.Equal(got, want) {
		t.Fatalf("ran %q, want %q", got, want)
	}
}
