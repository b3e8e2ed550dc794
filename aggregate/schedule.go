package aggregate

import (
	"fmt"
	"reflect"
	"time"

	"github.com/taskledger/taskledger/events"
)

// ScheduleState is a periodic schedule as its events describe it. The zero
// value is a schedule that does not exist. Like State it is a value.
type ScheduleState struct {
	ID         string
	CustomerID string
	Spec       events.ScheduleSpec
	Paused     bool
	Deleted    bool // its events stay in the log; it fires no more
	CreatedAt  time.Time
	UpdatedAt  time.Time // the last ScheduleUpdated; zero before one
	// Since is when the schedule last started counting instants: its
	// creation, update or resume. Only instants after it are due.
	Since time.Time
	// Last is the latest instant fired or passed over (a trigger is no
	// instant); zero before the first.
	Last time.Time
	// LastRun is the latest fire that made a run, a trigger included; its
	// TaskID is empty before the first.
	LastRun events.ScheduleFired
	Runs    int // fires that made a run

	Version  int
	FirstSeq events.Position // log position of the first event
	LastSeq  events.Position // log position of the last event applied
	LastHash events.Hash     `msgpack:",omitempty"`

	timing *Timing // parsed Spec; nil until needed (a restored snapshot)
}

// Exists reports whether any event has been applied.
func (s ScheduleState) Exists() bool { return s.Version > 0 }

// Live reports whether the schedule exists and is not deleted.
func (s ScheduleState) Live() bool { return s.Exists() && !s.Deleted }

// Timing returns the schedule's parsed timing; the zero Timing (no
// instants) for a spec that does not parse, which Decide never writes.
func (s ScheduleState) Timing() Timing {
	if s.timing != nil {
		return *s.timing
	}
	tm, _ := ParseTiming(s.Spec.Cron, s.Spec.Every, s.Spec.Timezone)
	return tm
}

// Next returns the next instant due, zero when the schedule is paused,
// deleted, gone or has no instant ahead.
func (s ScheduleState) Next() time.Time {
	if !s.Live() || s.Paused {
		return time.Time{}
	}
	return s.Timing().Next(s.from())
}

func (s ScheduleState) from() time.Time {
	if s.Last.After(s.Since) {
		return s.Last
	}
	return s.Since
}

// NextN returns up to n instants due from the next one on.
func (s ScheduleState) NextN(n int) []time.Time {
	var out []time.Time
	for t := s.Next(); !t.IsZero() && len(out) < n; t = s.Timing().Next(t) {
		out = append(out, t)
	}
	return out
}

// The schedule commands of DecideSchedule.
type (
	// CreateSchedule creates a schedule, or again one deleted. On a live
	// schedule it changes the spec (ScheduleUpdated), or is satisfied
	// when the spec is the same; Paused applies to a creation only.
	CreateSchedule struct {
		ID, CustomerID string
		Spec           events.ScheduleSpec
		Paused         bool
	}
	// PauseSchedule stops a live schedule firing.
	PauseSchedule struct{}
	// ResumeSchedule lets a paused schedule fire again from now.
	ResumeSchedule struct{}
	// DeleteSchedule stops a schedule for good.
	DeleteSchedule struct{}
	// FireSchedule fires the instant due (the alarm). PrevLive says
	// that the previous run's task is not terminal, as the caller read it.
	FireSchedule struct{ PrevLive bool }
	// TriggerSchedule makes a run now, paused or not, whatever the
	// overlap policy (POST /v1/schedules/{id}/trigger).
	TriggerSchedule struct{}
)

func (CreateSchedule) command()  {}
func (PauseSchedule) command()   {}
func (ResumeSchedule) command()  {}
func (DeleteSchedule) command()  {}
func (FireSchedule) command()    {}
func (TriggerSchedule) command() {}

// scanBound bounds the due instants FireSchedule counts after downtime;
// beyond it catch-up "all" fires as "one".
const scanBound = 100_000

