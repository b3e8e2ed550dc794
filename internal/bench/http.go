package bench

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// The HTTP section measures the peers' protocol: enqueue, one call per
// task and in batches; a drain of a pre-filled queue by many claim loops
// and by a few batch loops; and a crowd of long polls waiting on one
// queue. The clients run in the bench's own process, on the same two
// cores as the server, as the peers' worker processes did.
const (
	enqueueClients = 50
	enqueueBatch   = 1000
	drainLoops     = 1000
	batchLoops     = 50
	batchMax       = 100
)

// Figures of the HTTP section.
const (
	FigEnqueueHTTP     = "HTTP enqueue, 50 clients, 1 task a call"
	FigEnqueueWrites   = "JetStream writes per HTTP enqueue, 50 clients"
	FigEnqueueBatch    = "HTTP enqueue, 1 client, 1,000 tasks a call"
	FigDrainHTTP       = "HTTP drain, 1,000 claims/next loops"
	FigDrainErrors     = "HTTP drain errors, 1,000 loops"
	FigDrainCPU        = "HTTP drain CPU per task, 1,000 loops"
	FigDrainGarbage    = "HTTP drain garbage per task, 1,000 loops"
	FigDrainBatch      = "HTTP drain, 50 batch loops (max 100)"
	FigDrainBatchCPU   = "HTTP batch drain CPU per task"
	FigDrainBatchGarb  = "HTTP batch drain garbage per task"
	FigWaitingPolls    = "long polls waiting on one queue"
	FigWaitingErrors   = "errors of the waiting long polls"
	FigWaitingClaimP99 = "released→claimed p99, polls waiting"
	FigWaitingMemory   = "server memory per waiting HTTP poll"
	FigWaiterMemory    = "service memory per waiting claimer (no HTTP)"
)

// httpClient is one keep-alive client with room for conns connections.
func httpClient(url string, conns int) *api.Client {
	return &api.Client{BaseURL: url, HTTP: &http.Client{Transport: &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: 90 * time.Second,
	}}}
}

// usage is the CPU and allocation of a phase of n tasks.
type usage struct {
	cpu     time.Duration
	alloc   uint64
	elapsed time.Duration
}

func measure(fn func() error) (usage, error) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu, start := processCPU(), time.Now()
	err := fn()
	u := usage{cpu: processCPU() - cpu, elapsed: time.Since(start)}
	runtime.ReadMemStats(&after)
	u.alloc = after.TotalAlloc - before.TotalAlloc
	return u, err
}

// httpSection runs the HTTP figures on nd, served on a loopback port.
func (r *run) httpSection(ctx context.Context, nd *node.Node) error {
	url, stop, err := serveHTTP(nd)
	if err != nil {
		return err
	}
	defer stop()
	n := r.scaled(20000, 200)
	if r.suffix == "" { // the raw ceilings do not depend on durability: once a run
		if err := r.httpCeiling(ctx, nd.Store.JetStream().Conn(), n); err != nil {
			return err
		}
	}

	// Enqueue: the tasks are due at once and no claimer waits, so each
	// schedule call releases its task and publishes its notification.
	before, err := writesSoFar(ctx, nd)
	if err != nil {
		return err
	}
	if _, err := r.httpPhase(url, enqueueClients, n, FigEnqueueHTTP, 15000, func(c *api.Client) error {
		return enqueueEach(ctx, c, "drain-single", n)
	}); err != nil {
		return err
	}
	after, err := writesSoFar(ctx, nd)
	if err != nil {
		return err
	}
	r.add(Figure{Section: "http", Name: FigEnqueueWrites, Value: float64(after-before) / float64(n), Unit: "writes"})
	if _, err := r.httpPhase(url, 1, n, FigEnqueueBatch, 50000, func(c *api.Client) error {
		return enqueueBatches(ctx, c, "drain-batch", n)
	}); err != nil {
		return err
	}
	for _, q := range []string{"drain-single", "drain-batch"} {
		if err := waitQueued(ctx, nd, q, n); err != nil {
			return err
		}
	}

	var errs atomic.Int64
	u, err := r.httpPhase(url, drainLoops, n, FigDrainHTTP, 12000, func(c *api.Client) error {
		return drainEach(ctx, c, "drain-single", n, &errs)
	})
	if err != nil {
		return err
	}
	r.add(atMost(Figure{Section: "http", Name: FigDrainErrors, Value: float64(errs.Load()), Unit: "errors"}, float64(errs.Load()), 0, "0"))
	r.addPerTask(FigDrainCPU, FigDrainGarbage, u, n)

	errs.Store(0)
	u, err = r.httpPhase(url, batchLoops, n, FigDrainBatch, 25000, func(c *api.Client) error {
		return drainBatches(ctx, c, "drain-batch", n, &errs)
	})
	if err != nil {
		return err
	}
	if errs.Load() > 0 {
		return fmt.Errorf("%s: %d errors", FigDrainBatch, errs.Load())
	}
	r.addPerTask(FigDrainBatchCPU, FigDrainBatchGarb, u, n)

	return r.waitingPolls(ctx, nd, url)
}

