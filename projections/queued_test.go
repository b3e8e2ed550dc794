package projections_test

import (
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

// queue schedules and publishes task id of customer on queue.
func (o *offline) queue(id, customer, queue string) {
	o.t.Helper()
	o.apply(id, customer, events.TaskScheduled{Spec: events.TaskSpec{RootID: id, Queue: queue, TimeoutSeconds: 60, RunAt: o.at}})
	o.apply(id, customer, events.DeliveryPending{DeliveryID: "d-" + id, Attempt: 1, NextAt: o.at})
	o.apply(id, customer, events.ReadyPublished{DeliveryID: "d-" + id, ReadySeq: uint64(o.seq)})
}

func ids(sts []aggregate.State) []string {
	out := make([]string, len(sts))
	for i, st := range sts {
		out[i] = st.TaskID
	}
	return out
}

// The republish queue lists a customer's queued tasks of one queue in
// publish order, signals a new one, moves a checked one by Postpone and
// is healed by Repair; the views count live tasks per customer and queue.
func TestEngineQueuedTasks(t *testing.T) {
	t.Parallel()
	o := newOffline(t)
	none := func(string) bool { return false }
	sig := o.e.QueuedSignal("acme", "q")
	o.queue("a1", "acme", "q")
	select {
	case <-sig:
	default:
		t.Fatal("QueuedSignal not closed by acme's queued task")
	}
	other := o.e.QueuedSignal("acme", "q")
	o.queue("a2", "acme", "q")
	o.queue("b1", "beta", "q")
	o.queue("a3", "acme", "r")
	if got := ids(o.e.Queued("acme", "q", 10, none)); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("Queued(acme, q) = %v, want [a1 a2]", got)
	}
	if got := ids(o.e.Queued("acme", "q", 10, func(id string) bool { return id == "a1" })); !slices.Equal(got, []string{"a2"}) {
		t.Fatalf("Queued skipping a1 = %v", got)
	}
	select {
	case <-other:
	default:
		t.Fatal("second QueuedSignal not closed by a2")
	}
	if live, n := o.e.CustomerQueue("acme", "q"); !live || n != 2 {
		t.Fatalf("CustomerQueue(acme, q) = %v %d, want true 2", live, n)
	}
	if !o.e.HasQueue("r") || o.e.HasQueue("s") {
		t.Fatal("HasQueue wrong")
	}

	// Checked a1: its next check moves after a2's.
	o.e.Postpone(projections.Republish, "a1", o.at.Add(time.Hour))
	if got := ids(o.e.Queued("acme", "q", 10, none)); !slices.Equal(got, []string{"a2", "a1"}) {
		t.Fatalf("Queued after Postpone = %v, want [a2 a1]", got)
	}
	// Claimed a2 leaves; the queue still exists, the live count drops
	// when it ends.
	o.apply("a2", "acme", events.Claimed{DeliveryID: "d-a2", ExecutorID: "w", Deadline: o.at.Add(time.Minute)})
	if got := ids(o.e.Queued("acme", "q", 10, none)); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("Queued after a claim = %v, want [a1]", got)
	}
	o.apply("a1", "acme", events.Canceled{})
	o.apply("a2", "acme", events.Canceled{})
	if live, n := o.e.CustomerQueue("acme", "q"); live || n != 1 {
		t.Fatalf("CustomerQueue(acme, q) after both ended = %v %d, want false 1 (r)", live, n)
	}
	if !o.e.HasQueue("q") {
		t.Fatal("a queue with finished tasks is still known")
	}

	// A queued task missing from the republish queue is put back.
	b1, _ := o.e.Task("b1")
	o.e.DropTimer(projections.Republish, "b1")
	if o.e.TimerLen(projections.Republish) != 1 || !o.e.Repair(b1) || o.e.Repair(b1) {
		t.Fatal("Repair did not put the queued task back exactly once")
	}
	if got := ids(o.e.Queued("beta", "q", 10, none)); !slices.Equal(got, []string{"b1"}) {
		t.Fatalf("Queued(beta, q) after Repair = %v", got)
	}
}
