package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// The raw HTTP ceilings: the same clients and requests as the HTTP
// phases, against a loopback server that decodes each body and answers
// canned task resources it encodes (serveCanned). They are what net/http and JSON alone cost on
// this machine. The floors add what any server must write for those
// requests (appendTask, on a stream an ordered consumer tails as the
// projections do). A phase's figure is printed as a ratio to its own
// ceiling or floor (floorOf).
const (
	FigHTTPCeilingEnqueue    = "raw HTTP, 50 clients, 1 request a task"
	FigHTTPCeilingBatch      = "raw HTTP, 1 client, 1,000 tasks a call"
	FigHTTPCeilingDrain      = "raw HTTP, 1,000 loops, 2 requests a task"
	FigHTTPCeilingCPU        = "raw HTTP CPU per task, 1,000 loops"
	FigHTTPCeilingBatchDrain = "raw HTTP, 50 batch loops (max 100)"
	FigEnqueueFloorOne       = "raw HTTP + 1 append + tail a request, 50 clients"
	FigEnqueueFloor          = "raw HTTP + 3 appends + tail a request, 50 clients"
	FigBatchDrainFloor       = "raw HTTP + 2 appends + tail a task, 50 batch loops"

	// enqueueWrites is what an enqueue of a task due at once writes
	// when no claimer waits for it, one after the other: its
	// TaskScheduled, its ready notification, its ReadyPublished. The
	// enqueue phase measures its own (FigEnqueueWrites). Any durable
	// enqueue writes at least the first (FigEnqueueFloorOne).
	enqueueWrites = 3
	// batchParallel is how many items of a batch the server runs at once
	// (scheduler.batchParallelism).
	batchParallel = 256
)

// floorOf is, for each HTTP phase, the ceiling or floor figure its ratio
// is taken to and the name the table gives that reference.
var floorOf = map[string]struct{ fig, of string }{
	FigEnqueueHTTP:  {FigEnqueueFloor, "raw HTTP + 3 appends"},
	FigEnqueueBatch: {FigHTTPCeilingBatch, "raw HTTP 1,000 a call"},
	FigDrainHTTP:    {FigHTTPCeilingDrain, "raw HTTP 1,000 loops"},
	FigDrainBatch:   {FigBatchDrainFloor, "raw HTTP + 2 appends"},
}

// httpCeiling measures the raw HTTP ceilings and floors for n tasks,
// each phase against a canned server of its own, and keeps their rates
// for the phases' ratios.
func (r *run) httpCeiling(ctx context.Context, nc *nats.Conn, n int) error {
	r.httpRates = map[string]float64{}
	t, err := openTailed(ctx, nc, "rawhttp")
	if err != nil {
		return err
	}
	defer t.close()
	for _, p := range []struct {
		name    string
		appends int // a request's appends for each task it carries
		clients func(context.Context, *api.Client) error
	}{
		{FigHTTPCeilingEnqueue, 0, func(ctx context.Context, c *api.Client) error { return enqueueEach(ctx, c, "ceiling", n) }},
		{FigHTTPCeilingBatch, 0, func(ctx context.Context, c *api.Client) error { return enqueueBatches(ctx, c, "ceiling", n) }},
		{FigHTTPCeilingDrain, 0, func(ctx context.Context, c *api.Client) error { return rawDrain(ctx, c, n, drainEach) }},
		{FigHTTPCeilingBatchDrain, 0, func(ctx context.Context, c *api.Client) error { return rawDrain(ctx, c, n, drainBatches) }},
		{FigEnqueueFloorOne, 1, func(ctx context.Context, c *api.Client) error { return enqueueEach(ctx, c, "ceiling", n) }},
		{FigEnqueueFloor, enqueueWrites, func(ctx context.Context, c *api.Client) error { return enqueueEach(ctx, c, "ceiling", n) }},
		// A claim appends Claimed, a result ResultRecorded.
		{FigBatchDrainFloor, 1, func(ctx context.Context, c *api.Client) error { return rawDrain(ctx, c, n, drainBatches) }},
	} {
		if err := r.rawPhase(ctx, t, n, p.name, p.appends, p.clients); err != nil {
			return err
		}
	}
	return nil
}

