package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// ScheduleHistory returns every event of a customer's schedule in log
// order, each with its stream sequence; none for an unknown schedule.
func (s *Store) ScheduleHistory(ctx context.Context, customerID, scheduleID string) ([]events.Event, error) {
	var evs []events.Event
	err := s.readSchedule(ctx, customerID, scheduleID, func(ev events.Event) { evs = append(evs, ev) })
	return evs, err
}

// LoadSchedule returns a customer's schedule as the log has it now: the
// zero ScheduleState for an unknown one.
func (s *Store) LoadSchedule(ctx context.Context, customerID, scheduleID string) (aggregate.ScheduleState, error) {
	var st aggregate.ScheduleState
	err := s.readSchedule(ctx, customerID, scheduleID, func(ev events.Event) { st = aggregate.ApplySchedule(st, ev) })
	return st, err
}

func (s *Store) readSchedule(ctx context.Context, customerID, scheduleID string, fn func(events.Event)) error {
	if err := events.ValidID(customerID); err != nil {
		return err
	}
	if err := events.ValidID(scheduleID); err != nil {
		return err
	}
	i := s.shards.Of(customerID, scheduleID)
	return s.readSubject(ctx, i, s.parts[i].Subjects.Schedule(customerID, scheduleID), 0, fn)
}

// ExecuteSchedule decides cmd against the customer's schedule as the log
// has it and appends the resulting events with the schedule's last
// sequence as the expected one: of two processes firing one instant, one
// appends and the other, deciding again, finds it fired. On a conflict it
// reloads and decides again, up to MaxRetries times. Schedules are not
// cached: every command reads the schedule's subject. Errors are as
// Execute's.
func (s *Store) ExecuteSchedule(ctx context.Context, customerID, scheduleID, actor string, cmd aggregate.Command) (aggregate.ScheduleState, []events.Event, error) {
	defer s.take("schedule/" + customerID + "/" + scheduleID)()
	for attempt := 0; ; attempt++ {
		st, err := s.LoadSchedule(ctx, customerID, scheduleID)
		if err != nil {
			return st, nil, fmt.Errorf("%w: load schedule %s: %w", ErrUnavailable, scheduleID, err)
		}
		st, evs, err := s.decideSchedule(ctx, st, actor, cmd)
		if errors.Is(err, aggregate.ErrConflict) && attempt < s.cfg.MaxRetries {
			continue
		}
		return st, evs, err
	}
}

// ExecuteScheduleOn is ExecuteSchedule on st, a state of the schedule the
// caller holds (the projections'), without reading the log: it decides
// cmd against st and appends with st's last sequence (and hash) as the
// expected ones, once. If the log has moved on since st, it appends
// nothing and returns an error wrapping aggregate.ErrConflict: the caller
// decides again on the log's state.
func (s *Store) ExecuteScheduleOn(ctx context.Context, st aggregate.ScheduleState, actor string, cmd aggregate.Command) (aggregate.ScheduleState, []events.Event, error) {
	defer s.take("schedule/" + st.CustomerID + "/" + st.ID)()
	return s.decideSchedule(ctx, st, actor, cmd)
}

// decideSchedule decides cmd against st and appends its events after st.
func (s *Store) decideSchedule(ctx context.Context, st aggregate.ScheduleState, actor string, cmd aggregate.Command) (aggregate.ScheduleState, []events.Event, error) {
	if actor == "" {
		actor = s.cfg.Actor
	}
	evs, err := aggregate.DecideSchedule(st, cmd, s.cfg.Now())
	if err != nil || len(evs) == 0 {
		return st, nil, err
	}
	for i := range evs {
		ev := &evs[i]
		ev.ID, ev.Actor, ev.Prev = events.NewID(), actor, st.LastHash
		if err = s.publish(ctx, ev, s.shards.OfEvent(*ev, ""), st.LastSeq); err != nil {
			break
		}
		st = aggregate.ApplySchedule(st, *ev)
	}
	if err != nil {
		return st, nil, fmt.Errorf("store: %T on schedule %s: %w", cmd, st.ID, err)
	}
	return st, evs, nil
}
