package service

import (
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// StreamFilter selects the events of the service's Stream. Each field lists
// alternatives; an event is selected when it matches every non-empty
// field.
type StreamFilter struct {
	TaskIDs, RootIDs, Queues []string
	Types                    []events.Type
}

// Validate returns an ErrInvalid error unless every id of f is valid,
// every type known, and no field lists more than api.MaxStreamFilterValues.
func (f StreamFilter) Validate() error {
	for name, ids := range map[string][]string{"taskId": f.TaskIDs, "rootId": f.RootIDs, "queue": f.Queues} {
		if len(ids) > api.MaxStreamFilterValues {
			return invalid("%s: more than %d values", name, api.MaxStreamFilterValues)
		}
		for _, id := range ids {
			if err := events.ValidID(id); err != nil {
				return invalid("%s: %v", name, err)
			}
		}
	}
	if len(f.Types) > api.MaxStreamFilterValues {
		return invalid("type: more than %d values", api.MaxStreamFilterValues)
	}
	for _, t := range f.Types {
		if !events.KnownType(t) {
			return invalid("type: unknown event type %.64q", t)
		}
	}
	return nil
}

// Cursor is where a stream stands: by shard, the position of the last
// event it passed (0: none yet). Its token (the service's CursorToken) is the
// stream's resume point, the SSE id of the event that moved it there.
type Cursor []events.Position
