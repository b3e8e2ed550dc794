package projections

import (
	"fmt"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// TestWaiterLeavingWakesTheAlarm: a keyed task that ends before its
// release (canceled) may have been counted against its key's room by the
// alarm (in flight, another process's, parked), so its end must wake the
// alarm for the next waiter: once canceled, the second waiter is what
// Next and Due give the alarm.
func TestWaiterLeavingWakesTheAlarm(t *testing.T) {
	t.Parallel()
	v := newViews(DefaultRetain, events.Shards{})
	e := &Views{v: v}
	now := at(10)
	var seq events.Position
	apply := func(s aggregate.State, cmd aggregate.Command) (aggregate.State, bool) {
		t.Helper()
		evs, err := aggregate.Decide(s, cmd, now)
		if err != nil || len(evs) != 1 {
			t.Fatalf("%T: %v", cmd, err)
		}
		seq++
		evs[0].Seq = seq
		return aggregate.Apply(s, evs[0]), v.apply(evs[0])
	}
	key := &events.Concurrency{Key: "k", Limit: 1}
	schedule := func(id string, runAt time.Time) aggregate.State {
		s, _ := apply(aggregate.State{}, aggregate.Schedule{TaskID: id, CustomerID: "c", Spec: events.TaskSpec{
			RootID: id, Queue: "q", TimeoutSeconds: 60, RunAt: runAt, Concurrency: key}})
		return s
	}
	first, second := schedule("w1", at(1)), schedule("w2", at(2))
	inFlight := func(id string) bool { return id == first.TaskID }
	if got, ok := e.Next(Release, now, inFlight); ok {
		t.Fatalf("Next = %v with w1 counted against the key's only slot, want none", got)
	}
	if _, woke := apply(first, aggregate.Cancel{Reason: "test"}); !woke {
		t.Fatal("canceling a waiter did not wake the alarm")
	}
	if got, ok := e.Next(Release, now, inFlight); !ok || !got.Equal(second.DueAt()) {
		t.Fatalf("Next = %v %v, want w2's due time %v", got, ok, second.DueAt())
	}
	if due := e.Due(Release, now, 10, inFlight); len(due) != 1 || due[0].TaskID != second.TaskID {
		t.Fatalf("Due = %v, want w2", due)
	}
}

// BenchmarkNextFullKey: the alarm's wake-up with many waiters on a full
// key, due and not yet due, beside one other release. Next passes over
// the due waiters (Due does too) but not the future ones.
func BenchmarkNextFullKey(b *testing.B) {
	v := newViews(DefaultRetain, events.Shards{})
	e := &Views{v: v}
	now := at(0)
	var seq events.Position
	schedule := func(id, customer string, runAt time.Time, c *events.Concurrency) {
		evs, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: id, CustomerID: customer, Spec: events.TaskSpec{
			RootID: id, Queue: "q", TimeoutSeconds: 60, RunAt: runAt, Concurrency: c}}, now.Add(-time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		seq++
		evs[0].Seq = seq
		v.apply(evs[0])
	}
	key := &events.Concurrency{Key: "k", Limit: 1}
	const due, future = 1_000, 100_000
	for i := range due + future {
		schedule(fmt.Sprintf("w%06d", i), "c", now.Add(time.Duration(i-due)*time.Millisecond), key)
	}
	schedule("other", "d", now.Add(time.Hour), nil)
	holder := func(id string) bool { return id == "w000000" } // in flight: the key is full
	b.ResetTimer()
	for range b.N {
		if _, ok := e.Next(Release, now, holder); !ok {
			b.Fatal("no wake-up")
		}
	}
}
