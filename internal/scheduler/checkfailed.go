package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Failed stop checks are recorded on their task (a CheckFailed event), so
// an auditor sees that cancellation could not be verified then. The
// aggregate allows one record a minute per task (CheckFailedInterval); the
// failures in between are counted into the next. When the log itself is
// what failed, the record waits: it is appended at the task's next check
// that succeeds (the log answers again); failed checks try it again only
// checkFailedRetry after the log refused it.
const (
	// maxPendingCheckFailures bounds the tasks whose failed checks wait
	// to be recorded; past it a failure is only logged and counted.
	maxPendingCheckFailures = 10_000
	// checkFailedRetry is how long a record the log refused waits before
	// a failed check tries it again.
	checkFailedRetry = 10 * time.Second
	// checkFailedTimeout bounds the append a check makes of a record, so
	// a check of a task whose log is slow still answers promptly.
	checkFailedTimeout = 2 * time.Second
)

// checkFailures holds, per task, the failed checks not yet in its log.
// Its methods are safe for concurrent use.
type checkFailures struct {
	mu      sync.Mutex
	pending map[string]*checkFailure
}

// checkFailure is one task's failed checks waiting for a record.
type checkFailure struct {
	since     time.Time // the first of them
	failures  int
	err       string    // the last one's error
	notBefore time.Time // no record before: the aggregate's interval after the last
	retryAt   time.Time // a failed check tries no record before: the log refused the last
	busy      bool      // a check is appending the record
}

// add counts a failed check of task id at now; false when the table is
// full and the failure is not kept.
func (c *checkFailures) add(id string, now time.Time, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.pending[id]
	if !ok {
		if len(c.pending) >= maxPendingCheckFailures {
			return false
		}
		if c.pending == nil {
			c.pending = make(map[string]*checkFailure)
		}
		f = &checkFailure{since: now}
		c.pending[id] = f
	}
	f.failures++
	f.err = events.Truncate(err.Error(), events.MaxErrorBytes)
	return true
}

// take returns the failures of task id to record now, and marks them
// being recorded; false when there are none, another check records them,
// or their record is not due. logUp says the caller just read the log.
func (c *checkFailures) take(id string, now time.Time, logUp bool) (checkFailure, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.pending[id]
	if !ok || f.busy || now.Before(f.notBefore) || !logUp && now.Before(f.retryAt) {
		return checkFailure{}, false
	}
	f.busy = true
	return *f, true
}

// done settles a record of taken, whose append answered st, evs and err.
func (c *checkFailures) done(id string, taken checkFailure, st aggregate.State, evs []events.Event, err error, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.pending[id]
	f.busy = false
	switch {
	case err == nil && len(evs) > 0: // recorded; failures since the take wait for the next
		if f.failures -= taken.failures; f.failures <= 0 {
			delete(c.pending, id)
			return
		}
		f.since, f.notBefore = now, evs[0].At.Add(aggregate.CheckFailedInterval)
	case err == nil: // the last record is less than the interval old
		f.notBefore = st.CheckFailedAt.Add(aggregate.CheckFailedInterval)
	case errors.Is(err, aggregate.ErrTerminal), errors.Is(err, aggregate.ErrNotFound), errors.Is(err, aggregate.ErrInvalid):
		delete(c.pending, id) // nothing left to verify, or nothing to record
	default: // the log: try again at a later check
		f.retryAt = now.Add(checkFailedRetry)
	}
}

// noteCheckFailed counts a failed stop check of task id and records the
// task's failed checks if that is due.
func (s *tasks) noteCheckFailed(ctx context.Context, id string, err error) {
	if !s.failures.add(id, s.store.Now(), err) {
		s.logger.Warn().Str("task", id).Msg("failed stop check not recorded on the task: too many tasks wait for a record")
		return
	}
	s.recordCheckFailed(ctx, id, false)
}

// recordCheckFailed appends the failed checks task id holds pending as a
// CheckFailed, when they are due: at most one a minute, and, unless logUp
// (the caller's check just read the log), checkFailedRetry after the log
// refused the last try.
func (s *tasks) recordCheckFailed(ctx context.Context, id string, logUp bool) {
	f, ok := s.failures.take(id, s.store.Now(), logUp)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkFailedTimeout)
	defer cancel()
	st, evs, err := s.store.Execute(ctx, id, "", aggregate.RecordCheckFailed{Since: f.since, Failures: f.failures, Error: f.err})
	if err != nil && !errors.Is(err, aggregate.ErrTerminal) {
		s.logger.Warn().Err(err).Str("task", id).Int("failures", f.failures).Msg("failed stop checks not recorded on the task yet; a later check tries again")
	}
	s.failures.done(id, f, st, evs, err, s.store.Now())
}
