package projections

import (
	"time"

	"github.com/taskledger/taskledger/aggregate"
)

// The engine's writes that are not events of the log: the alarm and the
// service correct the views with what they found in the log or the ready
// stream. Each takes the views' write lock, as the fold does.

// Postpone moves task taskID's due time in timer queue t to due, if it
// is there. Republish items are postponed when their notification was
// found live: the next check is then due a window later, with nothing
// appended to the log. A rebuild or a restart puts the item back at its
// last publish, which costs one early check. The alarm postpones an
// Expire item whose heartbeat falls due before one interval has passed
// since its own start (a restart: renewals are not in the log).
func (e *Engine) Postpone(t Timer, taskID string, due time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.v.timers[t].postpone(taskID, due)
}

// Renew renews the heartbeat of task taskID's claim under deliveryID at
// now: its item in the Expire queue is due one heartbeat interval from
// now (never after the running deadline, never earlier than it was),
// with nothing appended to the log. It returns when the claim now
// expires, and whether it renewed: false when the views do not show the
// task running under deliveryID with heartbeats (the caller asks the
// log why). Renewals live only in the views (every process's: the node
// passes on the renewals other processes announce): a rebuild or a
// restart puts the item back at one interval after the claim, which the
// alarm stretches to one interval after its own start (see
// reactors.Alarm). It is safe for concurrent use.
func (e *Engine) Renew(taskID, deliveryID string, now time.Time) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.v.tasks[taskID]
	if t == nil {
		return time.Time{}, false
	}
	s := e.v.state(t)
	q := e.v.timers[Expire]
	if s.Status != aggregate.StatusRunning || s.Claim.DeliveryID != deliveryID || s.Claim.HeartbeatSeconds <= 0 || !q.has(taskID) {
		return time.Time{}, false
	}
	due := now.Add(time.Duration(s.Claim.HeartbeatSeconds) * time.Second)
	if due.After(s.Deadline) {
		due = s.Deadline
	}
	if due.UnixNano() > q.dueOf(taskID) {
		q.postpone(taskID, due)
	}
	return time.Unix(0, q.dueOf(taskID)), true
}

// Repair makes sure a task that s (freshly loaded from the log) says is
// waiting on a timer is in that timer queue, and reports whether it had to
// put it back. It is the self-healing step: a projection that lost a
// release or a pending delivery gets it from the aggregate.
func (e *Engine) Repair(s aggregate.State) bool {
	tm, due, ok := timerOf(&s)
	if !ok {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.v.tasks[s.TaskID]
	if t == nil || int(t.version) > s.Version || e.v.timers[tm].has(s.TaskID) {
		return false
	}
	e.v.timers[tm].set(s.TaskID, bucketOf(tm, &s), due)
	select {
	case e.kick <- struct{}{}:
	default:
	}
	return true
}

// SettleRun tells the projections that the task of the schedule's last
// run exists (the service found it in the log), for a run whose task's
// creation the views did not see: one created before it fired, then
// evicted.
func (e *Engine) SettleRun(customerID, scheduleID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.v.settleRun(ScheduleKey(customerID, scheduleID), e.v.timers[Fire])
}
