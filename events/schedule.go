package events

import "time"

// The schedule event types: the log of a periodic schedule (POST
// /v1/schedules), on its own subject (Subjects.Schedule). An envelope's
// TaskID holds the schedule's id.
const (
	TypeScheduleCreated Type = "ScheduleCreated"
	TypeScheduleUpdated Type = "ScheduleUpdated"
	TypeSchedulePaused  Type = "SchedulePaused"
	TypeScheduleResumed Type = "ScheduleResumed"
	TypeScheduleDeleted Type = "ScheduleDeleted"
	TypeScheduleFired   Type = "ScheduleFired"
)

// IsSchedule reports whether t is one of the schedule event types.
func IsSchedule(t Type) bool {
	switch t {
	case TypeScheduleCreated, TypeScheduleUpdated, TypeSchedulePaused, TypeScheduleResumed, TypeScheduleDeleted, TypeScheduleFired:
		return true
	}
	return false
}

// The overlap and catch-up policies of a schedule.
const (
	OverlapSkip  = "skip"  // no new run while the previous one is not terminal (default)
	OverlapAllow = "allow" // runs may overlap
	CatchupOne   = "one"   // after downtime, one run for all the missed instants (default)
	CatchupNone  = "none"  // missed instants are passed over
	CatchupAll   = "all"   // a run for each missed instant, at most MaxCatchup
)

// Limits of a schedule, enforced by the aggregate.
const (
	MaxCronBytes      = 256                  // the cron expression
	MaxTimezoneBytes  = 64                   // the IANA zone name
	MinEvery          = time.Second          // the shortest every
	MaxEvery          = 366 * 24 * time.Hour // the longest every
	MaxCatchup        = 100                  // runs catchup "all" makes after downtime
	MaxSchedules      = 1000                 // live schedules per customer (the service's default)
	ScheduleRunsShown = 20                   // runs a schedule's view keeps
	// CatchupGrace is how late an instant may fire and still count as on
	// time: one older is missed, and the catch-up policy decides.
	CatchupGrace = time.Minute
)

// ScheduleSpec is what a caller chose about a schedule: exactly one of
// Cron and Every, the zone Cron is read in, the task each run schedules
// (Task.RootID, RequestID, RunAt are unset) and the policies.
type ScheduleSpec struct {
	Cron     string   `json:"cron,omitempty"`
	Every    string   `json:"every,omitempty"` // a Go duration ("30s"), MinEvery..MaxEvery
	Timezone string   `json:"timezone"`
	Task     TaskSpec `json:"task"`
	Overlap  string   `json:"overlap"`
	Catchup  string   `json:"catchup"`
}

// ScheduleCreated records a new schedule (or one created again after a
// ScheduleDeleted): instants after At are due unless Paused.
type ScheduleCreated struct {
	Spec   ScheduleSpec `json:"spec"`
	Paused bool         `json:"paused,omitempty"`
}

// ScheduleUpdated records a changed spec: instants after the event's At
// are due by the new spec.
type ScheduleUpdated struct {
	Spec ScheduleSpec `json:"spec"`
}

// SchedulePaused records that the schedule stopped firing.
type SchedulePaused struct{}

// ScheduleResumed records that the schedule fires again: instants after
// the event's At are due (those missed while paused are not).
type ScheduleResumed struct{}

// ScheduleDeleted records that the schedule stopped for good; its events
// stay in the log.
type ScheduleDeleted struct{}

// ScheduleFired records one run of the schedule for the instant At: the
// task RequestID names (TaskID, derived from the customer and RequestID)
// is scheduled after it. Skipped is set instead when no run is made for
// the instant ("overlap": the previous run was not terminal; "missed":
// catch-up "none" passed it over), and then TaskID and RequestID are
// empty. Missed counts the earlier due instants this event passes over
// (downtime; at most a counting bound). Manual marks a trigger: it does
// not move the schedule's next instant.
type ScheduleFired struct {
	At        time.Time `json:"at"`
	TaskID    string    `json:"taskId,omitempty"`
	RequestID string    `json:"requestId,omitempty"`
	Skipped   string    `json:"skipped,omitempty"`
	Missed    int       `json:"missed,omitempty"`
	Manual    bool      `json:"manual,omitempty"`
}

func (ScheduleCreated) EventType() Type { return TypeScheduleCreated }
func (ScheduleUpdated) EventType() Type { return TypeScheduleUpdated }
func (SchedulePaused) EventType() Type  { return TypeSchedulePaused }
func (ScheduleResumed) EventType() Type { return TypeScheduleResumed }
func (ScheduleDeleted) EventType() Type { return TypeScheduleDeleted }
func (ScheduleFired) EventType() Type   { return TypeScheduleFired }

// ScheduleRequestID is the request id of the run of schedule scheduleID
// for instant at: the same for every process that fires that instant, so
// they schedule one task.
func ScheduleRequestID(scheduleID string, at time.Time) string {
	return DeriveID("f", scheduleID, at.UTC().Format(time.RFC3339Nano))
}

// Schedule is the log subject of one schedule's events:
// <root>.sched.<customerId>.<scheduleId>. Both ids must be valid.
func (s Subjects) Schedule(customerID, scheduleID string) string {
	return s.Root + ".sched." + customerID + "." + scheduleID
}

// Schedules matches every schedule's events.
func (s Subjects) Schedules() string { return s.Root + ".sched.>" }

// Log is every subject of the event stream: the tasks', the concurrency
// keys' and the schedules'.
func (s Subjects) Log() []string { return []string{s.Events(), s.Keys(), s.Schedules()} }

// Of is the subject ev is stored on: its schedule's for a schedule
// event, its concurrency key's for a key event, else its task's.
func (s Subjects) Of(ev Event) string {
	switch {
	case IsSchedule(ev.Type()):
		return s.Schedule(ev.CustomerID, ev.TaskID)
	case KeyEvent(ev.Type()): // a concurrency key's: its TaskID is the key's id
		return s.Key(ev.CustomerID, ev.TaskID)
	}
	return s.Event(ev.CustomerID, ev.TaskID)
}
