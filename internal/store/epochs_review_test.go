package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

// TestRemovedTwicePositionsNeverRepeat reuses a slot whose first epoch was
// removed for an epoch no lineage started in, removes that one too (as a
// node removes an empty epoch at once), and opens a third: its streams
// must start after the first epoch's last sequence, or its tasks take the
// first epoch's positions again.
func TestRemovedTwicePositionsNeverRepeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, ns := twoSlots(t)
	js, shards := st.JetStream(), st.Shards()
	first := schedule(t, st)
	old, err := st.Load(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		schedule(t, st)
	}
	n0 := st.Epochs().Slots[0].Epoch
	// advance moves the current epoch to slot to with epoch n.
	advance := func(to int, n int64) { openEpoch(t, st, ns.Stream, to, n) }
	remove := func(slot int, n int64) {
		t.Helper()
		if err := eventlog.SealSlot(ctx, js, ns.Stream, shards, slot, n); err != nil {
			t.Fatal(err)
		}
		if err := eventlog.RemoveEpoch(ctx, st.Log(), n); err != nil {
			t.Fatal(err)
		}
	}
	advance(1, n0+1)
	remove(0, n0) // four events: slot 0's stream now starts at 5
	advance(0, n0+2)
	advance(1, n0+3) // epoch n0+2 in slot 0 took no lineage
	remove(0, n0+2)
	advance(0, n0+4)
	again := schedule(t, st)
	now, err := st.Load(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	if now.FirstSeq <= old.FirstSeq+events.Position(3*shards.N()) {
		t.Fatalf("a task of the third epoch of slot 0 is at position %d, the first epoch's were %d to %d", now.FirstSeq, old.FirstSeq, old.FirstSeq+events.Position(3*shards.N()))
	}
}

// TestRepeatedRequestSeenByAStaleProcess creates a task through one
// process right after it advanced the epoch, and the same request again
// through another process that has not re-read the epochs yet: the second
// must answer the task the first created, not create it again in the
// older slot.
func TestRepeatedRequestSeenByAStaleProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, ns := testnats.Conn(t), testnats.NewNamespace(t)
	cfg := store.Config{Stream: ns.Stream, Subjects: ns.Subjects, Shards: 2, EpochSlots: 3, EpochPeriod: time.Hour}
	a, err := store.Open(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := store.Open(ctx, testnats.Conn(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n0 := a.Epochs().Slots[0].Epoch
	openEpoch(t, a, ns.Stream, 1, n0+1)
	id := events.NewID()
	cmd := aggregate.Schedule{TaskID: id, CustomerID: "acme", Spec: events.TaskSpec{RootID: id, Queue: "default", TimeoutSeconds: 60}}
	if _, _, err := a.Execute(ctx, id, "", cmd); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Execute(ctx, id, "", cmd); !errors.Is(err, aggregate.ErrExists) {
		t.Fatalf("the repeated request through the other process: %v, want %v", err, aggregate.ErrExists)
	}
	n := 0
	for _, part := range a.Shards().SlotParts(0) {
		s, err := a.JetStream().Stream(ctx, a.Shards().Stream(ns.Stream, part))
		if err != nil {
			t.Fatal(err)
		}
		n += int(s.CachedInfo().State.Msgs)
	}
	if n != 0 {
		t.Fatalf("the repeated request created task %s again in the older epoch's slot (%d events there)", id, n)
	}
}

// TestStaleSealLeavesANewEpochAlone: a node decided to seal slot 0 from
// epochs it read before another node sealed it, removed it (empty) and
// the slot took the current epoch. Its seal must not seal the current
// epoch's new streams, or no new lineage can be created.
func TestStaleSealLeavesANewEpochAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, ns := twoSlots(t)
	js, shards := st.JetStream(), st.Shards()
	n0 := st.Epochs().Slots[0].Epoch
	open := func(slot int, n int64) { openEpoch(t, st, ns.Stream, slot, n) }
	open(1, n0+1)
	if err := eventlog.SealSlot(ctx, js, ns.Stream, shards, 0, n0); err != nil {
		t.Fatal(err)
	}
	if err := eventlog.RemoveEpoch(ctx, st.Log(), n0); err != nil {
		t.Fatal(err)
	}
	open(0, n0+2)
	// The other node, which read slot 0 as epoch n0, open, seals it now.
	if err := eventlog.SealSlot(ctx, js, ns.Stream, shards, 0, n0); err != nil {
		t.Logf("the stale seal: %v", err)
	}
	schedule(t, st)
}

// twoSlots opens a store on a new log with two epoch slots, closed when
// the test ends.
func twoSlots(t *testing.T) (*store.Store, testnats.Namespace) {
	t.Helper()
	ns := testnats.NewNamespace(t)
	st, err := store.Open(context.Background(), testnats.Conn(t), store.Config{Stream: ns.Stream, Subjects: ns.Subjects, EpochSlots: 2, EpochPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, ns
}

// openEpoch opens epoch n in slot of st's log (whose stream is stream)
// and makes it current, as a node's advance does, and has st read the
// epochs again.
func openEpoch(t *testing.T, st *store.Store, stream string, slot int, n int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := eventlog.UpdateEpochs(ctx, st.JetStream(), stream, func(e *eventlog.Epochs) bool {
		e.Current, e.Slots[slot] = slot, eventlog.Slot{Epoch: n, State: eventlog.SlotOpen}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.RefreshEpochs(ctx); err != nil {
		t.Fatal(err)
	}
}
