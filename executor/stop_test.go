package executor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestWorkerKilledMidTask stops a worker while its handler runs: nothing
// is reported, the running deadline times the task out, and a new worker
// under the same executor id drops the dead run and serves the queue.
func TestWorkerKilledMidTask(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	cps := &executor.MemoryCheckpoints{}
	cfg := e.httpCfg("killed", "exec-k")
	cfg.Checkpoints = cps

	started := make(chan string, 1)
	first := e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		started <- run.Task.ID
		return "", wkBlock(ctx)
	})
	timeout := 1
	task := e.schedule(t, api.ScheduleRequest{Queue: "killed", TimeoutSeconds: &timeout, Message: wkText("hang")})
	if got := wkRecv(t, "handler start", started); got != task.ID {
		t.Fatalf("handler ran %s, want %s", got, task.ID)
	}
	e.waitStatus(t, task.ID, "running")
	first.stop(t)

	timedOut := e.waitStatus(t, task.ID, "timed_out")
	if timedOut.Result != nil {
		t.Fatalf("a killed worker reported a result: %+v", timedOut.Result)
	}
	if n := e.countEvents(t, task.ID, "ResultRecorded"); n != 0 {
		t.Fatalf("%d ResultRecorded events, want none", n)
	}

	var (
		mu  sync.Mutex
		ran []string
	)
	e.start(t, cfg, func(_ context.Context, run *executor.Run) (string, error) {
		mu.Lock()
		ran = append(ran, run.Task.ID)
		mu.Unlock()
		return "second", nil
	})
	next := e.schedule(t, api.ScheduleRequest{Queue: "killed", Message: wkText("work")})
	done := e.waitStatus(t, next.ID, "succeeded")
	if done.Result == nil || done.Result.Summary != "second" || done.Claim.ExecutorID != "exec-k" {
		t.Fatalf("second task: %+v", done)
	}
	mu.Lock()
	if len(ran) != 1 || ran[0] != next.ID {
		t.Errorf("new worker ran %v, want only %s (the timed-out run is not resumed)", ran, next.ID)
	}
	mu.Unlock()
	wkEventually(t, "checkpoints done", func() bool {
		open, err := cps.List(ctx)
		return err == nil && len(open) == 0
	})
}

// TestWorkerCancelRootStopsChild cancels a root while its child's handler
// runs steps: the run's context ends, Step answers ErrStopped and never
// starts another step, and the worker cancels the child. Steps either
// ignore their context (short sleeps) or block until it ends.
func TestWorkerCancelRootStopsChild(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		pause func(ctx context.Context) error
	}{
		{"SleepingSteps", func(context.Context) error { time.Sleep(5 * time.Millisecond); return nil }},
		// A long step that ends with its context: the stop lands in it.
		{"InterruptedStep", wkBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testCancelRootStopsChild(t, tc.pause)
		})
	}
}

func testCancelRootStopsChild(t *testing.T, pause func(ctx context.Context) error) {
	e := wkSetup(t)
	ctx := context.Background()

	root := e.schedule(t, api.ScheduleRequest{Queue: "nobody", Message: wkText("root")})
	type outcome struct {
		stoppedAt  time.Time
		stepErr    error
		ctxErr     error
		laterErrs  []error
		reason     string
		stepStarts []time.Time
	}
	firstStep := make(chan struct{})
	result := make(chan outcome, 1)
	e.start(t, e.httpCfg("children", "exec-c"), func(ctx context.Context, run *executor.Run) (string, error) {
		var (
			out  outcome
			mu   sync.Mutex
			once sync.Once
		)
		step := func(ctx context.Context) error {
			mu.Lock()
			out.stepStarts = append(out.stepStarts, time.Now())
			mu.Unlock()
			once.Do(func() { close(firstStep) })
			return pause(ctx)
		}
		var err error
		for i := 0; err == nil; i++ {
			if i > 10000 {
				err = errors.New("never stopped")
				break
			}
			err = run.Step(ctx, fmt.Sprint("s", i), step)
		}
		out.stoppedAt, out.stepErr, out.ctxErr, out.reason = time.Now(), err, ctx.Err(), run.StopReason()
		// A handler that ignores the stop gets nowhere.
		for i := range 3 {
			out.laterErrs = append(out.laterErrs, run.Step(ctx, fmt.Sprint("late", i), step))
		}
		mu.Lock()
		out.stepStarts = slices.Clone(out.stepStarts)
		mu.Unlock()
		result <- out
		return "", err
	})
	child := e.schedule(t, api.ScheduleRequest{Queue: "children", ParentID: root.ID, Message: wkText("child")})
	wkRecv(t, "first step", firstStep)
	if _, err := e.client.Cancel(ctx, root.ID, "operator says stop"); err != nil {
		t.Fatal(err)
	}

	out := wkRecv(t, "handler end", result)
	if !errors.Is(out.stepErr, executor.ErrStopped) {
		t.Fatalf("Step returned %v, want ErrStopped", out.stepErr)
	}
	if out.ctxErr == nil {
		t.Fatal("the handler's context was not cancelled by the stop")
	}
	if out.reason != "ancestor_terminal" {
		t.Fatalf("stop reason %q, want ancestor_terminal", out.reason)
	}
	for i, err := range out.laterErrs {
		if !errors.Is(err, executor.ErrStopped) {
			t.Fatalf("Step %d after the stop returned %v, want ErrStopped", i, err)
		}
	}
	for i, at := range out.stepStarts {
		if !at.Before(out.stoppedAt) {
			t.Fatalf("step %d began at %v, after Step answered ErrStopped at %v", i, at, out.stoppedAt)
		}
	}
	canceled := e.waitStatus(t, child.ID, "canceled")
	if !strings.Contains(canceled.Reason, "ancestor") || canceled.Result != nil {
		t.Fatalf("child canceled with reason %q, result %+v", canceled.Reason, canceled.Result)
	}
	if got := e.waitStatus(t, root.ID, "canceled"); got.Reason != "operator says stop" {
		t.Fatalf("root reason %q", got.Reason)
	}
}

// TestWorkerCancelInterruptsEffect: a stop that lands while an effect's do
// runs comes back as ErrStopped, so a handler can tell it from a failure.
func TestWorkerCancelInterruptsEffect(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	task := e.schedule(t, api.ScheduleRequest{Queue: "effects", Message: wkText("effect")})
	inDo := make(chan struct{})
	got := make(chan error, 1)
	e.start(t, e.httpCfg("effects", "exec-e"), func(ctx context.Context, run *executor.Run) (string, error) {
		_, err := run.Effect(ctx, "pr", func(ctx context.Context) (events.Effect, error) {
			close(inDo)
			return events.Effect{}, wkBlock(ctx)
		}, nil)
		got <- err
		return "", err
	})
	wkRecv(t, "effect started", inDo)
	if _, err := e.client.Cancel(context.Background(), task.ID, "stop the effect"); err != nil {
		t.Fatal(err)
	}
	if err := wkRecv(t, "effect result", got); !errors.Is(err, executor.ErrStopped) {
		t.Fatalf("Effect returned %v, want ErrStopped", err)
	}
}
