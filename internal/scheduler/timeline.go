package scheduler

import (
	"context"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/replay"
)

// Timeline returns the history of task id as the API's entries (GET
// /v1/tasks/{id}/history), each with the task's status after it. It
// fails as History does.
func (s *feed) Timeline(ctx context.Context, p Principal, id string) ([]api.Event, error) {
	evs, err := s.History(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return entries(evs), nil
}

// LineageTimeline is Timeline for the whole lineage of task id, in log
// order (GET /v1/tasks/{id}/history?tree=1). It fails as LineageHistory
// does.
func (s *feed) LineageTimeline(ctx context.Context, p Principal, id string) ([]api.Event, error) {
	evs, err := s.LineageHistory(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return entries(evs), nil
}

// ScheduleTimeline is Timeline for a customer's schedule (GET
// /v1/schedules/{id}/history), each entry with the schedule's status
// after it. It fails as ScheduleHistory does.
func (s *schedules) ScheduleTimeline(ctx context.Context, p Principal, customerID, id string) ([]api.Event, error) {
	evs, err := s.ScheduleHistory(ctx, p, customerID, id)
	if err != nil {
		return nil, err
	}
	return entries(evs), nil
}

// CustomerTimeline calls fn, in log order, with the entry of every event
// of customerID's tasks stored at or after since (GET /v1/events), each
// with its task's status after it, and with a Quarantined marker
// (quarantinedEntry) in place of every message there that does not
// decode. It fails as CustomerEvents does, or with fn's error.
func (s *feed) CustomerTimeline(ctx context.Context, p Principal, customerID string, since time.Time, fn func(api.Event) error) error {
	t := replay.NewStatusTracker()
	return s.CustomerEvents(ctx, p, customerID, since, func(ev events.Event) error {
		return fn(entry(ev, t.Entry(ev)))
	}, func(c *events.CorruptError) error {
		return fn(quarantinedEntry(c))
	})
}

// quarantinedEntry is the marker that stands, in a feed of events (GET
// /v1/events, the event stream), for a message of the log that does not
// decode: type api.EventQuarantined at the message's seq, on the task its
// subject names, stored at At, with why in Detail and Data. Its status is
// empty: what the message did to its task is unknown.
func quarantinedEntry(c *events.CorruptError) api.Event {
	reason := c.Err.Error()
	return api.Event{
		Seq: uint64(c.Pos), TaskID: c.TaskID(), Type: api.EventQuarantined, At: c.At.UTC(),
		Detail: "a message of the log that does not decode was skipped (quarantined): " + reason,
		Data:   api.QuarantinedData{Reason: reason},
	}
}

// entries renders logged events (of one task or schedule, or a lineage
// in log order) as the API's history entries, never nil.
func entries(evs []events.Event) []api.Event {
	t := replay.NewStatusTracker()
	out := make([]api.Event, len(evs))
	for i, ev := range evs {
		out[i] = entry(ev, t.Entry(ev))
	}
	return out
}

// streamEntry renders ev, which left its task at st, as an entry of the
// event stream.
func streamEntry(ev events.Event, st aggregate.State) api.Event {
	return entry(ev, replay.EntryOf(ev, st))
}

func entry(ev events.Event, e replay.Entry) api.Event {
	return api.Event{Seq: uint64(e.Seq), ID: ev.ID, TaskID: e.TaskID, Type: e.Type, At: e.At, Actor: e.Actor, Status: e.Status, Detail: e.Detail, Data: e.Data}
}
