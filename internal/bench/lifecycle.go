package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
)

// httpapi.Local is what an executor in the scheduler's process uses.
var _ executor.API = (*httpapi.Local)(nil)

// The lifecycle pipeline: schedulers goroutines schedule tasks as fast
// as they can while a pool of workers executors (executor.Worker, each
// running up to workerSlots tasks with a no-op handler) claims them and
// reports results. Split roles make an open pipeline: scheduling, the
// alarm's releases and ready publishes, claims and results all run at
// once, so the figure is the rate of the slowest stage under the others'
// load.
const (
	schedulers  = concurrency / 2
	workers     = concurrency / 2
	workerSlots = 8
	// pollWait is the workers' long poll: short, so a stopping pool
	// returns quickly.
	pollWait = time.Second
)

// scheduleRequest is a typical root task's request, as spec has it.
func scheduleRequest(i int, queue string) api.ScheduleRequest {
	s := spec("", time.Time{})
	return api.ScheduleRequest{
		CustomerID: customer(i), Signal: s.Signal, Repo: s.Repo, Queue: queue,
		Message: events.Message{ID: s.Message.ID, Content: s.Message.Content},
	}
}

// noop is the workers' handler: the task's work takes no time.
func noop(context.Context, *executor.Run) (string, error) { return "done", nil }

// counted is an API that calls done after each recorded result.
type counted struct {
	executor.API
	done func()
}

func (c counted) RecordResult(ctx context.Context, id string, res api.ResultRequest) (api.Task, error) {
	t, err := c.API.RecordResult(ctx, id, res)
	if err == nil {
		c.done()
	}
	return t, err
}

// lifecycleRun is what runLifecycle measured.
type lifecycleRun struct {
	elapsed    time.Duration // first schedule to last result
	scheduling time.Duration // first schedule to last schedule
	taskIDs    []string
}

// runLifecycle pushes n tasks through schedule → release → ready → claim →
// result: scheduler i calls apiOf(i), worker i is an executor on
// apiOf(schedulers+i). It returns when n results are recorded.
func (r *run) runLifecycle(ctx context.Context, n int, apiOf func(i int) executor.API) (lifecycleRun, error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	var finished, endNanos atomic.Int64
	all := make(chan struct{})
	done := func() {
		if finished.Add(1) == int64(n) {
			endNanos.Store(time.Now().UnixNano())
			close(all)
		}
	}
	logger := zerolog.New(r.log).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWorkers()
	for w := range workers {
		wk, err := executor.NewWorker(executor.WorkerConfig{
			API: counted{apiOf(schedulers + w), done}, Queue: "default", ExecutorID: fmt.Sprintf("bench-%d", w),
			Concurrency: workerSlots, PollWait: pollWait, Logger: logger,
		}, noop)
		if err != nil {
			return lifecycleRun{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := wk.Run(wctx); err != nil {
				logger.Error().Err(err).Msg("worker stopped")
			}
		}()
	}

	taskIDs := make([]string, n)
	var next atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	for s := range schedulers {
		a := apiOf(s)
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return nil
				}
				t, _, err := a.Schedule(gctx, scheduleRequest(i, "default"))
				if err != nil {
					return fmt.Errorf("schedule %d: %w", i, err)
				}
				taskIDs[i] = t.ID
			}
		})
	}
	if err := g.Wait(); err != nil {
		return lifecycleRun{}, err
	}
	scheduling := time.Since(start)
	select {
	case <-all:
	case <-ctx.Done():
		return lifecycleRun{}, fmt.Errorf("%d of %d tasks done: %w", finished.Load(), n, ctx.Err())
	}
	return lifecycleRun{elapsed: time.Unix(0, endNanos.Load()).Sub(start), scheduling: scheduling, taskIDs: taskIDs}, nil
}