// rawPhase measures clients, a phase of n tasks, against a canned server
// whose requests make appends appends on t for each task they carry,
// prints its CPU and records its rate as figure name; the phase ends when
// t's tail has read every append.
func (r *run) rawPhase(ctx context.Context, t *tailed, n int, name string, appends int, clients func(context.Context, *api.Client) error) error {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	var work func(context.Context) error
	if appends > 0 {
		work = func(ctx context.Context) error { return t.task(ctx, appends) }
	}
	url, stop, err := serveCanned(n, work)
	if err != nil {
		return err
	}
	defer stop()
	c := httpClient(url, drainLoops)
	defer c.HTTP.CloseIdleConnections()
	u, err := measure(func() error {
		if err := clients(ctx, c); err != nil {
			return err
		}
		return t.caughtUp(ctx)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	r.sayCPU(name, u.cpu, u.elapsed, n, "task")
	r.httpRates[name] = float64(n) / u.elapsed.Seconds()
	r.add(Figure{Section: "http", Name: name, Value: r.httpRates[name], Unit: "tasks/s"})
	if name == FigHTTPCeilingDrain {
		r.add(Figure{Section: "http", Name: FigHTTPCeilingCPU, Value: float64(u.cpu.Microseconds()) / float64(n), Unit: "µs/task"})
	}
	return nil
}

// rawDrain drains n tasks from a canned server with drainEach or
// drainBatches, where any failed request is an error.
func rawDrain(ctx context.Context, c *api.Client, n int, loops func(context.Context, *api.Client, string, int, *atomic.Int64) error) error {
	var errs atomic.Int64
	err := loops(ctx, c, "ceiling", n, &errs)
	if err == nil && errs.Load() > 0 {
		err = fmt.Errorf("%d failed requests", errs.Load())
	}
	return err
}

// serveCanned serves, on a loopback port, the routes the HTTP phases
// call, as net/http and JSON alone would: each route decodes its body
// and answers with JSON it encodes, a canned running task for each task
// the request carries (POST /v1/tasks/batch and /v1/results: one an item;
// POST /v1/claims: up to max; the others: one). The claim routes hand out
// claimable tasks in all, then answer 204 after the request's wait, as a
// long poll on an empty queue does. Before it answers, a request calls
// work, if set, once for each task it carries, at most batchParallel at
// once; a failure answers 500.
func serveCanned(claimable int, work func(context.Context) error) (string, func(), error) {
	now, id := time.Now().UTC(), events.NewID()
	s := spec(id, now)
	task := api.Task{
		ID: id, RootID: id, CustomerID: customer(0), RequestID: s.RequestID, Queue: "ceiling",
		Signal: &s.Signal, Repo: s.Repo, Message: s.Message, Status: string(aggregate.StatusRunning),
		CreatedAt: now, RunAt: now, StartedAt: now, TimeoutSeconds: s.TimeoutSeconds, Deadline: now.Add(time.Hour),
		Delivery: &api.Delivery{ID: events.NewID(), Attempt: 1}, Mailbox: api.Mailbox{Count: 1},
		Version: 4,
	}
	task.Claim = &api.Claim{DeliveryID: task.Delivery.ID, ExecutorID: "drain-0"}
	var left atomic.Int64
	left.Store(int64(claimable))
	claim := func(want int) int { // takes up to want of the claimable tasks left
		for {
			l := left.Load()
			k := min(l, int64(want))
			if k <= 0 || left.CompareAndSwap(l, l-k) {
				return int(max(k, 0))
			}
		}
	}
	items := func(n, status int) api.BatchAnswer {
		a := api.BatchAnswer{Results: make([]api.BatchItem, n)}
		for i := range a.Results {
			a.Results[i] = api.BatchItem{Status: status, Task: &task}
		}
		return a
	}
	handler := func(w http.ResponseWriter, req *http.Request) {
		dec := json.NewDecoder(req.Body)
		var answer any = task
		var err error
		var wait float64 // a claim's long poll, in seconds
		n := 1
		switch req.URL.Path {
		case "/v1/tasks":
			var b api.ScheduleRequest
			err = dec.Decode(&b)
		case "/v1/tasks/batch":
			var b api.BatchScheduleRequest
			err = dec.Decode(&b)
			n = len(b.Tasks)
			answer = items(n, http.StatusCreated)
		case "/v1/claims/next":
			var b api.ClaimNextRequest
			err = dec.Decode(&b)
			n, wait = claim(1), b.WaitSeconds
		case "/v1/claims":
			var b api.ClaimBatchRequest
			err = dec.Decode(&b)
			n, wait = claim(b.Max), b.WaitSeconds
			tasks := make([]api.Task, n)
			for i := range tasks {
				tasks[i] = task
			}
			answer = api.ClaimedTasks{Tasks: tasks}
		case "/v1/results":
			var b api.ResultsRequest
			err = dec.Decode(&b)
			n = len(b.Results)
			answer = items(n, http.StatusOK)
		default: // POST /v1/tasks/{id}/result
			var b api.ResultRequest
			err = dec.Decode(&b)
		}
		if err == nil && n == 0 { // the queue is empty: wait as a long poll does
			select {
			case <-req.Context().Done():
			case <-time.After(time.Duration(wait * float64(time.Second))):
			}
		}
		if err == nil && work != nil {
			g, ctx := errgroup.WithContext(req.Context())
			g.SetLimit(batchParallel)
			for range n {
				g.Go(func() error { return work(ctx) })
			}
			err = g.Wait()
		}
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case n == 0:
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(answer)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(handler)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	return "http://" + ln.Addr().String(), func() {
		srv.Close()
		<-served
	}, nil
}
