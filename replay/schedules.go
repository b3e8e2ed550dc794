package replay

import (
	"fmt"
	"reflect"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// ScheduleStatus names where a schedule is: active, paused or deleted
// ("" before its creation).
func ScheduleStatus(s aggregate.ScheduleState) string {
	switch {
	case !s.Exists() || s.ID == "":
		return ""
	case s.Deleted:
		return "deleted"
	case s.Paused:
		return "paused"
	}
	return "active"
}

// describeSchedule says in a line what a schedule event means.
func describeSchedule(ev events.Event) string {
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	timing := func(s events.ScheduleSpec) string {
		w := "every " + s.Every
		if s.Cron != "" {
			w = fmt.Sprintf("cron %q in %s", s.Cron, s.Timezone)
		}
		w = fmt.Sprintf("%s, queue %s, overlap %s, catchup %s", w, s.Task.Queue, s.Overlap, s.Catchup)
		if l := labelText(s.Task.Labels); l != "" {
			w += ", labels " + l
		}
		return w
	}
	switch p := ev.Data.(type) {
	case events.ScheduleCreated:
		s := "schedule " + ev.TaskID + " created: " + timing(p.Spec)
		if p.Paused {
			s += " (paused)"
		}
		return s
	case events.ScheduleUpdated:
		return "schedule changed: " + timing(p.Spec)
	case events.SchedulePaused:
		return "paused"
	case events.ScheduleResumed:
		return "resumed"
	case events.ScheduleDeleted:
		return "deleted (history kept)"
	case events.ScheduleFired:
		var s string
		switch {
		case p.Manual:
			s = "triggered: task " + p.TaskID
		case p.Skipped == "overlap":
			s = "instant " + ts(p.At) + " skipped: the previous run is not finished"
		case p.Skipped != "":
			s = "instant " + ts(p.At) + " passed over (" + p.Skipped + ")"
		default:
			s = "fired instant " + ts(p.At) + ": task " + p.TaskID
		}
		if p.Missed > 0 {
			s += fmt.Sprintf("; %d missed instants before it passed over", p.Missed)
		}
		return s
	}
	return ""
}

// scheduleKey keys a schedule in the verifier's maps apart from tasks.
func scheduleKey(ev events.Event) string { return "schedule " + ev.CustomerID + "/" + ev.TaskID }

// addSchedule checks a schedule event: numbering, chain and that the
// schedule aggregate decides it, as Add does for a task's.
func (v *Verifier) addSchedule(ev events.Event) {
	key := scheduleKey(ev)
	st := v.schedules[key]
	if st == nil {
		st = &aggregate.ScheduleState{}
		v.schedules[key] = st
	}
	if prev := v.numbers[key]; ev.Number != prev+1 {
		v.fail(ev.Seq, ev.TaskID, Gap, "schedule event number %d after %d", ev.Number, prev)
	}
	v.numbers[key] = ev.Number
	if ev.Prev != st.LastHash {
		v.fail(ev.Seq, ev.TaskID, BrokenLink, "schedule event %d names previous hash %s, the previous event hashes to %s", ev.Number, short(ev.Prev), short(st.LastHash))
	}
	v.checkSchedule(*st, ev)
	*st = aggregate.ApplySchedule(*st, ev)
}

// checkSchedule reports why ev could not have been decided on st. A fire
// is decided with what its process read of the previous run, which the
// log does not record: either answer is accepted.
func (v *Verifier) checkSchedule(st aggregate.ScheduleState, ev events.Event) {
	var cmds []aggregate.Command
	switch p := ev.Data.(type) {
	case events.ScheduleCreated:
		cmds = []aggregate.Command{aggregate.CreateSchedule{ID: ev.TaskID, CustomerID: ev.CustomerID, Spec: p.Spec, Paused: p.Paused}}
	case events.ScheduleUpdated:
		cmds = []aggregate.Command{aggregate.CreateSchedule{ID: ev.TaskID, CustomerID: ev.CustomerID, Spec: p.Spec}}
	case events.SchedulePaused:
		cmds = []aggregate.Command{aggregate.PauseSchedule{}}
	case events.ScheduleResumed:
		cmds = []aggregate.Command{aggregate.ResumeSchedule{}}
	case events.ScheduleDeleted:
		cmds = []aggregate.Command{aggregate.DeleteSchedule{}}
	case events.ScheduleFired:
		cmds = []aggregate.Command{aggregate.FireSchedule{}, aggregate.FireSchedule{PrevLive: true}}
		if p.Manual {
			cmds = []aggregate.Command{aggregate.TriggerSchedule{}}
		}
	}
	var why string
	for _, cmd := range cmds {
		got, err := aggregate.DecideSchedule(st, cmd, ev.At)
		switch {
		case err != nil:
			why = err.Error()
		case len(got) != 1:
			why = "it changes nothing (a duplicate)"
		case !reflect.DeepEqual(inUTC(got[0].Data), inUTC(ev.Data)):
			why = fmt.Sprintf("logged %+v, expected %+v", ev.Data, got[0].Data)
		default:
			return
		}
	}
	v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s on schedule %s (%s) is not what the schedule aggregate decides: %s",
		ev.Type(), ev.TaskID, or(ScheduleStatus(st), "none"), why)
}

// inUTC is p with a fire's instant in UTC: decoded and decided times
// differ in their location only.
func inUTC(p events.Payload) events.Payload {
	if f, ok := p.(events.ScheduleFired); ok {
		f.At = f.At.UTC()
		return f
	}
	return p
}

func or(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}
