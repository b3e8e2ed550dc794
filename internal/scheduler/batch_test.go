package scheduler_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
)

// waitCounter is a node's projections, counting the waits for their tail.
// It folds nothing in ahead of the tail (ApplyOwn), so every write that
// must show in the views waits for it.
type waitCounter struct {
	*projections.Engine
	waits atomic.Int64
	mu    sync.Mutex
	at    []events.Position // the positions waited for
}

func (w *waitCounter) ApplyOwn([]events.Event) bool { return false }

func (w *waitCounter) WaitFor(ctx context.Context, seq events.Position) error {
	w.waits.Add(1)
	w.mu.Lock()
	w.at = append(w.at, seq)
	w.mu.Unlock()
	return w.Engine.WaitFor(ctx, seq)
}

// TestRecordResultsWaitsOnce: a batch of results, whose ending events
// wait for the projections' tail (waitCounter), waits once, for the last of them, and
// answers only then: a listing right after shows every task finished.
func TestRecordResultsWaitsOnce(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	views := &waitCounter{Engine: n.Engine}
	svc, err := scheduler.New(scheduler.Config{Store: n.Store, Views: views, JS: n.Store.JetStream(), Subjects: n.NS.Subjects, ReadyStream: n.NS.ReadyStream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	const tasks = 30
	items := make([]scheduler.ResultItem, tasks)
	for i := range items {
		st := running(t, n, operator, scheduler.ScheduleRequest{Queue: "results"})
		items[i] = scheduler.ResultItem{TaskID: st.TaskID, DeliveryID: st.Delivery.ID, Result: events.Result{Success: true}}
	}
	views.waits.Store(0)
	outs, err := svc.RecordResults(ctx, operator, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o.Err != nil || o.State.Status != aggregate.StatusSucceeded {
			t.Fatalf("result %d: %v, %s", i, o.Err, o.State.Status)
		}
	}
	if got := views.waits.Load(); got != 1 {
		t.Fatalf("a batch of %d results waited for the projections %d times, want once", tasks, got)
	}
	list, _, err := n.Service.List(ctx, operator, scheduler.TaskFilter{Queue: "results", Status: aggregate.StatusSucceeded}, "", api.MaxListLimit)
	if err != nil || len(list) != tasks {
		t.Fatalf("%d succeeded tasks listed right after the batch (%v), want %d", len(list), err, tasks)
	}
}

// TestRecordResultsWaitsEveryShard: on a sharded log a batch waits for
// the highest position each shard's items need, not for the highest
// position of all, which is in one shard only.
func TestRecordResultsWaitsEveryShard(t *testing.T) {
	t.Parallel()
	n := setup(t, func(c *node.Config) { c.Shards = 3 })
	views := &waitCounter{Engine: n.Engine}
	svc, err := scheduler.New(scheduler.Config{Store: n.Store, Views: views, JS: n.Store.JetStream(), Subjects: n.NS.Subjects, ReadyStream: n.NS.ReadyStream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	shards := n.Store.Shards()
	items := make([]scheduler.ResultItem, 30)
	used := map[int]bool{}
	for i := range items {
		st := running(t, n, operator, scheduler.ScheduleRequest{Queue: "results"})
		items[i] = scheduler.ResultItem{TaskID: st.TaskID, DeliveryID: st.Delivery.ID, Result: events.Result{Success: true}}
		shard, _ := shards.Split(st.LastSeq)
		used[shard] = true
	}
	if _, err := svc.RecordResults(context.Background(), operator, items); err != nil {
		t.Fatal(err)
	}
	waited := map[int]bool{}
	for _, pos := range views.at {
		shard, _ := shards.Split(pos)
		waited[shard] = true
	}
	if len(waited) != len(used) {
		t.Fatalf("the batch's tasks are in shards %v, it waited for positions %v (shards %v)", used, views.at, waited)
	}
}
