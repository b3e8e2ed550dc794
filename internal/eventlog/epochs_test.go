package eventlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

// TestRemoveEpochAfterACrash removes an epoch whose removal stopped after
// one of its streams was deleted: Open creates that stream again from the
// recorded sequence, RemoveEpoch run again finishes, and the slot's next
// epoch starts after the removed one's positions.
func TestRemoveEpochAfterACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, ns := testnats.Conn(t), testnats.NewNamespace(t)
	cfg := store.Config{Stream: ns.Stream, Subjects: ns.Subjects, Shards: 2, EpochSlots: 2, EpochPeriod: time.Hour}
	st, err := store.Open(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { st.Close() }()
	for range 6 {
		schedule(t, st)
	}
	shards, js := st.Shards(), st.JetStream()
	e := st.Epochs()
	n0 := e.Slots[0].Epoch
	openEpoch(t, st, ns.Stream, 1, n0+1)
	if err := eventlog.RemoveEpoch(ctx, st.Log(), n0); !errors.Is(err, eventlog.ErrEpochNotSealed) {
		t.Fatalf("removing an open epoch: %v", err)
	}
	if err := eventlog.SealSlot(ctx, js, ns.Stream, shards, 0, n0); err != nil {
		t.Fatal(err)
	}
	lasts := map[int]uint64{}
	for _, part := range shards.SlotParts(0) {
		s, err := js.Stream(ctx, shards.Stream(ns.Stream, part))
		if err != nil {
			t.Fatal(err)
		}
		lasts[part] = s.CachedInfo().State.LastSeq
	}
	// The crash: the sequences recorded, one stream deleted, nothing more.
	if _, err := eventlog.UpdateEpochs(ctx, js, ns.Stream, func(e *eventlog.Epochs) bool {
		e.Slots[0].NextSeqs = []uint64{lasts[shards.Part(0, 0)] + 1, lasts[shards.Part(0, 1)] + 1}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	gone := shards.Stream(ns.Stream, shards.Part(0, 0))
	if err := js.DeleteStream(ctx, gone); err != nil {
		t.Fatal(err)
	}
	// Meanwhile the log's last sequence still answers (GET /v1/stats).
	if _, err := st.LastSeq(ctx); err != nil {
		t.Fatalf("LastSeq while an epoch's stream is being replaced: %v", err)
	}
	st.Close()
	if st, err = store.Open(ctx, nc, cfg); err != nil {
		t.Fatalf("Open after a crash in a removal: %v", err)
	}
	if s, err := js.Stream(ctx, gone); err != nil || s.CachedInfo().Config.FirstSeq != lasts[shards.Part(0, 0)]+1 {
		t.Fatalf("Open made %s start at %d (%v), want %d", gone, s.CachedInfo().Config.FirstSeq, err, lasts[shards.Part(0, 0)]+1)
	}
	if err := eventlog.RemoveEpoch(ctx, st.Log(), n0); err != nil {
		t.Fatal(err)
	}
	e, ok, err := eventlog.ReadEpochs(ctx, js, ns.Stream)
	if err != nil || !ok || e.Slots[0].State != eventlog.SlotFree || len(e.Removed) != 1 {
		t.Fatalf("epochs after the removal: %+v %v", e, err)
	}
	for _, part := range shards.SlotParts(0) {
		s, err := js.Stream(ctx, shards.Stream(ns.Stream, part))
		if err != nil || s.CachedInfo().Config.Sealed || s.CachedInfo().State.Msgs != 0 || s.CachedInfo().Config.FirstSeq != lasts[part]+1 {
			t.Fatalf("part %d after the removal: %+v %+v (%v)", part, s.CachedInfo().Config, s.CachedInfo().State, err)
		}
	}
	if err := eventlog.RemoveEpoch(ctx, st.Log(), n0); err == nil {
		t.Fatal("a removed epoch was removed again")
	}
	// The emptied streams' positions go on from the removed epoch's last,
	// so a snapshot taken before the removal is not ahead of the log.
	positions, err := st.Log().LastPositions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range shards.SlotParts(0) {
		if want := shards.Position(part, lasts[part]); lasts[part] > 0 && positions[part] != want {
			t.Fatalf("part %d's last position %d after the removal, want %d", part, positions[part], want)
		}
	}
}

// TestRemoveEpochRecordsHeads: before it deletes any stream, RemoveEpoch
// records with the next sequences the chain head at each of the slot's
// shards' last events (the zero Head for an empty one), which a removal
// finished later checks an archive against (archive.CheckRemoval).
func TestRemoveEpochRecordsHeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, ns := testnats.Conn(t), testnats.NewNamespace(t)
	st, err := store.Open(ctx, nc, store.Config{Stream: ns.Stream, Subjects: ns.Subjects, Shards: 3, EpochSlots: 2, EpochPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	schedule(t, st)
	shards, js := st.Shards(), st.JetStream()
	n0 := st.Epochs().Slots[0].Epoch
	openEpoch(t, st, ns.Stream, 1, n0+1)
	if err := eventlog.SealSlot(ctx, js, ns.Stream, shards, 0, n0); err != nil {
		t.Fatal(err)
	}
	var want []eventlog.Head
	empty := 0
	for _, part := range shards.SlotParts(0) {
		s, err := js.Stream(ctx, shards.Stream(ns.Stream, part))
		if err != nil {
			t.Fatal(err)
		}
		var head eventlog.Head
		if last := s.CachedInfo().State.LastSeq; last > 0 {
			if head, err = st.Log().HeadAt(ctx, shards.Position(part, last)); err != nil || head.Pos == 0 {
				t.Fatalf("head of part %d: %+v %v", part, head, err)
			}
		} else {
			empty++
		}
		want = append(want, head)
	}
	if empty == 0 || empty == len(want) {
		t.Fatalf("%d of %d parts empty: want both kinds", empty, len(want))
	}
	kv, err := js.KeyValue(ctx, eventlog.MetaBucket(ns.Stream))
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "epochs", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := eventlog.RemoveEpoch(ctx, st.Log(), n0); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case entry := <-w.Updates():
			var e eventlog.Epochs
			if err := json.Unmarshal(entry.Value(), &e); err != nil {
				t.Fatal(err)
			}
			s := e.Slots[0]
			if s.State == eventlog.SlotFree {
				t.Fatalf("the slot was freed without heads recorded before: %+v", s)
			}
			if s.NextSeqs == nil {
				continue
			}
			if !reflect.DeepEqual(s.Heads, want) {
				t.Fatalf("recorded heads %+v, want %+v", s.Heads, want)
			}
			return
		case <-timeout:
			t.Fatal("no update of the epochs entry recorded the removal")
		}
	}
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
