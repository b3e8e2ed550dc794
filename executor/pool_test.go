package executor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/executor"
)

// TestWorkerPool runs 500 tasks through a pool of three workers on one
// queue — two reading the ready stream directly, one long-polling the
// HTTP API — and checks that every task ran exactly once, under the
// claim that the scheduler accepted, and succeeded.
func TestWorkerPool(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	const n = 500
	const queue = "pool"

	type call struct{ deliveryID, executorID string }
	var (
		mu    sync.Mutex
		calls = map[string][]call{}
	)
	handler := func(_ context.Context, run *executor.Run) (string, error) {
		c := call{executorID: run.Task.Claim.ExecutorID, deliveryID: run.Task.Claim.DeliveryID}
		mu.Lock()
		calls[run.Task.ID] = append(calls[run.Task.ID], c)
		mu.Unlock()
		return "done " + run.Task.ID, nil
	}
	cps := e.kv(t, "pool")
	e.start(t, e.natsCfg(queue, "nats-1", cps), handler)
	e.start(t, e.natsCfg(queue, "nats-2", cps), handler)
	e.start(t, e.httpCfg(queue, "http-1"), handler)

	ids := make([]string, n)
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			task, _, err := e.client.Schedule(ctx, api.ScheduleRequest{Queue: queue, Message: wkText(fmt.Sprint("task ", i))})
			ids[i] = task.ID
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	wkEventually(t, "every handler call", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == n
	})

	byExecutor := map[string]int{}
	for _, id := range ids {
		task := e.waitStatus(t, id, "succeeded")
		mu.Lock()
		got := calls[id]
		mu.Unlock()
		if len(got) != 1 {
			t.Fatalf("task %s: handler ran %d times: %+v", id, len(got), got)
		}
		if task.Claim == nil || task.Claim.DeliveryID != got[0].deliveryID || task.Claim.ExecutorID != got[0].executorID {
			t.Fatalf("task %s: handler ran under %+v, the accepted claim is %+v", id, got[0], task.Claim)
		}
		if task.Result == nil || !task.Result.Success || task.Result.Summary != "done "+id {
			t.Fatalf("task %s: result %+v", id, task.Result)
		}
		byExecutor[got[0].executorID]++
	}
	for _, ex := range []string{"nats-1", "nats-2", "http-1"} {
		if byExecutor[ex] == 0 {
			t.Errorf("executor %s ran no task: %v", ex, byExecutor)
		}
	}
	for _, status := range []string{"scheduled", "queued", "running"} {
		l, err := e.client.List(ctx, api.ListOptions{Status: status, Queue: queue, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Tasks) != 0 {
			t.Fatalf("%d task(s) left %s, e.g. %+v", len(l.Tasks), status, l.Tasks[0])
		}
	}
	wkEventually(t, "every checkpoint done", func() bool {
		open, err := cps.List(ctx)
		return err == nil && len(open) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != n {
		t.Fatalf("handler ran for %d distinct tasks, want %d", len(calls), n)
	}
}
