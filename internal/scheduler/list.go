package scheduler

import (
	"context"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/projections"
)

// TaskFilter selects the tasks of List (service.TaskFilter).
type TaskFilter = service.TaskFilter

// List returns up to limit tasks matching f after the cursor, with the
// cursor of the next page ("" at the end), each without its payload (Get
// has it). A customer sees only its own.
// It is ErrUnavailable while the views catch up after a start.
func (s *feed) List(ctx context.Context, p Principal, f TaskFilter, after string, limit int) ([]aggregate.State, string, error) {
	if limit < 1 || limit > api.MaxListLimit {
		return nil, "", invalid("limit must be a whole number from 1 to %d", api.MaxListLimit)
	}
	if err := s.caughtUp(); err != nil {
		return nil, "", err
	}
	if !p.IsOperator() {
		if f.CustomerID != "" && f.CustomerID != p.CustomerID {
			return nil, "", nil
		}
		f.CustomerID = p.CustomerID
	}
	page := s.views.List(projections.Filter(f), after, limit+1)
	next := ""
	if len(page) > limit {
		page = page[:limit]
		next = page[limit-1].TaskID
	}
	for i := range page {
		if err := s.withSpec(ctx, &page[i]); err != nil {
			return nil, "", err
		}
		page[i].Spec.Payload = nil // up to 256 KiB each: a list shows the kind, the task its payload
	}
	return page, next, nil
}

// RequestFilter returns f narrowed to the one task that p's customer
// scheduled with requestID (for an operator, f.CustomerID's, or
// events.DefaultCustomer's when f names none, as Schedule does). Errors:
// aggregate.ErrInvalid for a malformed request id.
func (s *feed) RequestFilter(p Principal, f TaskFilter, requestID string) (TaskFilter, error) {
	if err := events.ValidID(requestID); err != nil {
		return f, invalid("requestId: %v", err)
	}
	customerID := f.CustomerID
	switch {
	case !p.IsOperator():
		customerID = p.CustomerID
	case customerID == "":
		customerID = events.DefaultCustomer
	}
	f.TaskID = requestTaskID(customerID, requestID)
	return f, nil
}