// DecideSchedule returns the events cmd appends to the schedule in state s
// at time now, or an error wrapping ErrInvalid (a spec out of bounds),
// ErrNotFound (no live schedule; CreateSchedule aside) or ErrStale
// (FireSchedule on a schedule paused, deleted, or with nothing due). No
// events and no error mean the command is already satisfied.
func DecideSchedule(s ScheduleState, cmd Command, now time.Time) ([]events.Event, error) {
	if c, ok := cmd.(CreateSchedule); ok {
		if err := ValidateScheduleSpec(c.ID, c.CustomerID, c.Spec); err != nil {
			return nil, err
		}
		task, err := compactSpec(c.Spec.Task) // valid: checked just above
		if err != nil {
			return nil, err
		}
		c.Spec.Task = task
		var p events.Payload = events.ScheduleCreated{Spec: c.Spec, Paused: c.Paused}
		if s.Live() {
			if reflect.DeepEqual(s.Spec, c.Spec) {
				return nil, nil
			}
			p = events.ScheduleUpdated{Spec: c.Spec}
		}
		return []events.Event{{TaskID: c.ID, CustomerID: c.CustomerID, Number: s.Version + 1, At: now, Data: p}}, nil
	}
	if !s.Live() {
		if _, fire := cmd.(FireSchedule); fire {
			return nil, fmt.Errorf("%w: schedule is gone", ErrStale)
		}
		return nil, fmt.Errorf("%w: schedule", ErrNotFound)
	}
	var p events.Payload
	switch c := cmd.(type) {
	case PauseSchedule:
		if !s.Paused {
			p = events.SchedulePaused{}
		}
	case ResumeSchedule:
		if s.Paused {
			p = events.ScheduleResumed{}
		}
	case DeleteSchedule:
		p = events.ScheduleDeleted{}
	case TriggerSchedule:
		p = s.run(events.ScheduleFired{At: now, Manual: true})
	case FireSchedule:
		f, err := s.fire(now, c.PrevLive)
		if err != nil {
			return nil, err
		}
		p = f
	default:
		return nil, fmt.Errorf("%w: %T is not a schedule command", ErrInvalid, cmd)
	}
	if p == nil {
		return nil, nil
	}
	return []events.Event{{TaskID: s.ID, CustomerID: s.CustomerID, Number: s.Version + 1, At: now, Data: p}}, nil
}

// run names the task of fire f.
func (s ScheduleState) run(f events.ScheduleFired) events.ScheduleFired {
	f.RequestID = events.ScheduleRequestID(s.ID, f.At)
	f.TaskID = events.DeriveID("r", s.CustomerID, f.RequestID)
	return f
}

// fire decides which instant fires at now and how: on time; after
// downtime by the catch-up policy; or skipped for an overlap.
func (s ScheduleState) fire(now time.Time, prevLive bool) (events.ScheduleFired, error) {
	if s.Paused {
		return events.ScheduleFired{}, fmt.Errorf("%w: schedule is paused", ErrStale)
	}
	tm := s.Timing()
	var ring [events.MaxCatchup]time.Time // the last MaxCatchup due instants
	n := 0
	for t := tm.Next(s.from()); !t.IsZero() && !t.After(now) && n < scanBound; t = tm.Next(t) {
		ring[n%len(ring)] = t
		n++
	}
	if n == 0 {
		return events.ScheduleFired{}, fmt.Errorf("%w: no instant due", ErrStale)
	}
	latest := ring[(n-1)%len(ring)]
	complete := n < scanBound
	if !complete {
		latest = tm.latest(now, latest)
	}
	onTime := now.Sub(latest) <= events.CatchupGrace
	f := events.ScheduleFired{At: latest, Missed: n - 1}
	switch {
	case n == 1 && onTime:
	case s.Spec.Catchup == events.CatchupAll && complete:
		first := max(n-len(ring), 0) // fire the oldest of the last MaxCatchup
		f = events.ScheduleFired{At: ring[first%len(ring)], Missed: first}
	case s.Spec.Catchup == events.CatchupNone && !onTime:
		f.Skipped = "missed"
		return f, nil
	}
	if s.Spec.Overlap != events.OverlapAllow && prevLive {
		f.Skipped = "overlap"
		return f, nil
	}
	return s.run(f), nil
}

