package httpapi

import (
	"context"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// Local calls a Service in the same process, as the operator,
// with the same requests, answers and *Error values a Client gets from a
// server on that service, minus HTTP and JSON. It is what an executor
// embedded in a scheduler process (and the benchmarks) use instead of a
// Client. It is safe for concurrent use.
type Local struct {
	svc Service
	p   service.Principal
}

// NewLocal returns a Local on svc acting as service.Operator.
func NewLocal(svc Service) *Local {
	return &Local{svc: svc, p: service.Operator}
}

// validTaskID rejects a malformed task id as the server's path check does.
func validTaskID(id string) error {
	if err := events.ValidID(id); err != nil {
		return invalidArg("task id: %v", err)
	}
	return nil
}

// task renders the answer of a call that returns a task.
func task(st aggregate.State, err error) (api.Task, error) {
	if err != nil {
		return api.Task{}, wireError(err)
	}
	return NewTask(st), nil
}

// Schedule creates a task; created is false when its requestId repeated.
func (l *Local) Schedule(ctx context.Context, req api.ScheduleRequest) (api.Task, bool, error) {
	st, created, err := l.svc.Schedule(ctx, l.p, scheduleRequest(req))
	if err != nil {
		return api.Task{}, false, wireError(err)
	}
	return NewTask(st), created, nil
}

// Get returns a task.
func (l *Local) Get(ctx context.Context, id string) (api.Task, error) {
	if err := validTaskID(id); err != nil {
		return api.Task{}, err
	}
	return task(l.svc.Get(ctx, l.p, id))
}

// Claim consumes deliveryID for executorID, with heartbeats if opts say
// so (api.WithHeartbeat).
func (l *Local) Claim(ctx context.Context, id, deliveryID, executorID string, opts ...api.ClaimOption) (api.Task, error) {
	if err := validTaskID(id); err != nil {
		return api.Task{}, err
	}
	return task(l.svc.Claim(ctx, l.p, id, deliveryID, executorID, opts...))
}

// Heartbeat renews the heartbeat of a task's claim under deliveryID, as
// POST /v1/tasks/{id}/heartbeat.
func (l *Local) Heartbeat(ctx context.Context, id, deliveryID string) (api.Renewal, error) {
	if err := validTaskID(id); err != nil {
		return api.Renewal{}, err
	}
	rn, err := l.svc.Heartbeat(ctx, l.p, id, deliveryID)
	if err != nil {
		return api.Renewal{}, wireError(err)
	}
	return api.Renewal{ExpiresAt: utc(rn.ExpiresAt), Deadline: utc(rn.Deadline)}, nil
}

// Release hands a task's claim under deliveryID back, as POST
// /v1/tasks/{id}/release.
func (l *Local) Release(ctx context.Context, id, deliveryID, reason string) (api.Task, error) {
	if err := validTaskID(id); err != nil {
		return api.Task{}, err
	}
	return task(l.svc.Release(ctx, l.p, id, deliveryID, reason))
}

// ClaimNext waits up to wait (at most service.MaxWait) for a task of
// queue ("" is events.DefaultQueue) and claims it; ok is false when nothing was
// ready in time.
func (l *Local) ClaimNext(ctx context.Context, queue, executorID string, wait time.Duration, opts ...api.ClaimOption) (api.Task, bool, error) {
	queue, wait, err := pollArgs(queue, wait.Seconds())
	if err != nil {
		return api.Task{}, false, err
	}
	st, ok, err := l.svc.ClaimNext(ctx, l.p, queue, executorID, wait, opts...)
	if err != nil {
		return api.Task{}, false, wireError(err)
	}
	if !ok {
		return api.Task{}, false, nil
	}
	return NewTask(st), true, nil
}

// Check asks whether to stop and returns new mailbox messages, consumed
// when deliveryID is the running claim's (api.Client.Check).
func (l *Local) Check(ctx context.Context, id, deliveryID string) (api.Check, error) {
	if err := validTaskID(id); err != nil {
		return api.Check{}, err
	}
	res, err := l.svc.Check(ctx, l.p, id, deliveryID)
	if err != nil {
		return api.Check{}, wireError(err)
	}
	return api.Check{ShouldStop: res.ShouldStop, Reason: res.Reason, Messages: newMailItems(res.Messages), Cursor: res.Cursor}, nil
}

// RecordResult reports a task's result.
func (l *Local) RecordResult(ctx context.Context, id string, r api.ResultRequest) (api.Task, error) {
	if err := validTaskID(id); err != nil {
		return api.Task{}, err
	}
	return task(l.svc.RecordResult(ctx, l.p, id, r.DeliveryID, result(r)))
}

// ReportEffects records effects of the running task as they happen; the
// answer is the task with every effect reported so far.
func (l *Local) ReportEffects(ctx context.Context, id, deliveryID string, effects []events.Effect) (api.Task, error) {
	if err := validTaskID(id); err != nil {
		return api.Task{}, err
	}
	return task(l.svc.ReportEffects(ctx, l.p, id, deliveryID, effects))
}

// Cancel cancels a task.
func (l *Local) Cancel(ctx context.Context, id, reason string) (api.Task, error) {
	if err := validTaskID(id); err != nil {
		return api.Task{}, err
	}
	return task(l.svc.Cancel(ctx, l.p, id, reason))
}

// Mailbox reads messages with index > after without moving the cursor.
func (l *Local) Mailbox(ctx context.Context, id string, after int) (api.Mail, error) {
	if err := validTaskID(id); err != nil {
		return api.Mail{}, err
	}
	if after < 0 {
		return api.Mail{}, invalidArg("after must be a whole number ≥ 0")
	}
	items, cursor, err := l.svc.Mailbox(ctx, l.p, id, after)
	if err != nil {
		return api.Mail{}, wireError(err)
	}
	return api.Mail{Messages: newMailItems(items), Cursor: cursor}, nil
}

// ScheduleBatch schedules each request as its own task; items answer in
// request order as POST /v1/tasks/batch does.
func (l *Local) ScheduleBatch(ctx context.Context, reqs []api.ScheduleRequest) ([]api.BatchItem, error) {
	sreqs := make([]service.ScheduleRequest, len(reqs))
	for i, r := range reqs {
		sreqs[i] = scheduleRequest(r)
	}
	outs, err := l.svc.ScheduleBatch(ctx, l.p, sreqs)
	if err != nil {
		return nil, wireError(err)
	}
	return batchItems(outs, createdStatus).Results, nil
}

// ClaimBatch waits up to wait for ready tasks of queue and claims up to
// limit of them (1 to api.MaxBatchItems); none when nothing was ready in
// time.
func (l *Local) ClaimBatch(ctx context.Context, queue, executorID string, limit int, wait time.Duration, opts ...api.ClaimOption) ([]api.Task, error) {
	queue, wait, err := pollArgs(queue, wait.Seconds())
	if err != nil {
		return nil, err
	}
	states, err := l.svc.ClaimBatch(ctx, l.p, queue, executorID, limit, wait, opts...)
	if err != nil {
		return nil, wireError(err)
	}
	out := make([]api.Task, len(states))
	for i, st := range states {
		out[i] = NewTask(st)
	}
	return out, nil
}

// RecordResults reports several results; items answer in request order
// as POST /v1/results does.
func (l *Local) RecordResults(ctx context.Context, items []api.ResultItem) ([]api.BatchItem, error) {
	sitems := make([]service.ResultItem, len(items))
	for i, it := range items {
		if err := validTaskID(it.TaskID); err != nil {
			return nil, err
		}
		sitems[i] = service.ResultItem{TaskID: it.TaskID, DeliveryID: it.DeliveryID, Result: result(it.ResultRequest)}
	}
	outs, err := l.svc.RecordResults(ctx, l.p, sitems)
	if err != nil {
		return nil, wireError(err)
	}
	return batchItems(outs, okStatus).Results, nil
}