// httpPhase runs fn on a client with room for conns connections, prints
// its CPU per task and records its rate over n tasks as figure name, held
// to target tasks/s (a multiple of 1,000 or more).
func (r *run) httpPhase(url string, conns, n int, name string, target float64, fn func(*api.Client) error) (usage, error) {
	c := httpClient(url, conns)
	u, err := measure(func() error { return fn(c) })
	c.HTTP.CloseIdleConnections()
	if err != nil {
		return u, fmt.Errorf("%s: %w", name, err)
	}
	r.sayCPU(name, u.cpu, u.elapsed, n, "task")
	rate := float64(n) / u.elapsed.Seconds()
	f := Figure{Section: "http", Name: name, Value: rate, Unit: "tasks/s"}
	if ref := floorOf[name]; r.httpRates[ref.fig] > 0 {
		f.Ratio, f.RatioOf = rate/r.httpRates[ref.fig], ref.of
	}
	r.add(atLeast(f, rate, target, fmt.Sprintf("≥ %d,%03d tasks/s", int(target)/1000, int(target)%1000)))
	return u, nil
}

// addPerTask records a phase's CPU and garbage per task.
func (r *run) addPerTask(cpuName, garbageName string, u usage, n int) {
	r.add(Figure{Section: "http", Name: cpuName, Value: float64(u.cpu.Microseconds()) / float64(n), Unit: "µs/task"})
	r.add(Figure{Section: "http", Name: garbageName, Value: float64(u.alloc) / float64(n), Unit: "bytes/task"})
}

