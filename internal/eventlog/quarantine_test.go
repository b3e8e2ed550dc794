package eventlog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// TestReadersQuarantine: a garbage message on a task's subject of a
// sharded log. Events and Follow hand it to their quarantine as an
// *events.CorruptError naming its position, subject and task, and go on
// to every later event of every shard; without a quarantine it ends the
// read with that error. The store's History of the task reads every
// event that decodes and fails with it.
func TestReadersQuarantine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testnats.NewNamespace(t)
	st, err := testnode.OpenSharded(t, testnats.Conn(t), ns, 2)
	if err != nil {
		t.Fatal(err)
	}
	var older []string // roots stored before the garbage
	for range 8 {
		older = append(older, schedule(t, st))
	}
	hurt := schedule(t, st)
	first, err := st.Load(ctx, hurt)
	if err != nil {
		t.Fatal(err)
	}
	shards := st.Shards()
	part := first.FirstSeq.Part(shards)
	subject := shards.Subjects(ns.Subjects, part).Event("acme", hurt)
	ack, err := st.JetStream().Publish(ctx, subject, []byte("\xc1 not an event"))
	if err != nil {
		t.Fatal(err)
	}
	garbage := shards.Position(part, ack.Sequence)
	later := map[string]bool{}
	for range 8 { // enough for both shards
		later[schedule(t, st)] = true
	}
	check := func(t *testing.T, c *events.CorruptError) {
		t.Helper()
		if c.Pos != garbage || c.Subject != subject || c.TaskID() != hurt || !errors.Is(c, events.ErrMalformed) || c.At.IsZero() {
			t.Fatalf("quarantined %+v (task %q), want position %d on %s", c, c.TaskID(), garbage, subject)
		}
	}

	t.Run("Events", func(t *testing.T) {
		var corrupt []*events.CorruptError
		seen := map[string]bool{}
		err := st.Log().Events(ctx, eventlog.ReadOptions{Quarantine: func(c *events.CorruptError) error {
			corrupt = append(corrupt, c)
			return nil
		}}, func(ev events.Event) error {
			seen[ev.TaskID] = true
			return nil
		})
		if err != nil || len(corrupt) != 1 {
			t.Fatalf("Events: %v, %d quarantined", err, len(corrupt))
		}
		check(t, corrupt[0])
		for id := range later {
			if !seen[id] {
				t.Fatalf("Events missed task %s, stored after the garbage", id)
			}
		}
		err = st.Log().Events(ctx, eventlog.ReadOptions{}, func(events.Event) error { return nil })
		if c, ok := errors.AsType[*events.CorruptError](err); !ok {
			t.Fatalf("Events without a quarantine: %v, want the CorruptError", err)
		} else {
			check(t, c)
		}
	})

	t.Run("Follow", func(t *testing.T) {
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var corrupt []*events.CorruptError
		left := len(later)
		err := st.Log().Follow(fctx, nil, nil, func(ev events.Event) error {
			if later[ev.TaskID] && ev.Number == 1 {
				if left--; left == 0 && len(corrupt) > 0 {
					cancel()
				}
			}
			return nil
		}, func(c *events.CorruptError) error {
			corrupt = append(corrupt, c)
			return nil
		})
		if !errors.Is(err, context.Canceled) || left != 0 || len(corrupt) != 1 {
			t.Fatalf("Follow: %v, %d later tasks not seen, %d quarantined", err, left, len(corrupt))
		}
		check(t, corrupt[0])
	})

	// A lineage's read from the log passes over another task's garbage of
	// the same customer (every lineage older than it would break) and
	// fails with a member's.
	t.Run("Lineage", func(t *testing.T) {
		crossed := 0
		for _, id := range older {
			root, err := st.Load(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if root.FirstSeq.Part(shards) != part {
				continue // its read does not cross the garbage
			}
			crossed++
			evs, err := st.Log().Lineage(ctx, root)
			if err != nil || len(evs) != 1 || evs[0].TaskID != id {
				t.Fatalf("Lineage of %s, older than the garbage of %s: %d events, %v; want its own one", id, hurt, len(evs), err)
			}
		}
		if crossed == 0 {
			t.Fatalf("no older root in part %d", part)
		}
		evs, err := st.Log().Lineage(ctx, first)
		if c, ok := errors.AsType[*events.CorruptError](err); !ok || c.Pos != garbage || len(evs) != 1 {
			t.Fatalf("Lineage of %s: %d events, %v; want the garbage's CorruptError", hurt, len(evs), err)
		}
	})

	t.Run("History", func(t *testing.T) {
		evs, err := st.History(ctx, hurt)
		c, ok := errors.AsType[*events.CorruptError](err)
		if !ok || len(evs) != 1 || evs[0].Type() != events.TypeTaskScheduled {
			t.Fatalf("History: %d events, %v; want the TaskScheduled and the CorruptError", len(evs), err)
		}
		if c.Pos != garbage || c.TaskID() != hurt {
			t.Fatalf("History's CorruptError %+v, want position %d", c, garbage)
		}
	})
}
