package scheduler

import (
	"context"
	"sync"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// batchParallelism bounds the items of one batch in flight at once: each
// is a synchronous append and a wait for the projections, so a batch is as
// fast as this many single requests.
const batchParallelism = 64

// claimLinger is how long a batch claim collects more notifications after
// the first arrived: queued ones arrive within microseconds of each other.
const claimLinger = 2 * time.Millisecond

// Outcome is one item's answer in a batch: the task and whether the call
// created it, or the error a single call would have returned.
type Outcome struct {
	State   aggregate.State
	Created bool
	Err     error
}

// ResultItem is one result of RecordResults.
type ResultItem struct {
	TaskID, DeliveryID string
	Result             events.Result
}

// inParallel runs fn(i) for i in [0, n), at most batchParallelism at once.
func inParallel(n int, fn func(i int)) {
	sem := make(chan struct{}, batchParallelism)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(i)
		})
	}
	wg.Wait()
}

// checkBatch refuses an empty batch or one of more than api.MaxBatchItems.
func checkBatch(n int) error {
	if n < 1 || n > api.MaxBatchItems {
		return invalid("a batch has 1 to %d items, not %d", api.MaxBatchItems, n)
	}
	return nil
}

// ScheduleBatch schedules each request as its own task, as Schedule
// would, and answers in request order; one item's failure does not affect
// another's. An empty batch or one over api.MaxBatchItems schedules
// nothing and returns ErrInvalid.
func (s *Service) ScheduleBatch(ctx context.Context, p Principal, reqs []ScheduleRequest) ([]Outcome, error) {
	if err := checkBatch(len(reqs)); err != nil {
		return nil, err
	}
	out := make([]Outcome, len(reqs))
	inParallel(len(reqs), func(i int) {
		o := &out[i]
		o.State, o.Created, o.Err = s.Schedule(ctx, p, reqs[i])
	})
	return out, nil
}

// RecordResults records each result as RecordResult would and answers in
// request order; one item's failure does not affect another's.
func (s *Service) RecordResults(ctx context.Context, p Principal, items []ResultItem) ([]Outcome, error) {
	if err := checkBatch(len(items)); err != nil {
		return nil, err
	}
	out := make([]Outcome, len(items))
	inParallel(len(items), func(i int) {
		it := items[i]
		out[i].State, out[i].Err = s.RecordResult(ctx, p, it.TaskID, it.DeliveryID, it.Result)
	})
	return out, nil
}

// ClaimBatch waits up to wait (as ClaimNext) until at least one task of
// queue can be claimed, claims up to limit (1 to api.MaxBatchItems) of those
// ready then for executorID, and returns them; none when nothing could be
// claimed in time. It fails only when no task was claimed and the log
// could not answer.
func (s *Service) ClaimBatch(ctx context.Context, p Principal, queue, executorID string, limit int, wait time.Duration) ([]aggregate.State, error) {
	if err := validIDs("queue", queue, "executorId", executorID); err != nil {
		return nil, err
	}
	if err := checkBatch(limit); err != nil {
		return nil, err
	}
	return s.claimWaiting(ctx, p, queue, executorID, limit, claimLinger, wait)
}
