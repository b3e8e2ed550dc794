package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/projections"
)

// ErrScheduleLimit is returned when a customer already has
// Limits.MaxSchedules live schedules (service.ErrScheduleLimit).
var ErrScheduleLimit = service.ErrScheduleLimit

// schedules is the part of the service that keeps schedules: their
// routes (POST, GET and DELETE /v1/schedules..., pause, resume, trigger,
// history) and the alarm's fires (FireSchedule). It reads the
// schedules' log and view and who owns a task, and schedules each run's
// task through the tasks part. It is safe for concurrent use.
type schedules struct {
	*core
	log          ScheduleStore
	views        ScheduleViews
	tasks        *tasks // each run's task
	maxSchedules int    // Limits.MaxSchedules
}

// ScheduleStore is the log of schedules as the service uses it
// (internal/store.Store).
type ScheduleStore interface {
	LoadSchedule(ctx context.Context, customerID, scheduleID string) (aggregate.ScheduleState, error)
	ScheduleHistory(ctx context.Context, customerID, scheduleID string) ([]events.Event, error)
	ExecuteSchedule(ctx context.Context, customerID, scheduleID, actor string, cmd aggregate.Command) (aggregate.ScheduleState, []events.Event, error)
	// ExecuteScheduleOn decides cmd on st, a state the caller holds, and
	// appends after it only if the log has not moved on (else an error
	// wrapping aggregate.ErrConflict), without reading the log.
	ExecuteScheduleOn(ctx context.Context, st aggregate.ScheduleState, actor string, cmd aggregate.Command) (aggregate.ScheduleState, []events.Event, error)
}

// ScheduleViews is what the service reads of the schedules' projection
// (projections.Engine).
type ScheduleViews interface {
	Schedule(customerID, scheduleID string) (projections.Schedule, bool)
	Schedules(customerID, after string, limit int, deleted bool) []projections.Schedule
	LiveSchedules(customerID string) int
	SettleRun(customerID, scheduleID string)
}

// CreateScheduleRequest is a request for a schedule
// (service.CreateScheduleRequest).
type CreateScheduleRequest = service.CreateScheduleRequest

// ScheduleView is a schedule with its next instants and its last runs
// (service.ScheduleView).
type ScheduleView = service.ScheduleView

// ScheduleRun is one fire of a schedule and the status of its task
// (service.ScheduleRun).
type ScheduleRun = service.ScheduleRun

// ScheduleNextShown is how many next instants a ScheduleView holds.
const ScheduleNextShown = 5

// scheduleCustomer is the customer a request acts for: the token's, or
// for an operator the one named (default events.DefaultCustomer).
func scheduleCustomer(p Principal, customerID string) (string, error) {
	switch {
	case !p.IsOperator() && customerID != "" && customerID != p.CustomerID:
		return "", invalid("customerId is taken from the token")
	case !p.IsOperator():
		return p.CustomerID, nil
	case customerID == "":
		return events.DefaultCustomer, nil
	}
	if err := events.ValidID(customerID); err != nil {
		return "", invalid("customerId: %v", err)
	}
	return customerID, nil
}

// scheduleSpec turns a request into the spec the aggregate checks, with
// the defaults filled in.
func scheduleSpec(req CreateScheduleRequest) (events.ScheduleSpec, error) {
	t := req.Task
	if t.CustomerID != "" || t.ParentID != "" || t.RequestID != "" || t.RelatedTaskID != "" || t.RunAt != nil || t.DelaySeconds != nil {
		return events.ScheduleSpec{}, invalid("task: a schedule's task takes queue, message, repo, signal, timeoutSeconds, labels, retry, concurrency, kind and payload only")
	}
	spec := events.ScheduleSpec{
		Cron: req.Cron, Every: req.Every, Timezone: cmp.Or(req.Timezone, "UTC"),
		Overlap: cmp.Or(req.Overlap, events.OverlapSkip), Catchup: cmp.Or(req.Catchup, events.CatchupOne),
		Task: events.TaskSpec{
			Queue: cmp.Or(t.Queue, events.DefaultQueue), Signal: t.Signal, Repo: t.Repo, Message: t.Message,
			TimeoutSeconds: events.DefaultTimeoutSeconds, Retry: retryPolicy(t.Retry), Concurrency: t.Concurrency,
			Kind: t.Kind, Payload: t.Payload,
		},
	}
	if len(t.Labels) > 0 { // no labels is nil, so an equal spec is the same spec
		spec.Task.Labels = maps.Clone(t.Labels)
	}
	if t.TimeoutSeconds != nil {
		spec.Task.TimeoutSeconds = *t.TimeoutSeconds
	}
	return spec, nil
}

