package scheduler

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// batchParallelism bounds the items of one batch in flight at once. Each
// item waits for its own appends' acks one after another, and no longer
// for the projections (settleBatch waits once for all), so this many keep
// the store's pipelined appender full; all 1,000 of a batch at once only
// added contention on the connection's and the views' locks (+40 µs of
// CPU a task in the bench's batch enqueue), and several such batches
// would pass the appender's 4,096 in flight.
const batchParallelism = 256

// limitedParallelism bounds the items of one batch in flight at once that
// count against a limit the projections count (limited): racing items may
// overshoot such a limit by this many, as racing single requests may.
const limitedParallelism = 64

// claimLinger is how long a batch claim collects more notifications after
// the first arrived: queued ones arrive within microseconds of each other.
const claimLinger = 2 * time.Millisecond

// Outcome is one item's answer in a batch (service.Outcome).
type Outcome = service.Outcome

// ResultItem is one result of RecordResults (service.ResultItem).
type ResultItem = service.ResultItem

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
func (s *tasks) ScheduleBatch(ctx context.Context, p Principal, reqs []ScheduleRequest) ([]Outcome, error) {
	if err := checkBatch(len(reqs)); err != nil {
		return nil, err
	}
	out := make([]Outcome, len(reqs))
	waits := make([]events.Position, len(reqs))
	sem := make(chan struct{}, limitedParallelism)
	inParallel(len(reqs), func(i int) {
		o := &out[i]
		later := &waits[i]
		if s.limited(p, reqs[i]) {
			sem <- struct{}{}
			defer func() { <-sem }()
			later = nil // in the views before the next limited item looks
		}
		o.State, o.Created, o.Err = s.schedule(ctx, p, reqs[i], later)
	})
	s.settleBatch(ctx, out, waits)
	return out, nil
}

// limited reports whether req counts against a limit the projections
// count: a child against its lineage's (Limits.MaxLineageTasks and
// MaxLineageDepth), a root against its customer's admission quotas or
// the usage checker (which should not see a whole batch at once either).
func (s *tasks) limited(p Principal, req ScheduleRequest) bool {
	if req.ParentID != "" {
		return true
	}
	customerID := p.CustomerID
	if p.IsOperator() {
		customerID = cmp.Or(req.CustomerID, events.DefaultCustomer)
	}
	q := s.admission.quota(customerID)
	return s.usage != nil && (q.MaxActiveRoots > 0 || q.MaxRootsPerMinute > 0 || s.admission.CheckerURL != "")
}

// RecordResults records each result as RecordResult would and answers in
// request order; one item's failure does not affect another's.
func (s *claims) RecordResults(ctx context.Context, p Principal, items []ResultItem) ([]Outcome, error) {
	if err := checkBatch(len(items)); err != nil {
		return nil, err
	}
	out := make([]Outcome, len(items))
	waits := make([]events.Position, len(items))
	inParallel(len(items), func(i int) {
		it, o := items[i], &out[i]
		o.State, o.Err = s.recordResult(ctx, p, it.TaskID, it.DeliveryID, it.Result, &waits[i])
	})
	s.settleBatch(ctx, out, waits)
	return out, nil
}

// settleBatch waits once, as settle would for each, until the projections
// have applied the highest position each shard's items need (waits[i]
// is the position item i needs the projections' tail to apply, settle's
// later; 0 for none), so every item's write is in the views when the
// batch answers. If they did not in time, each item that needed the wait
// fails with ErrUnavailable, as its single call would: its write is in
// the log.
func (s *core) settleBatch(ctx context.Context, out []Outcome, waits []events.Position) {
	shards := s.store.Shards()
	need := make([]events.Position, shards.N()) // by shard
	for _, w := range waits {
		if w > 0 {
			shard := w.Part(shards)
			need[shard] = max(need[shard], w)
		}
	}
	if !slices.ContainsFunc(need, func(p events.Position) bool { return p > 0 }) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	for _, pos := range need {
		if pos == 0 {
			continue
		}
		if err := s.applied.WaitFor(ctx, pos); err != nil {
			err = s.unavailable(err)
			for i := range out {
				if waits[i] > 0 {
					out[i].Err = err
				}
			}
			return
		}
	}
}

// ClaimBatch waits up to wait (as ClaimNext) until at least one task of
// queue can be claimed, claims up to limit (1 to api.MaxBatchItems) of those
// ready then for executorID, and returns them; none when nothing could be
// claimed in time. It fails only when no task was claimed and the log
// could not answer. opts are as ClaimNext's.
func (s *claims) ClaimBatch(ctx context.Context, p Principal, queue, executorID string, limit int, wait time.Duration, opts ...ClaimOption) ([]aggregate.State, error) {
	c, err := claimOf(queue, executorID, opts)
	if err != nil {
		return nil, err
	}
	if err := checkBatch(limit); err != nil {
		return nil, err
	}
	return s.claimWaiting(ctx, p, queue, c, limit, claimLinger, wait)
}
