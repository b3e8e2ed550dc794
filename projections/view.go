package projections

import (
	"slices"
	"strings"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Timer names one of the timer queues.
type Timer int

// The timer queues: releases at runAt, pending deliveries, running
// deadlines, terminal children yet to report to their parent, and queued
// tasks by their last publish.
const (
	// Release holds scheduled tasks not yet released, due at runAt.
	Release Timer = iota
	// Deliver holds released tasks whose ready notification is not yet
	// published, due at the next attempt.
	Deliver
	// Expire holds running tasks, due at their deadline or, for a claim
	// with heartbeats, at its heartbeat due time if that is earlier: one
	// interval after the claim as the log knows it, moved later by each
	// renewal (Renew) without an event.
	Expire
	// Report holds terminal child tasks whose result is not yet in their
	// live parent's mailbox, due when the child finished.
	Report
	// Republish holds queued tasks, due when their ready notification was
	// last published: the alarm checks a notification that has waited
	// longer than its republish window and publishes it again if it is
	// gone.
	Republish
	// Free holds tasks that hold a slot of their concurrency key and are
	// terminal, due when they finished: the alarm releases the slot.
	Free
	// Fire holds live schedules (keyed by ScheduleKey), due at their next
	// instant, or at once while the task of their last run is not in the
	// log (a crash between the fire and the task): see schedules.go.
	Fire
	// NumTimers is the number of timer queues.
	NumTimers
)

func (t Timer) String() string {
	return [...]string{"release", "deliver", "expire", "report", "republish", "free", "fire"}[t]
}

// timerOf says which timer queue, if any, a task in state s belongs to
// and when it is due. It is the single definition of timer membership.
func timerOf(s *aggregate.State) (Timer, time.Time, bool) {
	switch {
	case s.Status == aggregate.StatusScheduled && s.Delivery.ID == "":
		return Release, s.DueAt(), true
	case s.Status == aggregate.StatusScheduled && !s.Delivery.Published:
		return Deliver, s.Delivery.NextAt, true
	case s.Status == aggregate.StatusRunning:
		return Expire, s.ExpiresAt(), true
	case s.Status == aggregate.StatusQueued:
		return Republish, s.Delivery.NextAt, true
	}
	return 0, time.Time{}, false
}

// bucketOf is the key under which timer queue t keeps s, across which it
// takes turns: the customer, and for Republish the customer and the queue,
// so a customer's queued tasks on one queue can be listed in order.
func bucketOf(t Timer, s *aggregate.State) string {
	if t == Republish {
		return queueBucket(s.CustomerID, s.Spec.Queue)
	}
	return s.CustomerID
}

// queueBucket joins a customer and a queue with a byte no id contains.
func queueBucket(customerID, queue string) string { return customerID + "/" + queue }

// AdmissionWindow is how far back the usage view remembers admissions.
const AdmissionWindow = time.Minute

// views holds every projection. It is not safe for concurrent use: Views
// guards it with its lock.
type views struct {
	tasks  map[string]*task
	timers [NumTimers]*TimerQueue
	// byStatus holds the tasks of each status, by its index in statuses.
	byStatus [len(statuses)]statusSet
	// activeRoots counts each customer's non-terminal root tasks.
	activeRoots map[string]int
	// admissions holds, per customer, the creation times of recent root
	// tasks, for per-minute quotas.
	admissions map[string][]time.Time
	// queueCounts counts tasks per queue and status, for metrics. A
	// queue stays in it once a task was scheduled there.
	queueCounts map[string]map[aggregate.Status]int
	// liveQueues counts each customer's non-terminal tasks per queue, for
	// the bound on a customer's queues.
	liveQueues map[string]map[string]int
	// ids holds each customer's task ids in order, for listing by id
	// prefix.
	ids map[string]*idIndex
	keys
	schedules
	// stats are the counters of GET /v1/stats, per customer and queue.
	stats map[string]map[string]*queueCounters
	// labels indexes the labeled tasks' labels, for search.
	labels labelIndex
	// kinds indexes the tasks' kinds, for search.
	kinds kindIndex
	retention
	// quarantine records the messages of the log the fold skipped
	// because they do not decode.
	quarantine quarantine
}

// newViews returns empty views of a log of shards that keep retain tasks
// of finished lineages (retention).
func newViews(retain int, shards events.Shards) *views {
	v := &views{
		retention:   newRetention(retain, shards),
		tasks:       make(map[string]*task),
		activeRoots: make(map[string]int),
		admissions:  make(map[string][]time.Time),
		queueCounts: make(map[string]map[aggregate.Status]int),
		liveQueues:  make(map[string]map[string]int),
		ids:         make(map[string]*idIndex),
		keys:        newKeys(),
		schedules:   newSchedules(),
		stats:       make(map[string]map[string]*queueCounters),
		labels:      newLabelIndex(),
		kinds:       newKindIndex(),
	}
	for i := range v.timers {
		switch Timer(i) {
		case Release, Deliver, Expire, Republish: // timerOf's, of which a task is in one at a time
			v.timers[i] = newSlotQueue(v.slotOf)
		default:
			v.timers[i] = newTimerQueue()
		}
	}
	return v
}

// slotOf returns the timer slot of task id's record, nil if the views do
// not hold the task.
func (v *views) slotOf(id string) *timerSlot {
	if t := v.tasks[id]; t != nil {
		return &t.timer
	}
	return nil
}

// apply folds one event into every view and reports whether it put a task
// into a timer queue or moved its due time: what the alarm must wake for.
// Removals do not wake it, an item leaving a queue needing no action,
// except a keyed waiter's (rekey): the next waiter of its key may run.
func (v *views) apply(ev events.Event) (timersChanged bool) {
	if events.KeyEvent(ev.Type()) {
		v.seq = ev.Seq
		return v.applyKey(ev)
	}
	if events.IsSchedule(ev.Type()) {
		v.seq = ev.Seq
		return v.applySchedule(ev, v.timers[Fire], func(id string) bool { return v.tasks[id] != nil })
	}
	if v.recreated(ev) {
		v.forget(v.tasks[ev.TaskID])
	}
	if v.holds(ev) {
		// Folded in already, ahead of the tail (Engine.ApplyOwn), and
		// so in a snapshot taken before the tail got here.
		return false
	}
	if creates(ev) {
		v.runCreated(ev, v.timers[Fire])
	}
	t := v.tasks[ev.TaskID]
	if t == nil {
		if !creates(ev) {
			// A task evicted by retention (or, in a damaged log, one
			// never created): the log keeps its events, the views don't.
			return false
		}
		t = &task{}
		v.tasks[ev.TaskID] = t
	}
	v.seq = ev.Seq
	before := t.state()
	after := aggregate.Apply(before, ev)
	t.set(&after)
	if !before.Exists() && after.Exists() {
		v.created(t, &after, ev.At)
	}
	changed := v.reindex(t, &before, &after)
	v.rate(ev, &after)
	changed = v.relink(t, &before, &after) || changed
	changed = v.rekey(&before, &after) || changed
	v.evict()
	return changed
}

// recreated reports whether ev creates anew a task the views hold: with
// epochs, a request repeated after its task's epoch was removed makes a
// new task of the same id in a live slot (docs/DESIGN.md, "Epochs"), whose
// first event is not the held task's. A rebuild never sees the old one.
func (v *views) recreated(ev events.Event) bool {
	t := v.tasks[ev.TaskID]
	return v.shards.Slots > 0 && t != nil && creates(ev) && ev.Number == 1 && ev.Seq != 0 && ev.Seq != t.firstSeq
}

// forget drops the lineage of t, a task of a removed epoch, from every
// view, as retention would: the lineage ended before its epoch was
// sealed. One still open (a damaged log) is kept.
func (v *views) forget(t *task) {
	h := v.head(t)
	at := h.closedSeq()
	if at == 0 {
		return
	}
	v.account(at, -int(h.members))
	h.setClosedSeq(0)
	v.drop(h)
}

// holds reports whether ev's task record has folded in ev already (an
// event without a stream sequence is never held).
func (v *views) holds(ev events.Event) bool {
	t := v.tasks[ev.TaskID]
	return t != nil && ev.Seq != 0 && ev.Seq <= t.lastSeq
}

// ownable reports whether ev may be folded in ahead of the log's order
// (Engine.ApplyOwn): its task is at the event before it, or it is a root
// task's TaskScheduled of a task not there yet, and it is one of the
// events that change only their own task's views. Creating a child (the
// parent's children in creation order, a lineage reopened), ending a task
// (reports, lineages closing and retention) and mail (reports settling)
// depend on the order of other tasks' events, so they wait for the tail.
func (v *views) ownable(ev events.Event) bool {
	t := v.tasks[ev.TaskID]
	switch p := ev.Data.(type) {
	case events.TaskScheduled:
		return t == nil && ev.Number == 1 && p.Spec.ParentID == ""
	case events.DeliveryPending, events.DeliveryRetryScheduled, events.ReadyPublished, events.ReadyRepublished,
		events.Claimed, events.MailboxRead:
		return t != nil && int(t.version) == ev.Number-1 && !t.terminal()
	}
	return false
}

func creates(ev events.Event) bool {
	switch ev.Data.(type) {
	case events.TaskScheduled, events.AdmissionRejected:
		return true
	}
	return false
}

// relink keeps the Report queue: a child that became terminal waits there
// until its result is in the parent's mailbox or the parent is terminal.
func (v *views) relink(t *task, before, s *aggregate.State) bool {
	q := v.timers[Report]
	changed := false
	finished := s.Status.Terminal() && before.Exists() && !before.Status.Terminal()
	if finished {
		if p := v.tasks[s.Spec.ParentID]; s.Spec.ParentID != "" && p != nil && awaitsReport(p, s.TaskID) {
			q.set(s.TaskID, s.CustomerID, s.CompletedAt)
			changed = true
		} else {
			v.closeOne(t)
		}
	}
	if len(s.MailIDs) > len(before.MailIDs) {
		// Only the report on the child's own parent settles it: a message
		// with a look-alike id on another task must not drop the report.
		if child, ok := strings.CutPrefix(s.MailIDs[len(s.MailIDs)-1], "child-"); ok && q.has(child) &&
			v.tasks[child].parent == s.TaskID {
			v.reported(child)
		}
	}
	if finished {
		for _, c := range t.children() {
			v.reported(c)
		}
	}
	return changed
}

// reported takes a child off the Report queue (its result reached the
// parent's mailbox, or the parent finished), which closes it.
func (v *views) reported(childID string) {
	if q := v.timers[Report]; q.has(childID) {
		q.remove(childID)
		v.closeOne(v.tasks[childID])
	}
}

// awaitsReport reports whether parent p still waits for child's result in
// its mailbox: it is live and has not got it.
func awaitsReport(p *task, childID string) bool {
	return !p.terminal() && !slices.Contains(p.mail(), events.ChildResultID(childID))
}

func (v *views) created(t *task, s *aggregate.State, at time.Time) {
	if s.Spec.ParentID != "" {
		if p := v.tasks[s.Spec.ParentID]; p != nil {
			p.setLists(p.mail(), append(p.children(), s.TaskID))
		}
	}
	v.join(t)
	v.admit(s, at)
	v.labels.add(t.id, s.Spec.Labels)
	v.kinds.add(t.id, s.Spec.Kind)
	v.indexID(t)
}

// admit remembers an admitted root task's creation for per-minute quotas,
// keeping the customer's list sorted and no older than AdmissionWindow
// before its newest entry.
func (v *views) admit(s *aggregate.State, at time.Time) {
	if s.Spec.ParentID != "" || s.Rejected {
		return
	}
	recent := v.admissions[s.CustomerID]
	i, _ := slices.BinarySearchFunc(recent, at, func(a, b time.Time) int { return a.Compare(b) })
	recent = slices.Insert(recent, i, at)
	newest := recent[len(recent)-1]
	for len(recent) > 0 && newest.Sub(recent[0]) > AdmissionWindow {
		recent = recent[1:]
	}
	v.admissions[s.CustomerID] = recent
}

// reindex moves task t between the derived views as its state changes.
func (v *views) reindex(t *task, before, after *aggregate.State) bool {
	id, changed := after.TaskID, false
	bt, bdue, bok := timerOf(before)
	at, adue, aok := timerOf(after)
	if bok && (!aok || bt != at) {
		v.timers[bt].remove(id) // not a change the alarm must wake for
	}
	if aok && (!bok || bt != at || !bdue.Equal(adue)) {
		v.timers[at].set(id, bucketOf(at, after), adue)
		changed = true
	}
	if before.Status != after.Status {
		if before.Status != "" {
			v.byStatus[statusIndex(before.Status)].remove(t)
			qc := v.queueCounts[before.Spec.Queue]
			if qc[before.Status]--; qc[before.Status] == 0 {
				delete(qc, before.Status)
			}
		}
		v.byStatus[statusIndex(after.Status)].add(t)
		qc := v.queueCounts[after.Spec.Queue]
		if qc == nil {
			qc = make(map[aggregate.Status]int)
			v.queueCounts[after.Spec.Queue] = qc
		}
		qc[after.Status]++
	}
	v.count(before, after)
	wasLive, isLive := before.Exists() && !before.Status.Terminal(), !after.Status.Terminal()
	if wasLive != isLive {
		v.countLive(after.CustomerID, after.Spec.Queue, isLive)
	}
	if after.Spec.ParentID == "" {
		wasActive := before.Exists() && !before.Status.Terminal()
		isActive := !after.Status.Terminal()
		if wasActive != isActive {
			if isActive {
				v.activeRoots[after.CustomerID]++
			} else if v.activeRoots[after.CustomerID]--; v.activeRoots[after.CustomerID] == 0 {
				delete(v.activeRoots, after.CustomerID)
			}
		}
	}
	return changed
}

// countLive counts a task of customer in queue in or out of liveQueues.
func (v *views) countLive(customer, queue string, in bool) {
	qs := v.liveQueues[customer]
	if qs == nil {
		qs = make(map[string]int)
		v.liveQueues[customer] = qs
	}
	if in {
		qs[queue]++
		return
	}
	if qs[queue]--; qs[queue] <= 0 {
		delete(qs, queue)
		if len(qs) == 0 {
			delete(v.liveQueues, customer)
		}
	}
}

// statusSet holds the tasks of one status in no order; each task's
// statusAt is its index in the set, so adding and removing cost O(1) and
// no map entry.
type statusSet []*task

func (s *statusSet) add(t *task) {
	t.statusAt = int32(len(*s))
	*s = append(*s, t)
}

// remove takes t out of s if s holds it, giving back the set's array once
// it is a quarter full.
func (s *statusSet) remove(t *task) {
	set, i := *s, int(t.statusAt)
	if i >= len(set) || set[i] != t {
		return
	}
	last := set[len(set)-1]
	set[i], last.statusAt = last, t.statusAt
	set[len(set)-1] = nil
	switch set = set[:len(set)-1]; {
	case len(set) == 0:
		set = nil
	case len(set) < cap(set)/4:
		set = slices.Clone(set)
	}
	*s = set
}

// statusIDs returns the sorted ids of each status's tasks, for digests
// and tests.
func (v *views) statusIDs() map[aggregate.Status][]string {
	out := make(map[aggregate.Status][]string)
	for i, set := range v.byStatus {
		if len(set) == 0 {
			continue
		}
		ids := make([]string, len(set))
		for j, t := range set {
			ids[j] = t.id
		}
		slices.Sort(ids)
		out[statuses[i]] = ids
	}
	return out
}
