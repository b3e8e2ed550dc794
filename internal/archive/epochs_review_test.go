package archive

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

// epochLog is a store of a log with two shards and two epoch slots.
type epochLog struct {
	st *store.Store
	ns testnats.Namespace
}

func openEpochLog(t *testing.T) epochLog {
	t.Helper()
	ns := testnats.NewNamespace(t)
	st, err := store.Open(context.Background(), testnats.Conn(t), store.Config{Stream: ns.Stream, Subjects: ns.Subjects, Shards: 2, EpochSlots: 2, EpochPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return epochLog{st: st, ns: ns}
}

// schedule creates a root in shard shard of the current slot.
func (l epochLog) schedule(t *testing.T, shard int) {
	t.Helper()
	for range 1000 {
		id := events.NewID()
		if l.st.Shards().Of("acme", id) != shard {
			continue
		}
		if _, _, err := l.st.Execute(context.Background(), id, "", aggregate.Schedule{
			TaskID: id, CustomerID: "acme", Spec: events.TaskSpec{RootID: id, Queue: "default", TimeoutSeconds: 60},
		}); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("no id in shard", shard)
}

// advance makes slot to current with epoch n, and seals slot from.
func (l epochLog) advance(t *testing.T, from, to int, n int64) {
	t.Helper()
	ctx := context.Background()
	sealing := l.st.Epochs().Slots[from].Epoch
	if _, err := eventlog.UpdateEpochs(ctx, l.st.JetStream(), l.ns.Stream, func(e *eventlog.Epochs) bool {
		e.Current, e.Slots[to] = to, eventlog.Slot{Epoch: n, State: eventlog.SlotOpen}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.st.RefreshEpochs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := eventlog.SealSlot(ctx, l.st.JetStream(), l.ns.Stream, l.st.Shards(), from, sealing); err != nil {
		t.Fatal(err)
	}
}

// TestArchiveReusedSlotWithAnEmptyPart archives and removes an epoch,
// lets its slot take a later epoch whose lineages all landed in one
// shard, and archives that one: the other shard's stream is empty but
// starts past 1 (its last sequence is the one before its first), which
// Write and CheckLive must take as an empty part.
func TestArchiveReusedSlotWithAnEmptyPart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := openEpochLog(t)
	l.schedule(t, 0)
	l.schedule(t, 1)
	n0 := l.st.Epochs().Slots[0].Epoch
	l.advance(t, 0, 1, n0+1)
	parts := l.st.Shards().SlotParts(0)
	dir := filepath.Join(t.TempDir(), "first")
	m, err := Write(ctx, l.st.Log(), Epoch{Name: strconv.FormatInt(n0, 10), Parts: parts}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckLive(ctx, l.st.Log(), m); err != nil {
		t.Fatal(err)
	}
	if err := eventlog.RemoveEpoch(ctx, l.st.Log(), n0); err != nil {
		t.Fatal(err)
	}
	l.advance(t, 1, 0, n0+2)
	l.schedule(t, 0)
	l.advance(t, 0, 1, n0+3)
	dir = filepath.Join(t.TempDir(), "third")
	if m, err = Write(ctx, l.st.Log(), Epoch{Name: strconv.FormatInt(n0+2, 10), Parts: parts}, dir, nil); err != nil {
		t.Fatalf("archive of a reused slot with an empty part: %v", err)
	}
	if _, err := Verify(dir); err != nil {
		t.Fatal(err)
	}
	if err := CheckLive(ctx, l.st.Log(), m); err != nil {
		t.Fatalf("CheckLive of a reused slot with an empty part: %v", err)
	}
}

// TestCheckLiveWantsTheWholeEpoch: an archive that holds only some of a
// live epoch's parts is not a complete archive of it; CheckLive, which
// epoch remove runs before deleting every stream of the epoch, must say
// so.
func TestCheckLiveWantsTheWholeEpoch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := openEpochLog(t)
	l.schedule(t, 0)
	l.schedule(t, 1)
	n0 := l.st.Epochs().Slots[0].Epoch
	l.advance(t, 0, 1, n0+1)
	name := strconv.FormatInt(n0, 10)
	parts := l.st.Shards().SlotParts(0)
	dir := filepath.Join(t.TempDir(), "half")
	m, err := Write(ctx, l.st.Log(), Epoch{Name: name, Parts: parts[:1]}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dir); err != nil {
		t.Fatal(err)
	}
	if err := CheckLive(ctx, l.st.Log(), m); !errors.Is(err, ErrLiveMismatch) {
		t.Fatalf("CheckLive of an archive of part %d of epoch %s, whose parts are %v: %v, want %v", parts[0], name, parts, err, ErrLiveMismatch)
	}
}
