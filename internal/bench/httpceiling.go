package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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
// phases, against a loopback server that decodes what it must and answers
// canned task resources. They are what net/http and JSON alone cost on
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

// httpCeiling measures the raw HTTP ceilings and floors for n tasks and
// keeps their rates for the phases' ratios.
func (r *run) httpCeiling(ctx context.Context, nc *nats.Conn, n int) error {
	r.httpRates = map[string]float64{}
	url, stop, err := serveCanned(nil)
	if err != nil {
		return err
	}
	defer stop()
	c := httpClient(url, drainLoops)
	defer c.HTTP.CloseIdleConnections()
	for _, p := range []struct {
		name string
		run  func() error
	}{
		{FigHTTPCeilingEnqueue, func() error { return rawEnqueue(ctx, c, n) }},
		{FigHTTPCeilingBatch, func() error { return enqueueBatches(ctx, c, "ceiling", n) }},
		{FigHTTPCeilingDrain, func() error { return rawDrain(ctx, c, n, drainEach) }},
		{FigHTTPCeilingBatchDrain, func() error { return rawDrain(ctx, c, n, drainBatches) }},
	} {
		u, err := r.rawPhase(p.name, n, p.run)
		if err != nil {
			return err
		}
		if p.name == FigHTTPCeilingDrain {
			r.add(Figure{Section: "http", Name: FigHTTPCeilingCPU, Value: float64(u.cpu.Microseconds()) / float64(n), Unit: "µs/task"})
		}
	}
	return r.httpFloors(ctx, nc, n)
}

// httpFloors measures the floors: the ceilings' requests, each making
// the appends a server must make for the tasks it carries.
func (r *run) httpFloors(ctx context.Context, nc *nats.Conn, n int) error {
	t, err := openTailed(ctx, nc, "rawhttp")
	if err != nil {
		return err
	}
	defer t.close()
	for _, p := range []struct {
		name    string
		appends int // a request's appends for each task it carries
		clients func(c *api.Client) error
	}{
		{FigEnqueueFloorOne, 1, func(c *api.Client) error { return rawEnqueue(ctx, c, n) }},
		{FigEnqueueFloor, enqueueWrites, func(c *api.Client) error { return rawEnqueue(ctx, c, n) }},
		// A claim appends Claimed, a result ResultRecorded.
		{FigBatchDrainFloor, 1, func(c *api.Client) error { return rawDrain(ctx, c, n, drainBatches) }},
	} {
		url, stop, err := serveCanned(func(ctx context.Context) error { return t.task(ctx, p.appends) })
		if err != nil {
			return err
		}
		c := httpClient(url, drainLoops)
		_, err = r.rawPhase(p.name, n, func() error {
			if err := p.clients(c); err != nil {
				return err
			}
			return t.caughtUp(ctx)
		})
		c.HTTP.CloseIdleConnections()
		stop()
		if err != nil {
			return err
		}
	}
	return nil
}

// rawPhase measures fn, a phase of n tasks against a canned server,
// prints its CPU and records its rate as figure name.
func (r *run) rawPhase(name string, n int, fn func() error) (usage, error) {
	u, err := measure(fn)
	if err != nil {
		return u, fmt.Errorf("%s: %w", name, err)
	}
	r.sayCPU(name, u.cpu, u.elapsed, n, "task")
	r.httpRates[name] = float64(n) / u.elapsed.Seconds()
	r.add(Figure{Section: "http", Name: name, Value: r.httpRates[name], Unit: "tasks/s"})
	return u, nil
}

// rawEnqueue sends n schedule requests from enqueueClients goroutines.
func rawEnqueue(ctx context.Context, c *api.Client, n int) error {
	req := scheduleRequest(0, "ceiling")
	var errs atomic.Int64
	err := drain(ctx, enqueueClients, n, &errs, func(ctx context.Context, _ string) (int, int) {
		if _, _, err := c.Schedule(ctx, req); err != nil {
			return 0, 1
		}
		return 1, 0
	})
	return failed(err, &errs)
}

// rawDrain drains n tasks from a canned server with drainEach or
// drainBatches, where any failed request is an error.
func rawDrain(ctx context.Context, c *api.Client, n int, loops func(context.Context, *api.Client, string, int, *atomic.Int64) error) error {
	var errs atomic.Int64
	return failed(loops(ctx, c, "ceiling", n, &errs), &errs)
}

// failed is err, or an error counting errs' failed requests.
func failed(err error, errs *atomic.Int64) error {
	if err == nil && errs.Load() > 0 {
		err = fmt.Errorf("%d failed requests", errs.Load())
	}
	return err
}

// serveCanned serves, on a loopback port, the routes the HTTP phases
// call with a canned running task. A single route reads the body and
// answers the task; a batch route decodes its body and answers the task
// for each item (POST /v1/claims: max of them). Before it answers, a
// request calls work, if set, once for each task it carries, at most
// batchParallel at once; a failure answers 500.
func serveCanned(work func(context.Context) error) (string, func(), error) {
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
	body, err := json.Marshal(task)
	if err != nil {
		return "", nil, err
	}
	items := func(n, status int) api.BatchAnswer {
		a := api.BatchAnswer{Results: make([]api.BatchItem, n)}
		for i := range a.Results {
			a.Results[i] = api.BatchItem{Status: status, Task: &task}
		}
		return a
	}
	handler := func(w http.ResponseWriter, req *http.Request) {
		var answer any
		n, err := 1, error(nil)
		switch req.URL.Path {
		case "/v1/tasks/batch":
			var b api.BatchScheduleRequest
			err = json.NewDecoder(req.Body).Decode(&b)
			n = len(b.Tasks)
			answer = items(n, http.StatusCreated)
		case "/v1/claims":
			var b api.ClaimBatchRequest
			err = json.NewDecoder(req.Body).Decode(&b)
			n = b.Max
			tasks := make([]api.Task, n)
			for i := range tasks {
				tasks[i] = task
			}
			answer = api.ClaimedTasks{Tasks: tasks}
		case "/v1/results":
			var b api.ResultsRequest
			err = json.NewDecoder(req.Body).Decode(&b)
			n = len(b.Results)
			answer = items(n, http.StatusOK)
		default:
			_, err = io.Copy(io.Discard, req.Body)
		}
		if err == nil && work != nil {
			g, ctx := errgroup.WithContext(req.Context())
			g.SetLimit(batchParallel)
			for range n {
				g.Go(func() error { return work(ctx) })
			}
			err = g.Wait()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if answer == nil {
			w.Write(body)
			return
		}
		json.NewEncoder(w).Encode(answer)
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
