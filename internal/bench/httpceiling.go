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

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// The raw HTTP ceiling: the same clients and the same number of requests
// per task as the enqueue and drain phases, against a loopback server
// that reads each body and answers a fixed task resource. It is what
// net/http and JSON alone cost on this machine, so the phases' figures
// say how much of their time the scheduler itself takes.
const (
	FigHTTPCeilingEnqueue = "raw HTTP, 50 clients, 1 request a task"
	FigHTTPCeilingDrain   = "raw HTTP, 1,000 loops, 2 requests a task"
	FigHTTPCeilingCPU     = "raw HTTP CPU per task, 1,000 loops"
	FigEnqueueFloor       = "raw HTTP + 3 appends a request, 50 clients"

	// enqueueWrites is what an enqueue of a task due at once writes
	// when no claimer waits for it, one after the other: its
	// TaskScheduled, its ready notification, its ReadyPublished. The
	// enqueue phase measures its own (FigEnqueueWrites).
	enqueueWrites = 3

	ratioHTTPDrain = "raw HTTP 1,000 loops"
	ratioEnqueue   = "raw HTTP + 3 appends"
)

// httpCeiling measures the raw HTTP rates for n tasks and keeps them for
// the phases' ratios.
func (r *run) httpCeiling(ctx context.Context, nc *nats.Conn, n int) error {
	url, stop, err := serveCanned(nil)
	if err != nil {
		return err
	}
	defer stop()
	if r.httpEnqueueRate, err = r.rawEnqueue(ctx, url, n, FigHTTPCeilingEnqueue); err != nil {
		return err
	}
	r.add(Figure{Section: "http", Name: FigHTTPCeilingEnqueue, Value: r.httpEnqueueRate, Unit: "tasks/s"})
	if err := r.enqueueFloor(ctx, nc, n); err != nil {
		return err
	}

	c := httpClient(url, drainLoops)
	var errs atomic.Int64
	u, err := measure(func() error {
		return drain(ctx, drainLoops, n, &errs, func(ctx context.Context, executorID string) (int, int) {
			t, _, err := c.ClaimNext(ctx, "ceiling", executorID, time.Second)
			if err != nil {
				return 0, 1
			}
			if _, err := c.RecordResult(ctx, t.ID, api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: true}); err != nil {
				return 0, 1
			}
			return 1, 0
		})
	})
	c.HTTP.CloseIdleConnections()
	if err == nil && errs.Load() > 0 {
		err = fmt.Errorf("%d failed requests", errs.Load())
	}
	if err != nil {
		return fmt.Errorf("%s: %w", FigHTTPCeilingDrain, err)
	}
	r.sayCPU(FigHTTPCeilingDrain, u.cpu, u.elapsed, n, "task")
	r.httpDrainRate = float64(n) / u.elapsed.Seconds()
	r.add(Figure{Section: "http", Name: FigHTTPCeilingDrain, Value: r.httpDrainRate, Unit: "tasks/s"})
	r.add(Figure{Section: "http", Name: FigHTTPCeilingCPU, Value: float64(u.cpu.Microseconds()) / float64(n), Unit: "µs/task"})
	return nil
}

// rawEnqueue sends n schedule requests to url from enqueueClients
// goroutines, prints their CPU as figure name's and returns requests/s.
func (r *run) rawEnqueue(ctx context.Context, url string, n int, name string) (float64, error) {
	req := scheduleRequest(0, "ceiling")
	c := httpClient(url, enqueueClients)
	defer c.HTTP.CloseIdleConnections()
	u, err := measure(func() error {
		var errs atomic.Int64
		err := drain(ctx, enqueueClients, n, &errs, func(ctx context.Context, _ string) (int, int) {
			if _, _, err := c.Schedule(ctx, req); err != nil {
				return 0, 1
			}
			return 1, 0
		})
		if err == nil && errs.Load() > 0 {
			err = fmt.Errorf("%d failed requests", errs.Load())
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	r.sayCPU(name, u.cpu, u.elapsed, n, "task")
	return float64(n) / u.elapsed.Seconds(), nil
}

// enqueueFloor measures the least an enqueue can cost: the raw HTTP
// ceiling's requests, each of which makes a task's enqueueWrites appends
// (appendTask) and nothing else.
func (r *run) enqueueFloor(ctx context.Context, nc *nats.Conn, n int) error {
	st, err := openStore(ctx, nc, "rawenqueue", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	data, err := sampleEvent()
	if err != nil {
		return err
	}
	url, stop, err := serveCanned(func(ctx context.Context) error {
		return appendTask(ctx, st, data, enqueueWrites)
	})
	if err != nil {
		return err
	}
	defer stop()
	if r.enqueueFloorRate, err = r.rawEnqueue(ctx, url, n, FigEnqueueFloor); err != nil {
		return err
	}
	r.add(Figure{Section: "http", Name: FigEnqueueFloor, Value: r.enqueueFloorRate, Unit: "tasks/s"})
	return nil
}

// serveCanned serves, on a loopback port, a handler that reads the whole
// body, calls work if it is set (a failure answers 500) and answers 200
// with a running task's resource for any request.
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		if work != nil {
			if err := work(req.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})}
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
