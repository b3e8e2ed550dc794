package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
)

// core is what every part of the service shares: the log, the
// projections' read-your-writes, how long a write waits for them, and the
// service's shutdown. Its methods are safe for concurrent use.
type core struct {
	store        Store
	applied      Applied
	now          func() time.Time // the clock (Config.Now)
	writeTimeout time.Duration
	// closing ends long polls and streams when the process shuts down.
	closing context.Context
}

// Applied is what every part of the service reads from the projections:
// whether they hold a write yet (read-your-writes) and who owns a task.
// Its methods are safe for concurrent use.
type Applied interface {
	// CaughtUp reports whether the views have applied everything the log
	// held when they started: before, a listing would miss tasks.
	CaughtUp() bool
	// WaitFor returns once the views have applied the event at seq, or
	// with ctx's error when ctx ends first.
	WaitFor(ctx context.Context, pos events.Position) error
	// ApplyOwn folds events just appended into the views where it may
	// ahead of their tail, and reports whether all of them are in.
	ApplyOwn(evs []events.Event) bool
	// Task returns a task as the views hold it; ok is false for one they
	// do not hold (not applied yet, or evicted by retention).
	Task(id string) (aggregate.State, bool)
}

// settle makes the projections show st, the task after the caller's
// write appended evs, so the caller's next read (a list, a tree) sees it:
// at once where the views may fold evs in themselves (Views.ApplyOwn),
// else once the projections' tail has applied st. With a non-nil later
// it does not wait for the tail: it raises *later to st.LastSeq and
// returns nil, and the caller (a batch) waits once, with waitApplied, for
// the highest sequence its items need.
func (s *core) settle(ctx context.Context, st aggregate.State, evs []events.Event, later *events.Position) error {
	if len(evs) > 0 && s.applied.ApplyOwn(evs) {
		return nil
	}
	if later != nil {
		*later = max(*later, st.LastSeq)
		return nil
	}
	return s.waitApplied(ctx, st.LastSeq)
}

// waitApplied waits, up to WriteTimeout, until the projections' tail has
// applied the event at seq; ErrUnavailable when it did not in time.
func (s *core) waitApplied(ctx context.Context, seq events.Position) error {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	if err := s.applied.WaitFor(ctx, seq); err != nil {
		return s.unavailable(err)
	}
	return nil
}

// isCorrupt reports whether err holds an *events.CorruptError: a message
// of the log that does not decode, which no retry gets past.
func isCorrupt(err error) bool {
	_, ok := errors.AsType[*events.CorruptError](err)
	return ok
}

// unavailable wraps the log's or the projections' failure to answer as
// ErrUnavailable, except a message of the log that cannot be read, which
// no retry would get past: that is ErrCorruptEvent, with its
// *events.CorruptError.
func (s *core) unavailable(err error) error {
	if corrupt, ok := errors.AsType[*events.CorruptError](err); ok {
		return fmt.Errorf("%w: %w", ErrCorruptEvent, corrupt)
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// fromStore maps the store's failure to reach the log to ErrUnavailable
// (the caller may retry); the aggregate's decisions pass through.
func (s *core) fromStore(err error) error {
	if errors.Is(err, store.ErrUnavailable) {
		return s.unavailable(err)
	}
	return err
}

// errCatchingUp is why a listing is refused while the views catch up.
var errCatchingUp = errors.New("the projections are catching up with the log after a start (GET /readyz says when they are done); a listing now would miss tasks")

// caughtUp fails with ErrUnavailable until the views have caught up with
// the log: the listings read only the views, so before that they would
// leave out what the views have not applied yet, without saying so.
func (s *core) caughtUp() error {
	if !s.applied.CaughtUp() {
		return s.unavailable(errCatchingUp)
	}
	return nil
}

// get returns a task as the log has it now (tasks.Get).
func (s *core) get(ctx context.Context, p Principal, id string) (aggregate.State, error) {
	if err := events.ValidID(id); err != nil {
		return aggregate.State{}, invalid("task id: %v", err)
	}
	st, err := s.store.Load(ctx, id)
	if err := s.visible(p, id, st, err); err != nil {
		return aggregate.State{}, err
	}
	return st, nil
}

// visible answers whether p may see task id, read from the log as st
// with err: a failure to read is ErrUnavailable; a task p may not see,
// or that does not exist, is ErrNotFound; then a message of the task
// that does not decode (the read replays those that do) is
// ErrCorruptEvent. The tenant check comes before the corrupt one, so
// another customer's quarantined task answers not found, as any of its
// tasks does; an operator sees every corrupt task, even one whose
// creation does not decode.
func (s *core) visible(p Principal, id string, st aggregate.State, err error) error {
	if err != nil && !isCorrupt(err) {
		return s.unavailable(err)
	}
	if !p.Sees(st) && (err == nil || !p.IsOperator()) {
		return fmt.Errorf("%w: %s", aggregate.ErrNotFound, id)
	}
	if err != nil {
		return s.unavailable(err)
	}
	return nil
}

// authorize fails with ErrNotFound unless p may see task id. A task's
// customer never changes, so the projections answer when they know the
// task; only a task they have not seen yet is read from the log.
func (s *core) authorize(ctx context.Context, p Principal, id string) error {
	if err := events.ValidID(id); err != nil {
		return invalid("task id: %v", err)
	}
	if p.IsOperator() {
		return nil // Execute answers ErrNotFound for a missing task
	}
	if st, ok := s.applied.Task(id); ok {
		if !p.Sees(st) {
			return fmt.Errorf("%w: %s", aggregate.ErrNotFound, id)
		}
		return nil
	}
	_, err := s.get(ctx, p, id)
	return err
}

// execute runs cmd on a task the principal may see, then settles it
// (settle, with later).
func (s *core) execute(ctx context.Context, p Principal, id, actor string, cmd aggregate.Command, later *events.Position) (aggregate.State, error) {
	if err := s.authorize(ctx, p, id); err != nil {
		return aggregate.State{}, err
	}
	st, evs, err := s.store.Execute(ctx, id, actor, cmd)
	if err != nil {
		return st, s.fromStore(err)
	}
	return st, s.settle(ctx, st, evs, later)
}
