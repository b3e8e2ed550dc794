package projections

import (
	"slices"
	"strings"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// ScheduleKey is the key of a customer's schedule in the Fire timer queue
// and the schedules view: customer and id joined by a byte no id holds.
func ScheduleKey(customerID, scheduleID string) string { return customerID + "/" + scheduleID }

// SplitScheduleKey is ScheduleKey's inverse.
func SplitScheduleKey(key string) (customerID, scheduleID string) {
	customerID, scheduleID, _ = strings.Cut(key, "/")
	return customerID, scheduleID
}

// Schedule is a schedule as the projections hold it: its state and its
// last events.ScheduleRunsShown fires (runs and skips), oldest first.
type Schedule struct {
	State aggregate.ScheduleState
	Runs  []events.ScheduleFired
}

// schedules is the schedules view: every schedule ever created (deleted
// ones too: their history is kept), and the runs whose task the log does
// not hold yet.
type schedules struct {
	scheds map[string]*schedule
	// waiting maps the task of a schedule's last run, until the task's
	// first event is applied, to the schedule's key.
	waiting map[string]string
	// live counts each customer's live schedules.
	live map[string]int
}

type schedule struct {
	state   aggregate.ScheduleState
	runs    []events.ScheduleFired
	pending string // the last run's task while the log does not hold it
}

func newSchedules() schedules {
	return schedules{scheds: make(map[string]*schedule), waiting: make(map[string]string), live: make(map[string]int)}
}

// applySchedule folds a schedule event and keeps the schedule's place in
// the Fire queue q; it reports whether the place was set (the alarm must
// wake). known says whether the views hold a task: a run whose task is
// there already waits for nothing.
func (v *schedules) applySchedule(ev events.Event, q *TimerQueue, known func(taskID string) bool) bool {
	key := ScheduleKey(ev.CustomerID, ev.TaskID)
	sc := v.scheds[key]
	if sc == nil {
		sc = &schedule{}
		v.scheds[key] = sc
	}
	wasLive := sc.state.Live()
	sc.state = aggregate.ApplySchedule(sc.state, ev)
	if f, ok := ev.Data.(events.ScheduleFired); ok && wasLive {
		sc.runs = append(sc.runs[max(len(sc.runs)-events.ScheduleRunsShown+1, 0):len(sc.runs):len(sc.runs)], f)
		if f.TaskID != "" {
			delete(v.waiting, sc.pending)
			sc.pending = ""
			if !known(f.TaskID) {
				sc.pending = f.TaskID
				v.waiting[f.TaskID] = key
			}
		}
	}
	if isLive := sc.state.Live(); isLive != wasLive {
		if isLive {
			v.live[ev.CustomerID]++
		} else if v.live[ev.CustomerID]--; v.live[ev.CustomerID] <= 0 {
			delete(v.live, ev.CustomerID)
		}
	}
	return v.place(key, sc, q)
}

// runCreated settles the run whose task ev creates.
func (v *schedules) runCreated(ev events.Event, q *TimerQueue) {
	if key, ok := v.waiting[ev.TaskID]; ok {
		v.settleRun(key, q)
	}
}

// settleRun marks the last run of the schedule key as having its task.
func (v *schedules) settleRun(key string, q *TimerQueue) {
	if sc := v.scheds[key]; sc != nil && sc.pending != "" {
		delete(v.waiting, sc.pending)
		sc.pending = ""
		v.place(key, sc, q)
	}
}

// place puts the schedule in the Fire queue at once while its last run
// waits for its task, else at its next instant, or takes it out.
func (v *schedules) place(key string, sc *schedule, q *TimerQueue) bool {
	due := sc.state.Next()
	if sc.pending != "" && sc.state.Exists() {
		due = sc.state.LastRun.At
	}
	if due.IsZero() {
		q.remove(key)
		return false
	}
	if q.has(key) && q.dueOf(key) == due.UnixNano() {
		return false
	}
	q.set(key, sc.state.CustomerID, due)
	return true
}

func (sc *schedule) view() Schedule {
	return Schedule{State: sc.state, Runs: slices.Clone(sc.runs)}
}

// scheduleRecord is a schedule in a snapshot.
type scheduleRecord struct {
	State   aggregate.ScheduleState `msgpack:"state"`
	Runs    []events.ScheduleFired  `msgpack:"runs"`
	Pending string                  `msgpack:"pending,omitempty"`
}

func (v *schedules) records() []scheduleRecord {
	out := make([]scheduleRecord, 0, len(v.scheds))
	for _, k := range sortedKeys(v.scheds) {
		sc := v.scheds[k]
		out = append(out, scheduleRecord{State: sc.state, Runs: slices.Clone(sc.runs), Pending: sc.pending})
	}
	return out
}

func (v *schedules) restoreSchedules(records []scheduleRecord, q *TimerQueue) {
	for _, r := range records {
		key := ScheduleKey(r.State.CustomerID, r.State.ID)
		sc := &schedule{state: r.State, runs: r.Runs, pending: r.Pending}
		v.scheds[key] = sc
		if sc.pending != "" {
			v.waiting[sc.pending] = key
		}
		if sc.state.Live() {
			v.live[sc.state.CustomerID]++
		}
		v.place(key, sc, q)
	}
}

// ScheduleDue is a schedule the alarm should fire: its key's parts, when
// it is due, and the log position of its last event the projections
// applied.
type ScheduleDue struct {
	CustomerID, ID string
	Due            time.Time
	Seq            events.Position
}

// DueSchedules returns up to limit schedules of the Fire queue due at or
// before now, skipping keys skip reports, taking turns across customers.
func (vw *Views) DueSchedules(now time.Time, limit int, skip func(key string) bool) []ScheduleDue {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	q := vw.v.timers[Fire]
	keys := q.due(now, limit, vw.v.actionable(Fire, now, skip))
	out := make([]ScheduleDue, len(keys))
	for i, k := range keys {
		sc := vw.v.scheds[k]
		out[i] = ScheduleDue{CustomerID: sc.state.CustomerID, ID: sc.state.ID, Due: time.Unix(0, q.dueOf(k)), Seq: sc.state.LastSeq}
	}
	return out
}

// Schedule returns a customer's schedule, deleted ones included.
func (vw *Views) Schedule(customerID, scheduleID string) (Schedule, bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	sc := vw.v.scheds[ScheduleKey(customerID, scheduleID)]
	if sc == nil || !sc.state.Exists() {
		return Schedule{}, false
	}
	return sc.view(), true
}

// Schedules returns up to limit schedules, by key (customer, then id)
// after the key after; of customerID only unless it is empty; deleted ones
// only when deleted is set.
func (vw *Views) Schedules(customerID, after string, limit int, deleted bool) []Schedule {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	var out []Schedule
	for _, k := range sortedKeys(vw.v.scheds) { // schedules are few per customer (a bound)
		sc := vw.v.scheds[k]
		if k <= after || customerID != "" && sc.state.CustomerID != customerID || !sc.state.Exists() || sc.state.Deleted && !deleted {
			continue
		}
		if out = append(out, sc.view()); len(out) == limit {
			break
		}
	}
	return out
}

// LiveSchedules counts a customer's live (not deleted) schedules.
func (vw *Views) LiveSchedules(customerID string) int {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	return vw.v.schedules.live[customerID]
}
