package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// StreamFilter selects the events of Service.Stream
// (service.StreamFilter).
type StreamFilter = service.StreamFilter

// maxTracked bounds the tasks one stream remembers the state of (for the
// status after each event and the rootId and queue filters); past it one
// is forgotten, and read again from the log when it is seen again.
const maxTracked = 4096

// Cursor is where a stream stands (service.Cursor).
type Cursor = service.Cursor

// ParseCursor returns the cursor a resume token names: with one shard a
// whole number, the stream sequence of the last event seen; with K, K
// stream sequences joined by "-", shard 0's first, or "0", the start of
// every shard (docs/API.md, "Live event stream"). ok is false for a token
// of another form (CursorForm).
func (s *feed) ParseCursor(token string) (c Cursor, ok bool) {
	shards := s.store.Shards()
	if token == "0" {
		return make(Cursor, shards.N()), true
	}
	parts := strings.SplitN(token, "-", shards.N()+1) // a hostile token splits no further
	if len(parts) != shards.N() {
		return nil, false
	}
	c = make(Cursor, len(parts))
	for i, part := range parts {
		seq, err := strconv.ParseUint(part, 10, 64)
		// A sequence whose position (or the one after it) would not fit
		// in 64 bits is no stream's.
		if err != nil || seq >= math.MaxUint64/uint64(shards.N()) {
			return nil, false
		}
		c[i] = shards.Position(i, seq)
	}
	return c, true
}

// CursorForm says what a resume token is, for an error message.
func (s *feed) CursorForm() string {
	if k := s.store.Shards().N(); k > 1 {
		return fmt.Sprintf("0 or %d whole numbers ≥ 0 joined by \"-\" (each shard's stream sequence)", k)
	}
	return "a whole number ≥ 0 (a stream sequence)"
}

// CursorToken returns the resume token of c (ParseCursor's inverse).
func (s *feed) CursorToken(c Cursor) string {
	shards := s.store.Shards()
	parts := make([]string, shards.N())
	for i := range parts {
		var seq uint64
		if i < len(c) {
			seq = c[i].Seq(shards)
		}
		parts[i] = strconv.FormatUint(seq, 10)
	}
	return strings.Join(parts, "-")
}

// LiveCursor returns the cursor at the log's end now: a stream from it
// passes only events stored later.
func (s *feed) LiveCursor(ctx context.Context) (Cursor, error) {
	last, err := s.store.LastPositions(ctx)
	if err != nil {
		return nil, s.unavailable(err)
	}
	return last, nil
}

// Stream calls fn, in log order (with several shards, each shard's), for
// every event p may see that f selects stored after the cursor after,
// with its entry (with its task's status after it) and the cursor after
// it, and then for each such event stored later. A message on p's
// subjects that does not decode is passed to fn as a Quarantined marker
// (quarantinedEntry, whatever f's rootId, queue and type filters) with
// the cursor after it, logged and counted, and the stream goes on. It returns when ctx
// ends or the service closes (ctx.Err() or context.Canceled), or with
// fn's error. It reads with one ordered consumer a shard on p's subjects
// and remembers the state of at most maxTracked tasks, so it holds
// bounded memory. fn must not keep the cursor: it changes with the next
// event.
func (s *feed) Stream(ctx context.Context, p Principal, f StreamFilter, after Cursor, fn func(api.Event, Cursor) error) error {
	if err := f.Validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)()
	t := tracker{store: s.store, states: make(map[string]aggregate.State)}
	shards := s.store.Shards()
	at := make(Cursor, shards.N())
	copy(at, after)
	subjects := func(sub events.Subjects) []string { return streamSubjects(sub, p, f.TaskIDs) }
	err := s.store.Follow(ctx, subjects, at, func(ev events.Event) error {
		st, err := t.apply(ctx, ev)
		if err != nil {
			return err
		}
		at[ev.Seq.Part(shards)] = ev.Seq
		if !selects(f, ev, st) {
			return nil
		}
		return fn(streamEntry(ev, st), at)
	}, func(c *events.CorruptError) error {
		s.quarantined("event stream", c)
		at[c.Pos.Part(shards)] = c.Pos
		return fn(quarantinedEntry(c), at)
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// streamSubjects are the subjects among sub (a shard's) of the events p
// may see of taskIDs (none: of every task): tenancy is the subject
// filter.
func streamSubjects(sub events.Subjects, p Principal, taskIDs []string) []string {
	if len(taskIDs) == 0 {
		if p.IsOperator() {
			return nil
		}
		return []string{sub.Customer(p.CustomerID)}
	}
	out := make([]string, len(taskIDs))
	for i, id := range taskIDs {
		if p.IsOperator() {
			out[i] = sub.Task(id)
		} else {
			out[i] = sub.Event(p.CustomerID, id)
		}
	}
	return out
}

// selects reports whether ev, which left its task at st, passes f (its
// task ids are the subject filter's).
func selects(f StreamFilter, ev events.Event, st aggregate.State) bool {
	return (len(f.RootIDs) == 0 || slices.Contains(f.RootIDs, st.Spec.RootID)) &&
		(len(f.Queues) == 0 || slices.Contains(f.Queues, st.Spec.Queue)) &&
		(len(f.Types) == 0 || slices.Contains(f.Types, ev.Type()))
}

// tracker folds a stream's events into the states of their tasks; a task
// first seen after its first event is read from the log up to it.
type tracker struct {
	store  Store
	states map[string]aggregate.State
}

// apply returns ev's task's state after ev. A task whose history holds a
// quarantined message is folded from the events that decode.
func (t *tracker) apply(ctx context.Context, ev events.Event) (aggregate.State, error) {
	st, ok := t.states[ev.TaskID]
	if !ok && ev.Number > 1 {
		evs, err := t.store.History(ctx, ev.TaskID)
		if _, corrupt := errors.AsType[*events.CorruptError](err); corrupt {
			err = nil // History returned every event that decodes
		}
		if err != nil {
			return st, fmt.Errorf("%w: task %s: %v", ErrUnavailable, ev.TaskID, err)
		}
		for _, e := range evs {
			if e.Seq >= ev.Seq {
				break
			}
			st = aggregate.Apply(st, e)
		}
	}
	st = aggregate.Apply(st, ev)
	if st.Status.Terminal() {
		delete(t.states, ev.TaskID)
		return st, nil
	}
	if !ok && len(t.states) >= maxTracked {
		for id := range t.states {
			delete(t.states, id)
			break
		}
	}
	kept := st
	// What the status and filters need: not the message, result or
	// effects, which may be large.
	kept.Spec.Message, kept.Result, kept.Effects = events.Message{}, nil, nil
	t.states[ev.TaskID] = kept
	return st, nil
}

// LastSeq returns the log's last stream sequence.
func (s *feed) LastSeq(ctx context.Context) (uint64, error) {
	seq, err := s.store.LastSeq(ctx)
	if err != nil {
		return 0, s.unavailable(err)
	}
	return seq, nil
}
