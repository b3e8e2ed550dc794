package executor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/executor"
)

// wkFailingChecks answers the first checks check_failed, as a scheduler
// failing open does, then asks the scheduler.
type wkFailingChecks struct {
	*api.Client
	left *atomic.Int32
}

func (f wkFailingChecks) Check(ctx context.Context, id, deliveryID string) (api.Check, error) {
	if f.left.Add(-1) >= 0 {
		return api.Check{Reason: api.ReasonCheckFailed, Messages: []api.MailItem{}}, nil
	}
	return f.Client.Check(ctx, id, deliveryID)
}

// TestCheckFailedSurfaced: a stop check the scheduler answers
// check_failed keeps the run going, and the run and the worker say so: a
// typed outcome (Run.LastCheck) and a counter (Worker.CheckFailures).
func TestCheckFailedSurfaced(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	const queue = "checkfailed"
	left := &atomic.Int32{}
	left.Store(3)
	cfg := e.httpCfg(queue, "exec-cf")
	cfg.API, cfg.CheckInterval = wkFailingChecks{e.client, left}, time.Hour // only the handler's checks
	seen := make(chan []executor.CheckOutcome, 1)
	w, err := executor.NewWorker(cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		var outcomes []executor.CheckOutcome
		for range 4 {
			if err := run.Check(ctx); err != nil {
				return "", err
			}
			outcomes = append(outcomes, run.LastCheck())
		}
		seen <- outcomes
		return "kept working", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("worker Run: %v", err)
		}
	})

	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("work")})
	outcomes := wkRecv(t, "the handler's checks", seen)
	for i, o := range outcomes {
		if want := i < 3; o.Failed() != want || o.At.IsZero() {
			t.Fatalf("check %d: %+v (failed %v), want failed %v", i, o, o.Failed(), want)
		}
	}
	if outcomes[0].Reason != api.ReasonCheckFailed || outcomes[3].Reason != api.ReasonActive {
		t.Fatalf("reasons %q and %q, want check_failed then active", outcomes[0].Reason, outcomes[3].Reason)
	}
	if n := w.CheckFailures(); n != 3 {
		t.Fatalf("worker counted %d failed checks, want 3", n)
	}
	if done := e.waitStatus(t, task.ID, "succeeded"); done.Result == nil || done.Result.Summary != "kept working" {
		t.Fatalf("task %+v, want it succeeded: a failed check does not stop the run", done)
	}
}
