package projections

import (
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
)

// TestPassOwnedAfterSwap: an event the tail skipped as folded in, whose
// mark a rebuild's swap cleared before the Run loop got to it, is not
// passed over: the loop reads it again for the fresh views.
func TestPassOwnedAfterSwap(t *testing.T) {
	t.Parallel()
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	created := func(id string, seq uint64) events.Event {
		return events.Event{ID: "e-" + id, TaskID: id, CustomerID: "c", Number: 1, At: time.Unix(1_700_000_000, 0), Seq: seq,
			Data: events.TaskScheduled{Spec: events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 60}}}
	}
	if !e.ApplyOwn([]events.Event{created("a", 1)}) || !e.isOwned(1) {
		t.Fatal("a root's TaskScheduled was not folded in and marked")
	}
	e.ownMu.Lock()
	clear(e.owned) // what Rebuild's swap does
	e.ownMu.Unlock()
	if e.passOwned(1) || e.Applied() != 0 {
		t.Fatalf("passed over an event the swapped-in views lack (applied %d)", e.Applied())
	}
	if !e.ApplyOwn([]events.Event{created("b", 2)}) || !e.passOwned(2) || e.Applied() != 2 || e.isOwned(2) {
		t.Fatalf("a marked event was not passed over: applied %d", e.Applied())
	}
}