// lastSeq returns the last sequence of the node's event stream.
func lastSeq(ctx context.Context, nd *node.Node) (uint64, error) {
	info, err := nd.Store.Stream().Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// writesSoFar is how many messages the node's log and its ready stream
// have taken.
func writesSoFar(ctx context.Context, nd *node.Node) (uint64, error) {
	log, err := lastSeq(ctx, nd)
	if err != nil {
		return 0, err
	}
	rs, err := nd.Store.JetStream().Stream(ctx, events.ReadyStreamName(nd.Store.Stream().CachedInfo().Config.Name))
	if err != nil {
		return 0, err
	}
	info, err := rs.Info(ctx)
	if err != nil {
		return 0, err
	}
	return log + info.State.LastSeq, nil
}

// lifecycleResult is one measured lifecycle.
type lifecycleResult struct {
	n          int     // tasks
	rate       float64 // tasks/s
	schedRate  float64 // schedule calls/s while it ran
	writes     float64 // JetStream writes per task
	writesRate float64 // rate × writes
	natsMsgs   float64 // NATS messages per task on the node's connection, in and out
	use        usage   // CPU and allocations of the whole phase
}

// measureLifecycle runs n tasks through apiOf and counts the JetStream
// writes a task takes: the messages its log and ready stream took, over
// n.
func (r *run) measureLifecycle(ctx context.Context, nd *node.Node, name string, n int, apiOf func(int) executor.API) (lifecycleResult, error) {
	before, err := writesSoFar(ctx, nd)
	if err != nil {
		return lifecycleResult{}, err
	}
	nc := nd.Store.JetStream().Conn()
	statsBefore := nc.Stats()
	var lr lifecycleRun
	use, err := measure(func() (err error) {
		lr, err = r.runLifecycle(ctx, n, apiOf)
		return err
	})
	if err != nil {
		return lifecycleResult{}, fmt.Errorf("%s: %w", name, err)
	}
	statsAfter := nc.Stats()
	after, err := writesSoFar(ctx, nd)
	if err != nil {
		return lifecycleResult{}, err
	}
	sample := lr.taskIDs[n/2]
	hist, err := nd.Store.History(ctx, sample)
	if err != nil {
		return lifecycleResult{}, err
	}
	if len(hist) == 0 || hist[len(hist)-1].Type() != events.TypeResultRecorded {
		return lifecycleResult{}, fmt.Errorf("%s: sample task %s does not end with ResultRecorded", name, sample)
	}
	types := make([]string, len(hist))
	for i, ev := range hist {
		types[i] = string(ev.Type())
	}
	res := lifecycleResult{
		n:         n,
		rate:      float64(n) / lr.elapsed.Seconds(),
		schedRate: float64(n) / lr.scheduling.Seconds(),
		writes:    float64(after-before) / float64(n),
		natsMsgs:  float64(statsAfter.InMsgs+statsAfter.OutMsgs-statsBefore.InMsgs-statsBefore.OutMsgs) / float64(n),
		use:       use,
	}
	res.writesRate = res.rate * res.writes
	r.say("  %s: %d tasks in %.2fs (all scheduled after %.2fs), %d schedulers, %d workers × %d slots; %.2f writes/task (log and ready stream); sample: %s",
		name, n, lr.elapsed.Seconds(), lr.scheduling.Seconds(), schedulers, workers, workerSlots,
		res.writes, strings.Join(types, ", "))
	r.sayCPU(name, use.cpu, lr.elapsed, n, "task")
	return res, nil
}

// serveHTTP serves the node's API on a loopback port and returns its
// base URL and a function that stops it once the requests in progress
// have finished.
func serveHTTP(nd *node.Node) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: nd.Handler, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	// Shutdown waits for requests in progress: a long poll the workers
	// gave up on must not linger and claim the next phase's tasks.
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-served
	}, nil
}

// lifecycle measures full lifecycle throughput over HTTP (every
// scheduler and worker with its own keep-alive client) and through the
// Go SDK in process (httpapi.Local), after a short warm-up.
func (r *run) lifecycle(ctx context.Context, nd *node.Node) error {
	local := httpapi.NewLocal(nd.Service)
	inProcess := func(int) executor.API { return local }
	if _, err := r.runLifecycle(ctx, r.scaled(200, 20), inProcess); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	url, stop, err := serveHTTP(nd)
	if err != nil {
		return err
	}
	clients := make([]*api.Client, schedulers+workers)
	for i := range clients {
		clients[i] = api.NewClient(url, "")
	}
	httpRes, err := r.measureLifecycle(ctx, nd, "HTTP", r.scaled(5000, 100), func(i int) executor.API { return clients[i] })
	for _, c := range clients {
		c.HTTP.CloseIdleConnections()
	}
	stop()
	if err != nil {
		return err
	}

	sdk, err := r.measureLifecycle(ctx, nd, "Go SDK", r.scaled(10000, 100), inProcess)
	if err != nil {
		return err
	}
	r.sdkRate, r.schedRate = sdk.rate, sdk.schedRate
	r.add(atLeast(Figure{Section: "lifecycle", Name: FigLifecycleSDK, Value: sdk.rate, Unit: "tasks/s",
		Ratio: sdk.writesRate / r.asyncRate, RatioOf: ratioAsync}, sdk.writesRate/r.asyncRate, 0.5, "≥ 0.50× raw async"))
	for _, f := range []struct {
		name       string
		goroutines int
	}{{FigLifecycleFloor, floorGoroutines}, {FigLifecycleFloorWide, wideGoroutines}} {
		var floor float64
		u, err := measure(func() (err error) {
			floor, err = lifecycleFloor(ctx, nd.Store.JetStream().Conn(), sdk.n, f.goroutines)
			return err
		})
		if err != nil {
			return err
		}
		r.sayCPU(f.name, u.cpu, u.elapsed, sdk.n, "task")
		r.add(Figure{Section: "lifecycle", Name: f.name, Value: floor, Unit: "tasks/s",
			Ratio: floor * lifecycleWrites / r.asyncRate, RatioOf: ratioAsync})
	}
	r.add(Figure{Section: "lifecycle", Name: FigWritesPerTask, Value: sdk.writes, Unit: "writes"})
	r.add(Figure{Section: "lifecycle", Name: FigNATSMessagesPerTask, Value: sdk.natsMsgs, Unit: "messages"})
	r.add(Figure{Section: "lifecycle", Name: FigLifecycleCPU, Value: float64(sdk.use.cpu.Microseconds()) / float64(sdk.n), Unit: "µs/task"})
	r.add(Figure{Section: "lifecycle", Name: FigLifecycleGarbage, Value: float64(sdk.use.alloc) / float64(sdk.n), Unit: "bytes/task"})
	r.add(Figure{Section: "lifecycle", Name: FigLifecycleHTTP, Value: httpRes.rate, Unit: "tasks/s",
		Ratio: httpRes.writesRate / r.asyncRate, RatioOf: ratioAsync})
	rel := httpRes.rate / sdk.rate
	r.add(atLeast(Figure{Section: "lifecycle", Name: FigHTTPvsSDK, Value: rel, Unit: "×", Ratio: rel, RatioOf: ratioSDK},
		rel, 0.5, "≥ 0.50× Go SDK"))
	return nil
}
