package projections

// What the alarm acts on, and when: one rule (actionable) decides which
// items of a timer queue are handed out once due (Due, DueSchedules) and
// which the alarm wakes for (Next), so the two cannot drift apart. A due
// task waiting for a slot of a full concurrency key is neither handed out
// nor woken for: the event that frees a slot wakes the alarm
// (TimersChanged).

import (
	"time"

	"github.com/taskledger/taskledger/aggregate"
)

// Next returns the earliest due time in timer queue t of the items the
// alarm would act on: those actionable (skip does not report them and, in
// the Release queue, their concurrency key lets them run). The alarm arms
// its timer with it, so an item it would not act on — one in flight, or a
// due waiter on a full key — never holds back its wake-up for a later one
// it would. It is safe for concurrent use.
func (e *Engine) Next(t Timer, skip func(taskID string) bool) (time.Time, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	d, ok := e.v.timers[t].earliestExcept(e.v.actionable(t, skip))
	return time.Unix(0, d), ok
}

// Due returns up to limit tasks of timer queue t due at or before now
// that the alarm would act on (the items Next considers), taking turns
// across customers. It is safe for concurrent use.
func (e *Engine) Due(t Timer, now time.Time, limit int, skip func(taskID string) bool) []aggregate.State {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if t == Fire { // schedules, not tasks: DueSchedules
		return nil
	}
	keys := e.v.timers[t].due(now, limit, e.v.actionable(t, skip))
	out := make([]aggregate.State, len(keys))
	for i, k := range keys {
		if t == Free {
			out[i] = e.v.freeing[k]
			continue
		}
		out[i] = e.v.state(e.v.tasks[k])
	}
	return out
}

// actionable is the one rule of which items of timer queue t the alarm
// acts on once they are due: those skip does not report (the alarm's own
// items in flight, other processes' partitions) and, in the Release
// queue, only those their concurrency key lets run (releasable). Due,
// DueSchedules and Next all use it, so the alarm's wake-up and what it
// then acts on cannot disagree. Each call returns a fresh filter (the
// Release queue's counts the slots granted within one query).
func (v *views) actionable(t Timer, skip func(id string) bool) func(id string) bool {
	switch {
	case t == Release:
		return v.releasable(skip)
	case skip == nil:
		return func(string) bool { return false }
	}
	return skip
}

// releasable wraps the alarm's skip for the Release queue, whose items
// come in due order per customer: a task with a concurrency key is
// released only when it holds a slot for its attempt already (a release
// interrupted by a crash) or its key has room for it, counting the slots
// of the earlier due tasks of this call (dispatched, or being acquired in
// flight). So the first due take the free slots, and the rest wait
// without being counted against the alarm's batch; a retried task still
// holding its last attempt's slot waits for the Free queue to release
// it; tasks of other keys and without one pass.
func (v *views) releasable(skip func(taskID string) bool) func(taskID string) bool {
	granted := make(map[string]int)
	return func(id string) bool {
		skipped := skip != nil && skip(id)
		t := v.tasks[id]
		if t == nil {
			return skipped
		}
		kid, ok := keyOf(t.customer, t.conc)
		if !ok {
			return skipped
		}
		k := v.byKey[kid]
		held := granted[kid]
		if k != nil {
			switch attempt := k.HeldFor(id); {
			case attempt >= t.attemptNo():
				return skipped
			case attempt > 0:
				return true
			}
			held += len(k.Holders)
		}
		if held >= t.conc.Limit {
			return true
		}
		granted[kid]++
		return skipped
	}
}
