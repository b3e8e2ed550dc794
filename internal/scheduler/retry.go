package scheduler

import (
	"context"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/internal/service"
)

// RetryTaskRequest asks for a new task repeating a terminal one
// (service.RetryTaskRequest).
type RetryTaskRequest = service.RetryTaskRequest

// RetryTask schedules a new root task with the spec of the terminal task
// id (queue, message unless req gives one, repo, labels, signal, timeout,
// retry policy and concurrency),
// whose relatedTaskId and retryOf name id. It is admitted, and counted
// against the customer's quotas, as a new root task is. created is false
// when req's RequestID was seen before; the existing task comes back
// then. Errors: aggregate.ErrNotFound (no such task for p),
// aggregate.ErrNotTerminal (the task is live), aggregate.ErrInvalid (a
// bad request id, message or runAt), an *AdmissionError, ErrUnavailable.
func (s *tasks) RetryTask(ctx context.Context, p Principal, id string, req RetryTaskRequest) (st aggregate.State, created bool, err error) {
	old, err := s.Get(ctx, p, id)
	if err != nil {
		return st, false, err
	}
	spec, err := aggregate.RetrySpec(old)
	if err != nil {
		return st, false, err
	}
	now := s.now()
	spec.RequestID, spec.RunAt = req.RequestID, now.UTC()
	if req.Message != nil {
		spec.Message = *req.Message
		if spec.Message.CreatedAt.IsZero() {
			spec.Message.CreatedAt = now
		}
	}
	if req.RunAt != nil {
		if err := checkRunAt(*req.RunAt, now); err != nil {
			return st, false, err
		}
		spec.RunAt = req.RunAt.UTC()
	}
	if err := s.checkQueues(old.CustomerID, spec.Queue); err != nil {
		return st, false, err
	}
	return s.create(ctx, p, old.CustomerID, spec, now, nil)
}