// CreateSchedule creates a schedule, or changes the spec of a live one
// with that id (created is false then, and when nothing changed). A
// customer has at most Limits.MaxSchedules live schedules
// (ErrScheduleLimit); the count comes from the projections.
func (s *schedules) CreateSchedule(ctx context.Context, p Principal, req CreateScheduleRequest) (v ScheduleView, created bool, err error) {
	customerID, err := scheduleCustomer(p, req.CustomerID)
	if err != nil {
		return v, false, err
	}
	if err := events.ValidID(req.ID); err != nil {
		return v, false, invalid("id: %v", err)
	}
	spec, err := scheduleSpec(req)
	if err != nil {
		return v, false, err
	}
	if err := aggregate.ValidateScheduleSpec(req.ID, customerID, spec); err != nil {
		return v, false, err
	}
	if _, live := s.liveSchedule(customerID, req.ID); !live && s.maxSchedules >= 0 && s.views.LiveSchedules(customerID) >= s.maxSchedules {
		return v, false, fmt.Errorf("%w: customer %s has %d schedules, at most %d", ErrScheduleLimit, customerID, s.views.LiveSchedules(customerID), s.maxSchedules)
	}
	st, evs, err := s.log.ExecuteSchedule(ctx, customerID, req.ID, p.Actor(), aggregate.CreateSchedule{ID: req.ID, CustomerID: customerID, Spec: spec, Paused: req.Paused})
	if err != nil {
		return v, false, s.fromStore(err)
	}
	created = len(evs) == 1 && evs[0].Type() == events.TypeScheduleCreated
	v, err = s.scheduleAfter(ctx, st)
	return v, created, err
}

func (s *schedules) liveSchedule(customerID, id string) (projections.Schedule, bool) {
	sc, ok := s.views.Schedule(customerID, id)
	return sc, ok && sc.State.Live()
}

// scheduleAfter waits until the projections have applied st and answers
// the schedule's view.
func (s *schedules) scheduleAfter(ctx context.Context, st aggregate.ScheduleState) (ScheduleView, error) {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	if err := s.applied.WaitFor(ctx, st.LastSeq); err != nil {
		return ScheduleView{}, s.unavailable(err)
	}
	sc, ok := s.views.Schedule(st.CustomerID, st.ID)
	if !ok {
		sc = projections.Schedule{State: st}
	}
	return s.scheduleView(sc), nil
}

func (s *schedules) scheduleView(sc projections.Schedule) ScheduleView {
	v := ScheduleView{State: sc.State, Next: sc.State.NextN(ScheduleNextShown)}
	for _, f := range slices.Backward(sc.Runs) {
		r := ScheduleRun{ScheduleFired: f}
		if f.TaskID != "" {
			if t, ok := s.applied.Task(f.TaskID); ok {
				r.Status = t.Status
			}
		}
		v.Runs = append(v.Runs, r)
	}
	return v
}

// GetSchedule returns a customer's schedule, a deleted one too, from the
// projections; one they do not hold yet (catching up after a restart) is
// read from the log, without its runs. Another customer's is ErrNotFound.
func (s *schedules) GetSchedule(ctx context.Context, p Principal, customerID, id string) (ScheduleView, error) {
	customerID, err := scheduleCustomer(p, customerID)
	if err != nil {
		return ScheduleView{}, err
	}
	if err := events.ValidID(id); err != nil {
		return ScheduleView{}, invalid("schedule id: %v", err)
	}
	if sc, ok := s.views.Schedule(customerID, id); ok {
		return s.scheduleView(sc), nil
	}
	st, err := s.log.LoadSchedule(ctx, customerID, id)
	if err != nil {
		return ScheduleView{}, s.unavailable(err)
	}
	if st.ID == "" {
		return ScheduleView{}, fmt.Errorf("%w: schedule %s", aggregate.ErrNotFound, id)
	}
	return s.scheduleView(projections.Schedule{State: st}), nil
}

// ListSchedules returns a page of up to limit (at least 1) live
// schedules after the cursor after ("" for the first page), and the
// cursor of the next page ("" at the end): the customer's, by id, or for
// an operator who names no customer every customer's, by customer then
// id (a cursor is then "customer/id"; ScheduleCursorValid checks one).
// It is ErrUnavailable while the views catch up after a start.
func (s *schedules) ListSchedules(p Principal, customerID, after string, limit int) (page []ScheduleView, next string, err error) {
	if err := s.caughtUp(); err != nil {
		return nil, "", err
	}
	filter := customerID
	if !p.IsOperator() {
		filter = p.CustomerID
	}
	if filter != "" && after != "" {
		after = projections.ScheduleKey(filter, after)
	}
	scheds := s.views.Schedules(filter, after, limit+1, false)
	if len(scheds) > limit {
		scheds = scheds[:limit]
		last := scheds[limit-1].State
		next = last.ID
		if filter == "" {
			next = projections.ScheduleKey(last.CustomerID, last.ID)
		}
	}
	for _, sc := range scheds {
		page = append(page, s.scheduleView(sc))
	}
	return page, next, nil
}

