package replay_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/replay"
)

// fakeRuns is a RunReader over revisions held in memory; a revision
// absent from it cannot be read.
type fakeRuns map[uint64][]byte

func (f fakeRuns) Revisions(_ context.Context, _ string, after, upto uint64, fn func(uint64, []byte) error) error {
	for rev := after + 1; rev <= upto; rev++ {
		doc, ok := f[rev]
		if !ok {
			return errors.New("gone")
		}
		if err := fn(rev, doc); err != nil {
			return err
		}
	}
	return nil
}

// TestVerifyRuns checks every Run revision a log records against the
// bytes a store holds: the same bytes verify clean, altered ones are a
// run_mismatch at their RunSaved, a lost one a run_unreadable.
func TestVerifyRuns(t *testing.T) {
	t.Parallel()
	docs := fakeRuns{1: []byte(`{"turn":1}`), 2: []byte(`{"turn":2}`), 3: []byte(`{"turn":3}`)}
	digest := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	// verify builds a log of one task that saves docs' three revisions
	// and verifies it against store; it returns the violations and the
	// position of each revision's RunSaved.
	verify := func(t *testing.T, store fakeRuns) ([]replay.Violation, map[uint64]events.Position) {
		t.Helper()
		v := replay.NewVerifier(events.DefaultSubjects)
		id, delivery := events.NewID(), events.NewID()
		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		var st aggregate.State
		saved := map[uint64]events.Position{}
		var seq events.Position
		for _, cmd := range []aggregate.Command{
			aggregate.Schedule{TaskID: id, CustomerID: "acme", Spec: events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 60}},
			aggregate.ReleaseDue{DeliveryID: delivery},
			aggregate.MarkReadyPublished{DeliveryID: delivery, ReadySeq: 1},
			aggregate.Claim{DeliveryID: delivery, ExecutorID: "w1"},
			aggregate.SaveRun{DeliveryID: delivery, Revision: 1, Digest: digest(docs[1]), Size: len(docs[1])},
			aggregate.SaveRun{DeliveryID: delivery, Revision: 2, Digest: digest(docs[2]), Size: len(docs[2])},
			aggregate.SaveRun{DeliveryID: delivery, Revision: 3, Digest: digest(docs[3]), Size: len(docs[3])},
		} {
			now = now.Add(time.Second)
			evs, err := aggregate.Decide(st, cmd, now)
			if err != nil {
				t.Fatalf("%T: %v", cmd, err)
			}
			ev := evs[0]
			ev.ID, ev.Prev = events.NewID(), st.LastHash
			b, err := events.Encode(ev)
			if err != nil {
				t.Fatal(err)
			}
			seq++
			v.Add(seq, events.DefaultSubjects.Event(ev.CustomerID, ev.TaskID), b)
			ev.Seq, ev.Hash = seq, events.HashOf(b)
			st = aggregate.Apply(st, ev)
			if p, ok := ev.Data.(events.RunSaved); ok {
				saved[p.Revision] = seq
			}
		}
		if err := v.VerifyRuns(context.Background(), store); err != nil {
			t.Fatal(err)
		}
		return v.Report().Violations, saved
	}

	t.Run("Clean", func(t *testing.T) {
		if got, _ := verify(t, docs); len(got) != 0 {
			t.Fatalf("violations %+v", got)
		}
	})
	t.Run("Altered", func(t *testing.T) {
		altered := fakeRuns{1: docs[1], 2: []byte(`{"turn":9}`), 3: docs[3]}
		got, saved := verify(t, altered)
		if len(got) != 1 || got[0].Kind != replay.RunMismatch || got[0].Seq != saved[2] {
			t.Fatalf("violations %+v, want one run_mismatch at %d", got, saved[2])
		}
	})
	t.Run("Lost", func(t *testing.T) {
		lost := fakeRuns{1: docs[1], 3: docs[3]}
		got, saved := verify(t, lost)
		if len(got) != 1 || got[0].Kind != replay.RunUnreadable || got[0].Seq != saved[2] {
			t.Fatalf("violations %+v, want one run_unreadable at %d", got, saved[2])
		}
	})
}
