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

// Next returns when the alarm, at now, next has work in timer queue t:
// the earliest due time of the items Due would hand out once due (those
// skip does not report and, in the Release queue, those their concurrency
// key lets run). The alarm sleeps until then, so an item it would not act
// on — one in flight, a due waiter on a full key — never holds back its
// wake-up for a later one it would. A release due after now counts
// whatever its key: the key decides once it is due (a slot may free
// before), so Next never walks every future waiter of a full key; such a
// wake-up finds the waiter skipped and costs one round. It is safe for
// concurrent use.
func (vw *Views) Next(t Timer, now time.Time, skip func(taskID string) bool) (time.Time, bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	d, ok := vw.v.timers[t].earliestExcept(vw.v.actionable(t, now, skip))
	return time.Unix(0, d), ok
}

// Due returns up to limit tasks of timer queue t due at or before now
// that the alarm would act on (the items Next considers), taking turns
// across customers. It is safe for concurrent use.
func (vw *Views) Due(t Timer, now time.Time, limit int, skip func(taskID string) bool) []aggregate.State {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	if t == Fire { // schedules, not tasks: DueSchedules
		return nil
	}
	keys := vw.v.timers[t].due(now, limit, vw.v.actionable(t, now, skip))
	out := make([]aggregate.State, len(keys))
	for i, k := range keys {
		if t == Free {
			out[i] = vw.v.freeing[k]
			continue
		}
		out[i] = vw.v.state(vw.v.tasks[k])
	}
	return out
}

// actionable is the one rule of which items of timer queue t the alarm
// acts on once they are due at now: those skip does not report (the
// alarm's own items in flight, other processes' partitions) and, in the
// Release queue, of those due at now only the ones their concurrency key
// lets run (releasable). Due, DueSchedules and Next all use it, so the
// alarm's wake-up and what it then acts on cannot disagree. Each call
// returns a fresh filter (the Release queue's counts the slots granted
// within one query), to be asked about each item at most once, in due
// order within a customer (as TimerQueue's due and earliestExcept do).
func (v *views) actionable(t Timer, now time.Time, skip func(id string) bool) func(id string) bool {
	if skip == nil {
		skip = func(string) bool { return false }
	}
	if t != Release {
		return skip
	}
	q, n, rel := v.timers[Release], now.UnixNano(), v.releasable(skip)
	return func(id string) bool {
		if q.has(id) && q.dueOf(id) > n {
			return skip(id) // not due yet: its key decides when it is
		}
		return rel(id)
	}
}

// releasable wraps the alarm's skip for the Release queue, whose items
// come in due order per customer: a task with a concurrency key is
// released only when it holds a slot for its attempt already (a release
// interrupted by a crash) or its key has room for it, counting the slots
// of the earlier due tasks of this call (dispatched, or being acquired in
// flight). So the first due take the free slots, and the rest wait
// without being counted against the alarm's batch; a retried task still
// holding its last attempt's slot waits for the Free queue to release
// it; tasks of other keys and without one pass. Counting within one call
// holds because a key is one customer's (events.KeyID) and the Release
// queue takes a customer's items in due order (bucketOf): every query
// asks about a key's tasks in the same order.
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

// DueOf returns the due time of task taskID in timer queue t, and false
// if the queue does not hold it: the alarm asks again just before it
// acts, so a heartbeat renewed meanwhile (Renew) wins. It is safe for
// concurrent use.
func (vw *Views) DueOf(t Timer, taskID string) (time.Time, bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	q := vw.v.timers[t]
	if !q.has(taskID) {
		return time.Time{}, false
	}
	return time.Unix(0, q.dueOf(taskID)), true
}
