package projections

import (
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
)

// TestPassOwnedAfterSwap: an event the tail skipped as folded in, whose
// mark a rebuild's swap cleared before the Run loop got to it, is not
// passed over, nor is anything after it in the same batch: the loop reads
// them again for the fresh views.
func TestPassOwnedAfterSwap(t *testing.T) {
	t.Parallel()
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	created := func(id string, seq events.Position) events.Event {
		return events.Event{ID: "e-" + id, TaskID: id, CustomerID: "c", Number: 1, At: time.Unix(1_700_000_000, 0), Seq: seq,
			Data: events.TaskScheduled{Spec: events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 60}}}
	}
	if !e.ApplyOwn([]events.Event{created("a", 1)}) || !e.isOwned(1) {
		t.Fatal("a root's TaskScheduled was not folded in and marked")
	}
	e.ownMu.Lock()
	clear(e.owned) // what Rebuild's swap does
	e.ownMu.Unlock()
	owned := func(pos events.Position) tailMsg { return tailMsg{pos: pos, owned: true} }
	if e.applyTail([]tailMsg{owned(1), {pos: 2, ev: created("b", 2)}}) || e.Applied() != 0 {
		t.Fatalf("passed over an event the swapped-in views lack (applied %d)", e.Applied())
	}
	if _, ok := e.Task("b"); ok {
		t.Fatal("applied an event after the one the swapped-in views lack")
	}
	if !e.ApplyOwn([]events.Event{created("c", 1)}) || !e.isOwned(1) { // as the fresh views would
		t.Fatal("a root's TaskScheduled was not folded in and marked")
	}
	if !e.applyTail([]tailMsg{owned(1), {pos: 2, ev: created("b", 2)}}) || e.Applied() != 2 || e.isOwned(1) {
		t.Fatalf("a marked event and the one after it were not applied: applied %d", e.Applied())
	}
	if _, ok := e.Task("b"); !ok {
		t.Fatal("the event after a marked one was not applied")
	}
}