// latest returns the last instant at or before now, searching windows
// back from now that grow eightfold; from is one such instant.
func (tm Timing) latest(now, from time.Time) time.Time {
	for w := time.Hour; now.Add(-w).After(from); w *= 8 {
		last := time.Time{}
		for t := tm.Next(now.Add(-w)); !t.IsZero() && !t.After(now); t = tm.Next(t) {
			last = t
		}
		if !last.IsZero() {
			return last
		}
	}
	return from
}

// ValidateScheduleSpec checks a schedule: valid ids, a timing that parses
// (ParseTiming), known policies, and the task's fields within the limits
// of a task (queue id, timeout, message, repo, signal). Errors wrap
// ErrInvalid.
func ValidateScheduleSpec(id, customerID string, spec events.ScheduleSpec) error {
	for _, v := range []struct{ name, v string }{{"id", id}, {"customerId", customerID}, {"task.queue", spec.Task.Queue}} {
		if err := events.ValidID(v.v); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalid, v.name, err)
		}
	}
	if _, err := ParseTiming(spec.Cron, spec.Every, spec.Timezone); err != nil {
		return err
	}
	if spec.Overlap != events.OverlapSkip && spec.Overlap != events.OverlapAllow {
		return fmt.Errorf("%w: overlap must be %q or %q", ErrInvalid, events.OverlapSkip, events.OverlapAllow)
	}
	switch spec.Catchup {
	case events.CatchupOne, events.CatchupNone, events.CatchupAll:
	default:
		return fmt.Errorf("%w: catchup must be %q, %q or %q", ErrInvalid, events.CatchupOne, events.CatchupNone, events.CatchupAll)
	}
	t := spec.Task
	if t.RootID != "" || t.ParentID != "" || t.RequestID != "" || t.RelatedTaskID != "" || t.RetryOf != "" || !t.RunAt.IsZero() {
		return fmt.Errorf("%w: a schedule's task has no ids or runAt of its own", ErrInvalid)
	}
	return ValidateContent(t)
}

// ApplySchedule returns s with ev applied. It accepts any schedule event
// (the log is the truth) but an event before the schedule's creation, or
// after its deletion other than a new creation, changes nothing but
// Version and LastSeq; the verifier reports such events.
func ApplySchedule(s ScheduleState, ev events.Event) ScheduleState {
	wasLive := s.Live()
	s.Version++
	if s.Version == 1 {
		s.FirstSeq = ev.Seq
	}
	s.LastSeq, s.LastHash = ev.Seq, ev.Hash
	if p, ok := ev.Data.(events.ScheduleCreated); ok && !wasLive {
		s.ID, s.CustomerID, s.Spec, s.Paused, s.Deleted = ev.TaskID, ev.CustomerID, p.Spec, p.Paused, false
		s.CreatedAt, s.Since, s.timing = ev.At, ev.At, parsed(p.Spec)
		return s
	}
	if !wasLive {
		return s
	}
	switch p := ev.Data.(type) {
	case events.ScheduleUpdated:
		s.Spec, s.UpdatedAt, s.Since, s.timing = p.Spec, ev.At, ev.At, parsed(p.Spec)
	case events.SchedulePaused:
		s.Paused = true
	case events.ScheduleResumed:
		s.Paused, s.Since = false, ev.At
	case events.ScheduleDeleted:
		s.Deleted = true
	case events.ScheduleFired:
		if !p.Manual && p.At.After(s.Last) {
			s.Last = p.At
		}
		if p.TaskID != "" {
			s.LastRun = p
			s.Runs++
		}
	}
	return s
}

func parsed(spec events.ScheduleSpec) *Timing {
	tm, _ := ParseTiming(spec.Cron, spec.Every, spec.Timezone)
	return &tm
}

// ReplaySchedule folds a schedule's events, in log order.
func ReplaySchedule(evs []events.Event) ScheduleState {
	var s ScheduleState
	for _, ev := range evs {
		s = ApplySchedule(s, ev)
	}
	return s
}