// ScheduleCursorValid reports whether after can be a cursor of ListSchedules
// for p and customerID: a schedule id, or in an operator's list of every
// customer's (customerID "") a customer id and a schedule id joined by
// "/".
func (s *schedules) ScheduleCursorValid(p Principal, customerID, after string) bool {
	if customerID == "" && p.IsOperator() {
		c, id := projections.SplitScheduleKey(after)
		if events.ValidID(c) != nil {
			return false
		}
		after = id
	}
	return events.ValidID(after) == nil
}

// ScheduleHistory returns every event of a customer's schedule, from the
// log. Another customer's is ErrNotFound.
func (s *schedules) ScheduleHistory(ctx context.Context, p Principal, customerID, id string) ([]events.Event, error) {
	customerID, err := scheduleCustomer(p, customerID)
	if err != nil {
		return nil, err
	}
	if err := events.ValidID(id); err != nil {
		return nil, invalid("schedule id: %v", err)
	}
	evs, err := s.log.ScheduleHistory(ctx, customerID, id)
	if err != nil {
		return nil, s.unavailable(err)
	}
	if len(evs) == 0 {
		return nil, fmt.Errorf("%w: schedule %s", aggregate.ErrNotFound, id)
	}
	return evs, nil
}

// ScheduleAction runs PauseSchedule, ResumeSchedule or DeleteSchedule on
// a customer's live schedule and answers it (ErrNotFound for none, a
// deleted one, or another customer's).
func (s *schedules) ScheduleAction(ctx context.Context, p Principal, customerID, id string, cmd aggregate.Command) (ScheduleView, error) {
	customerID, err := scheduleCustomer(p, customerID)
	if err != nil {
		return ScheduleView{}, err
	}
	if err := events.ValidID(id); err != nil {
		return ScheduleView{}, invalid("schedule id: %v", err)
	}
	st, _, err := s.log.ExecuteSchedule(ctx, customerID, id, p.Actor(), cmd)
	if err != nil {
		return ScheduleView{}, s.fromStore(err)
	}
	return s.scheduleAfter(ctx, st)
}

// TriggerSchedule makes a run of a customer's live schedule now, paused or
// not, and returns its task.
func (s *schedules) TriggerSchedule(ctx context.Context, p Principal, customerID, id string) (aggregate.State, error) {
	customerID, err := scheduleCustomer(p, customerID)
	if err != nil {
		return aggregate.State{}, err
	}
	if err := events.ValidID(id); err != nil {
		return aggregate.State{}, invalid("schedule id: %v", err)
	}
	st, evs, err := s.log.ExecuteSchedule(ctx, customerID, id, p.Actor(), aggregate.TriggerSchedule{})
	if err != nil {
		return aggregate.State{}, s.fromStore(err)
	}
	return s.scheduleRun(ctx, st, evs[0].Data.(events.ScheduleFired))
}

// FireSchedule does what is due of a customer's schedule, for the alarm
// (the alarm's Firer): if the task of its last run is not in the log (the
// process crashed after the fire) it schedules that task; else it fires
// the due instant, the aggregate deciding whether it runs, is skipped for
// an overlap, or is passed over, and schedules the run's task under the
// request id derived from the instant. Two processes firing one instant
// append one ScheduleFired (the schedule's OCC) and schedule one task (the
// derived id). It returns the last sequence it appended or read and, when
// the log has nothing due (the projections lag it, or were early), the
// log's next due instant, for the alarm to come back then rather than at
// once (zero when it fired, or when nothing will be due).
//
// The fire is decided first on the schedule as the projections hold it,
// when they show an instant due, and appended without reading the log:
// the append's expected sequence refuses it if the log has moved on, and
// then the log's state decides. So an on-time fire reads nothing before
// its ScheduleFired.
func (s *schedules) FireSchedule(ctx context.Context, customerID, id string) (seq events.Position, notBefore time.Time, err error) {
	if sc, ok := s.views.Schedule(customerID, id); ok && sc.State.LastHash != (events.Hash{}) {
		if next := sc.State.Next(); !next.IsZero() && !next.After(s.now()) {
			seq, _, err := s.fire(ctx, sc.State, true)
			if !errors.Is(err, aggregate.ErrConflict) {
				return seq, time.Time{}, err
			}
		}
	}
	st, err := s.log.LoadSchedule(ctx, customerID, id)
	if err != nil {
		return 0, time.Time{}, s.unavailable(err)
	}
	return s.fire(ctx, st, false)
}