// enqueueEach schedules n tasks on queue from enqueueClients goroutines,
// one POST /v1/tasks each.
func enqueueEach(ctx context.Context, c *api.Client, queue string, n int) error {
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range enqueueClients {
		g.Go(func() error {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if _, _, err := c.Schedule(ctx, scheduleRequest(i, queue)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// enqueueBatches schedules n tasks on queue from one goroutine, in
// batches of enqueueBatch.
func enqueueBatches(ctx context.Context, c *api.Client, queue string, n int) error {
	for start := 0; start < n; start += enqueueBatch {
		reqs := make([]api.ScheduleRequest, min(enqueueBatch, n-start))
		for i := range reqs {
			reqs[i] = scheduleRequest(start+i, queue)
		}
		items, err := c.ScheduleBatch(ctx, reqs)
		if err != nil {
			return err
		}
		for _, it := range items {
			if err := it.Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitQueued waits until n tasks of queue are queued (released, their
// ready notification published).
func waitQueued(ctx context.Context, nd *node.Node, queue string, n int) error {
	queued := func() int { return nd.Engine.QueueCounts()[queue][aggregate.StatusQueued] }
	return waitFor(ctx, phaseTimeout, func() string { return fmt.Sprintf("queue %s: %d of %d tasks queued", queue, queued(), n) },
		func() bool { return queued() >= n })
}

// waitWaiting waits until n claimers wait on queue, or until gone (if
// not nil) is closed.
func waitWaiting(ctx context.Context, nd *node.Node, queue string, n int, gone <-chan struct{}) error {
	return waitFor(ctx, phaseTimeout, func() string {
		return fmt.Sprintf("queue %s: %d of %d claimers waiting", queue, nd.Service.Waiting(queue), n)
	}, func() bool {
		select {
		case <-gone:
			return true
		default:
			return nd.Service.Waiting(queue) >= n
		}
	})
}

// drain runs loops goroutines, each calling round until n tasks are
// done, counting every failed call in errs. round returns how many tasks
// it finished and how many calls failed. Once n are done, the calls still
// under way (long polls on the emptied queue, which would only add their
// wait) are cut short, and a call cut short is no failure.
func drain(ctx context.Context, loops, n int, errs *atomic.Int64, round func(ctx context.Context, executorID string) (done, failed int)) error {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	busy, finish := context.WithCancel(ctx)
	defer finish()
	var done atomic.Int64
	var wg sync.WaitGroup
	for w := range loops {
		wg.Go(func() {
			executorID := fmt.Sprintf("drain-%d", w)
			for busy.Err() == nil {
				d, f := round(busy, executorID)
				if busy.Err() == nil { // else cut short by the end
					errs.Add(int64(f))
				}
				if done.Add(int64(d)) >= int64(n) {
					finish()
				}
			}
		})
	}
	wg.Wait()
	if got := done.Load(); got < int64(n) {
		return fmt.Errorf("%d of %d tasks done: %w", got, n, ctx.Err())
	}
	return nil
}

// drainEach drains n tasks of queue with drainLoops loops of claims/next
// + result.
func drainEach(ctx context.Context, c *api.Client, queue string, n int, errs *atomic.Int64) error {
	return drain(ctx, drainLoops, n, errs, func(ctx context.Context, executorID string) (int, int) {
		t, ok, err := c.ClaimNext(ctx, queue, executorID, time.Second)
		switch {
		case err != nil:
			return 0, 1
		case !ok:
			return 0, 0
		}
		if _, err := c.RecordResult(ctx, t.ID, api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: true}); err != nil {
			return 0, 1
		}
		return 1, 0
	})
}

// drainBatches drains n tasks of queue with batchLoops loops of POST
// /v1/claims (max batchMax) + POST /v1/results.
func drainBatches(ctx context.Context, c *api.Client, queue string, n int, errs *atomic.Int64) error {
	return drain(ctx, batchLoops, n, errs, func(ctx context.Context, executorID string) (done, failed int) {
		tasks, err := c.ClaimBatch(ctx, queue, executorID, batchMax, time.Second)
		switch {
		case err != nil:
			return 0, 1
		case len(tasks) == 0:
			return 0, 0
		}
		items := make([]api.ResultItem, len(tasks))
		for i, t := range tasks {
			items[i] = api.ResultItem{TaskID: t.ID, ResultRequest: api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: true}}
		}
		res, err := c.RecordResults(ctx, items)
		if err != nil {
			return 0, 1
		}
		for _, it := range res {
			if it.Err() != nil {
				failed++
			} else {
				done++
			}
		}
		return done, failed
	})
}

// waitingPolls holds a crowd of long polls on one queue (10,000 at scale
// 1, fewer if this process may not open a socket for each) from a child
// process (startPolls), measures the server's memory per waiting poll,
// then schedules tasks one at a time and measures, from each task's own
// events, how long after its release it was claimed.
func (r *run) waitingPolls(ctx context.Context, nd *node.Node, url string) error {
	const queue = "crowd"
	polls := r.scaled(10000, 200)
	if fit := fdBudget(); polls > fit {
		r.say("  only %d file descriptors to spare: %d polls instead of %d", fit, fit, polls)
		polls = fit
	}
	if err := openQueue(ctx, nd, queue); err != nil {
		return err
	}
	settle()
	before := heapAndStacks()
	child, err := startPolls(url, queue, polls, r.log)
	if err != nil {
		return err
	}
	defer child.stop() // on an early return; its error then is the one returned
	if err := waitWaiting(ctx, nd, queue, polls, child.exited); err != nil {
		return err
	}
	select {
	case <-child.exited:
		return child.early()
	default:
	}
	perPoll := float64(int64(heapAndStacks())-int64(before)) / float64(polls)
	r.add(Figure{Section: "http", Name: FigWaitingPolls, Value: float64(polls), Unit: "polls"})
	r.add(Figure{Section: "http", Name: FigWaitingMemory, Value: perPoll, Unit: "bytes/poll"})

	if err := r.waitingClaimers(ctx, nd, polls); err != nil {
		return err
	}

	tasks := r.scaled(500, 20)
	ids := make([]string, 0, tasks)
	sched := httpClient(url, 1)
	defer sched.HTTP.CloseIdleConnections()
	for i := range tasks {
		t, _, err := sched.Schedule(ctx, scheduleRequest(i, queue))
		if err != nil {
			return err
		}
		ids = append(ids, t.ID)
		select { // one at a time: each is claimed before the next is due
		case <-child.claimed:
		case <-child.exited:
			return child.early()
		case <-time.After(phaseTimeout):
			return fmt.Errorf("task %s not claimed", t.ID)
		}
	}
	errs, err := child.stop()
	if err != nil {
		return err
	}
	var lat []time.Duration
	for _, id := range ids {
		hist, err := nd.Store.History(ctx, id)
		if err != nil {
			return err
		}
		// Ready is the release: the task is due at once, so its
		// TaskScheduled released it (a claimer waiting takes it from
		// there, handed off or through its notification).
		var ready, claim time.Time
		for _, ev := range hist {
			switch ev.Type() {
			case events.TypeTaskScheduled, events.TypeDeliveryPending:
				ready = ev.At
			case events.TypeClaimed:
				claim = ev.At
			}
		}
		if claim.IsZero() {
			return fmt.Errorf("task %s was not claimed", id)
		}
		lat = append(lat, claim.Sub(ready))
	}
	slices.Sort(lat)
	p99 := lat[len(lat)*99/100].Seconds() * 1000
	r.add(atMost(Figure{Section: "http", Name: FigWaitingClaimP99, Value: p99, Unit: "ms"}, p99, 5, "≤ 5 ms"))
	r.add(atMost(Figure{Section: "http", Name: FigWaitingErrors, Value: float64(errs), Unit: "errors"}, float64(errs), 0, "0"))
	return nil
}

// openQueue runs one task through queue, so that the server serves
// claimers there (it keeps nothing for a queue no task was scheduled on).
func openQueue(ctx context.Context, nd *node.Node, queue string) error {
	a := httpapi.NewLocal(nd.Service)
	if _, _, err := a.Schedule(ctx, scheduleRequest(0, queue)); err != nil {
		return err
	}
	t, ok, err := a.ClaimNext(ctx, queue, "opener", 30*time.Second)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("queue %s: the opening task was not claimed", queue)
	}
	_, err = a.RecordResult(ctx, t.ID, api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: true})
	return err
}

// waitingClaimers measures what a waiting claimer costs the service
// itself: n in-process ClaimNext calls on an empty queue, no HTTP.
func (r *run) waitingClaimers(ctx context.Context, nd *node.Node, n int) error {
	const queue = "idle"
	if err := openQueue(ctx, nd, queue); err != nil {
		return err
	}
	before := heapAndStacks()
	waitCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			nd.Service.ClaimNext(waitCtx, scheduler.Operator, queue, fmt.Sprintf("idle-%d", w), scheduledWait)
		})
	}
	defer func() {
		stop()
		wg.Wait()
	}()
	if err := waitWaiting(ctx, nd, queue, n, nil); err != nil {
		return err
	}
	perWaiter := float64(int64(heapAndStacks())-int64(before)) / float64(n)
	r.add(Figure{Section: "http", Name: FigWaiterMemory, Value: perWaiter, Unit: "bytes/claimer"})
	return nil
}

// scheduledWait is the waiting polls' long poll.
const scheduledWait = 30 * time.Second

// settle waits (at most 5 s) until the goroutines of earlier phases, such
// as the server's side of closed connections, have ended, so a memory
// baseline taken next does not shrink under the measurement.
func settle() {
	deadline := time.Now().Add(5 * time.Second)
	for n := runtime.NumGoroutine(); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m >= n {
			return
		}
		n = m
	}
}

// heapAndStacks is the live heap plus goroutine stacks after a collection.
func heapAndStacks() uint64 {
	runtime.GC() // twice: the first moves sync.Pool contents to the victim cache
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}
