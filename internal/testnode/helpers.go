package testnode

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

// OpenSharded opens a store on ns with k shards, closed when the test
// ends; the error is Open's, for tests of what Open refuses.
func OpenSharded(t testing.TB, nc *nats.Conn, ns testnats.Namespace, k int) (*store.Store, error) {
	t.Helper()
	st, err := store.Open(context.Background(), nc, store.Config{Stream: ns.Stream, Subjects: ns.Subjects, Shards: k})
	if err == nil {
		t.Cleanup(func() { st.Close() })
	}
	return st, err
}

// ScheduleRoot appends a new root task of customer acme on queue default
// to st's log and returns its id. It fails t if the store refuses it.
func ScheduleRoot(t testing.TB, st *store.Store) string {
	t.Helper()
	id := events.NewID()
	_, _, err := st.Execute(context.Background(), id, "", aggregate.Schedule{
		TaskID: id, CustomerID: "acme",
		Spec: events.TaskSpec{RootID: id, Queue: "default", TimeoutSeconds: 60},
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// History returns a task's events as the operator sees them through n's
// service. It fails t if the service refuses.
func History(t testing.TB, n *Node, id string) []events.Event {
	t.Helper()
	evs, err := n.Service.History(context.Background(), service.Operator, id)
	if err != nil {
		t.Fatalf("history %s: %v", id, err)
	}
	return evs
}

// Types returns the event types of evs in order.
func Types(evs []events.Event) []events.Type {
	out := make([]events.Type, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type()
	}
	return out
}

// MustSchedule schedules req as p through n's service and fails t unless
// it made a new task: scheduled (due later, or released and its
// notification being published, or handed to a claimer waiting in n), or
// already queued (published before Schedule answered).
func MustSchedule(t testing.TB, n *Node, p service.Principal, req service.ScheduleRequest) aggregate.State {
	t.Helper()
	st, created, err := n.Service.Schedule(context.Background(), p, req)
	if err != nil {
		t.Fatalf("schedule %+v as %q: %v", req, p.CustomerID, err)
	}
	if !created || !st.Exists() || st.Status != aggregate.StatusScheduled && st.Status != aggregate.StatusQueued {
		t.Fatalf("schedule %+v: created %v, state %+v; want a new scheduled or queued task", req, created, st)
	}
	return st
}

// Published waits until the ready notification of task id, which its
// TaskScheduled released, is published and recorded, and returns the
// task then: queued, with its ready sequence. Schedule's own publish is
// done within a moment; within is shorter than the alarm's grace
// (events.DefaultReadyGrace) where a test proves it was not the alarm's.
func Published(t testing.TB, n *Node, id string, within time.Duration) aggregate.State {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := n.Service.Get(context.Background(), service.Operator, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if st.Delivery.Published {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not published within %v: %s with delivery %+v", id, within, st.Status, st.Delivery)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Settled returns task, as a schedule over HTTP answered it, once its
// schedule's writes are all in: a task released at once answers
// scheduled with its delivery, and its ReadyPublished lands just after
// the answer; Settled polls c until the task is no longer scheduled
// (queued, or running when a claimer took it), for at most 10 s. Any
// other task comes back as it is.
func Settled(t testing.TB, c *api.Client, task api.Task) api.Task {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(10 * time.Second); task.Status == "scheduled" && task.Delivery != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("task %s released but not queued after 10 s", task.ID)
		}
		var err error
		if task, err = c.Get(ctx, task.ID); err != nil {
			t.Fatal(err)
		}
	}
	return task
}