// fire is FireSchedule on st: the log's state, or (held) the projections',
// which is appended after only if the log has not moved on (an error
// wrapping aggregate.ErrConflict, before anything is appended, if it
// has).
func (s *schedules) fire(ctx context.Context, st aggregate.ScheduleState, held bool) (events.Position, time.Time, error) {
	customerID, id := st.CustomerID, st.ID
	prevLive := false
	if run := st.LastRun; run.TaskID != "" {
		// The projections answer without a read when what they hold
		// settles it: a task they hold is in the log, and a terminal one
		// stays terminal; a live one may have ended since, which overlap
		// "skip" must read from the log.
		task, ok := s.applied.Task(run.TaskID)
		if !ok || !task.Status.Terminal() && st.Spec.Overlap != events.OverlapAllow {
			var err error
			if task, err = s.store.Load(ctx, run.TaskID); err != nil {
				return st.LastSeq, time.Time{}, s.unavailable(err)
			}
		}
		if !task.Exists() {
			t, err := s.runTask(ctx, st, run)
			return s.firedSeq(st.LastSeq, t.LastSeq), time.Time{}, err
		}
		s.views.SettleRun(customerID, id)
		prevLive = !task.Status.Terminal()
	}
	if next := st.Next(); next.IsZero() || next.After(s.now()) {
		return st.LastSeq, next, nil // nothing due; the projections lag, or were early
	}
	cmd := aggregate.FireSchedule{PrevLive: prevLive}
	var evs []events.Event
	var err error
	if held {
		if st, evs, err = s.log.ExecuteScheduleOn(ctx, st, "", cmd); errors.Is(err, aggregate.ErrConflict) {
			return st.LastSeq, time.Time{}, err
		}
	} else {
		st, evs, err = s.log.ExecuteSchedule(ctx, customerID, id, "", cmd)
	}
	if errors.Is(err, aggregate.ErrStale) {
		// Another process fired it (or paused it) first. If it died before
		// the run's task, the projections put the schedule back at once.
		return st.LastSeq, time.Time{}, nil
	}
	if err != nil || len(evs) == 0 {
		return st.LastSeq, time.Time{}, s.fromStore(err)
	}
	f := evs[0].Data.(events.ScheduleFired)
	if f.TaskID == "" {
		return st.LastSeq, time.Time{}, nil
	}
	crashpoint.Hit(crashpoint.Fired)
	t, err := s.runTask(ctx, st, f)
	return s.firedSeq(st.LastSeq, t.LastSeq), time.Time{}, err
}

// firedSeq is the position FireSchedule answers for a fire whose
// schedule is at sched and whose run's task is at task: the later of
// the two when both are in one shard (the views then hold both once
// they cover it), else the schedule's, which the next fire waits on (a
// run's task the views lack yet is read from the log). Positions in two
// shards do not compare.
func (s *schedules) firedSeq(sched, task events.Position) events.Position {
	shards := s.store.Shards()
	if task != 0 && sched.Part(shards) == task.Part(shards) {
		return max(sched, task)
	}
	return sched
}

// runTask schedules the task of run f of schedule st (idempotent: its id
// is derived from the run's request id). A task admission refused is
// still the run's task (canceled). A task refused for a bound that may
// free (the customer's queues) is an error the alarm retries, not one it
// gives up on.
func (s *schedules) runTask(ctx context.Context, st aggregate.ScheduleState, f events.ScheduleFired) (aggregate.State, error) {
	task, err := s.scheduleRun(ctx, st, f)
	if errors.Is(err, aggregate.ErrInvalid) {
		return task, fmt.Errorf("schedule %s: the task of the run at %s was refused, will retry: %v", st.ID, f.At.Format(time.RFC3339), err)
	}
	return task, err
}

func (s *schedules) scheduleRun(ctx context.Context, st aggregate.ScheduleState, f events.ScheduleFired) (aggregate.State, error) {
	t := st.Spec.Task
	timeout := t.TimeoutSeconds
	t.Message.CreatedAt = f.At // each run's objective is of its instant
	// The run's task is the schedule's doing: its events name it.
	task, _, err := s.tasks.Schedule(ctx, Principal{CustomerID: st.CustomerID, Name: "schedule:" + st.ID}, ScheduleRequest{
		RequestID: f.RequestID, Signal: t.Signal, Repo: t.Repo, Queue: t.Queue, Message: t.Message, TimeoutSeconds: &timeout,
		Labels: t.Labels, Retry: api.RetryRequestOf(t.Retry), Concurrency: t.Concurrency,
		Kind: t.Kind, Payload: t.Payload,
	})
	var refused *AdmissionError
	if errors.As(err, &refused) {
		return refused.Task, nil
	}
	return task, err
}
