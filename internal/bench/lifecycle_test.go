package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/ids"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
)

// The lifecycle benchmarks drive whole scheduler nodes (store, projection
// engine, alarm, service, HTTP handler) the way executors do. Each starts
// its own embedded server and node, and sets its figures next to the raw
// sync OCC append rate of this process run (rawRate).

// lifecycleRate is the in-process lifecycle throughput BenchmarkLifecycle
// measured in this process, or 0. BenchmarkScheduleToClaimable paces its
// load at half of it.
var lifecycleRate float64

// claimWait is the long poll of every ClaimNext the benchmarks make: short,
// so an idle claimer notices the end of a run quickly.
const claimWait = 100 * time.Millisecond

// phaseTimeout bounds one measured phase, so a stalled pipeline fails the
// benchmark instead of hanging until the test binary's timeout.
const phaseTimeout = 3 * time.Minute

// scaleMin returns n times BENCH_SCALE, but at least lo.
func scaleMin(n, lo int) int { return max(int(float64(n)*benchScale), lo) }

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rawRate returns the sync OCC append rate with 16 publishers measured in
// this process; if BenchmarkRawAppend did not run, it measures a quick one
// on nc first (and keeps it for the benchmarks after).
func rawRate(b *testing.B, nc *nats.Conn) float64 {
	b.Helper()
	if rawSyncRate > 0 {
		return rawSyncRate
	}
	st := openStore(b, nc, "lcraw")
	n := scale(10000)
	rate, err := rawAppend(b.Context(), st, n, concurrency)
	if err != nil {
		b.Fatal(err)
	}
	say("raw sync OCC append, %d publishers, %d msgs (BenchmarkRawAppend did not run): %.0f msgs/s", concurrency, n, rate)
	rawSyncRate = rate
	return rate
}

// startNode starts an embedded server in a fresh directory and a node on
// it with the default stream and subjects, runs the node and waits until
// its projections have caught up. Everything stops when b ends.
func startNode(b *testing.B) (*node.Node, *nats.Conn) {
	b.Helper()
	nc := startServer(b)
	n, err := node.New(b.Context(), node.Config{
		NC:     nc,
		Logger: zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger(),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			b.Errorf("node stopped with %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !n.Engine.CaughtUp() {
		select {
		case err := <-done:
			b.Fatalf("node stopped before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatal("node not caught up after 30s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	return n, nc
}

// scheduleRequest is a typical root task's request, as spec has it.
func scheduleRequest(i int, queue string) scheduler.ScheduleRequest {
	s := spec("", time.Time{})
	return scheduler.ScheduleRequest{
		CustomerID: customer(i), Signal: s.Signal, Repo: s.Repo, Queue: queue,
		Message: events.Message{ID: s.Message.ID, Content: s.Message.Content},
	}
}

// benchResult is what every claimer reports.
var benchResult = events.Result{Success: true, Summary: "fixed the retry backoff; opened a pull request"}

// pipeline is how a benchmark drives a node: in process through its
// Service or over HTTP through api.Client. worker picks the caller's own
// HTTP client (one keep-alive connection per worker).
type pipeline interface {
	schedule(ctx context.Context, worker int, req scheduler.ScheduleRequest) (taskID string, err error)
	claimNext(ctx context.Context, worker int, queue string, wait time.Duration) (taskID, deliveryID string, ok bool, err error)
	finish(ctx context.Context, worker int, taskID, deliveryID string) error
}

// inProcess drives a node's Service directly, as the operator.
type inProcess struct{ svc *scheduler.Service }

func (p inProcess) schedule(ctx context.Context, _ int, req scheduler.ScheduleRequest) (string, error) {
	st, _, err := p.svc.Schedule(ctx, scheduler.Operator, req)
	return st.TaskID, err
}

func (p inProcess) claimNext(ctx context.Context, worker int, queue string, wait time.Duration) (string, string, bool, error) {
	st, ok, err := p.svc.ClaimNext(ctx, scheduler.Operator, queue, fmt.Sprintf("exec-%d", worker), wait)
	return st.TaskID, st.Claim.DeliveryID, ok, err
}

func (p inProcess) finish(ctx context.Context, _ int, taskID, deliveryID string) error {
	_, err := p.svc.RecordResult(ctx, scheduler.Operator, taskID, deliveryID, benchResult)
	return err
}

// overHTTP drives a node through its handler behind a real HTTP server,
// one api.Client (with its own keep-alive connections) per worker.
type overHTTP struct{ clients []*api.Client }

// serveHTTP serves n's API on a local HTTP server and returns one client
// per worker; all are closed when b ends.
func serveHTTP(b *testing.B, n *node.Node, workers int) overHTTP {
	b.Helper()
	srv := httptest.NewServer(n.Handler)
	p := overHTTP{clients: make([]*api.Client, workers)}
	for i := range p.clients {
		p.clients[i] = api.NewClient(srv.URL, "")
	}
	b.Cleanup(func() {
		srv.Close()
		for _, c := range p.clients {
			c.HTTP.CloseIdleConnections()
		}
	})
	return p
}

func (p overHTTP) schedule(ctx context.Context, worker int, req scheduler.ScheduleRequest) (string, error) {
	t, _, err := p.clients[worker].Schedule(ctx, api.ScheduleRequest{
		CustomerID: req.CustomerID, RequestID: req.RequestID, Signal: req.Signal, Repo: req.Repo,
		Queue: req.Queue, Message: req.Message, RunAt: req.RunAt, TimeoutSeconds: req.TimeoutSeconds,
	})
	return t.ID, err
}

func (p overHTTP) claimNext(ctx context.Context, worker int, queue string, wait time.Duration) (string, string, bool, error) {
	t, ok, err := p.clients[worker].ClaimNext(ctx, queue, fmt.Sprintf("exec-%d", worker), wait)
	if !ok || err != nil {
		return "", "", false, err
	}
	if t.Claim == nil {
		return "", "", false, fmt.Errorf("claimed task %s has no claim", t.ID)
	}
	return t.ID, t.Claim.DeliveryID, true, nil
}

func (p overHTTP) finish(ctx context.Context, worker int, taskID, deliveryID string) error {
	_, err := p.clients[worker].RecordResult(ctx, taskID, api.ResultRequest{
		DeliveryID: deliveryID, Success: benchResult.Success, Summary: benchResult.Summary,
	})
	return err
}

// runLifecycle pushes n tasks through schedule → release → ready → claim →
// result with concurrency workers: the first half only schedule, as fast
// as they can; the other half only claim (ClaimNext) and report results.
// It returns the time from the first schedule to the last result and the
// scheduled task ids.
//
// Split workers make an open pipeline: scheduling, the alarm's releases
// and ready publishes, claims and results all run at once, so the figure
// is the rate of the slowest stage under the others' load. A worker that
// ran the whole loop would wait out the alarm's release-and-publish round
// trip for every task, idle, with at most 16 tasks in flight: that
// measures latency (16 / round trip), not throughput, and ClaimNext would
// hand it some other worker's task anyway.
func runLifecycle(ctx context.Context, p pipeline, n int) (lifecycleRun, error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	taskIDs := make([]string, n)
	var next, done, scheduled atomic.Int64
	var end, schedEnd atomic.Int64 // unix nanoseconds of the last result, of the last schedule
	g, ctx := errgroup.WithContext(ctx)
	start := time.Now()
	schedulers := concurrency / 2
	for w := range schedulers {
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return nil
				}
				id, err := p.schedule(ctx, w, scheduleRequest(i, "default"))
				if err != nil {
					return fmt.Errorf("schedule %d: %w", i, err)
				}
				taskIDs[i] = id
				if scheduled.Add(1) == int64(n) {
					schedEnd.Store(time.Now().UnixNano())
				}
			}
		})
	}
	for w := schedulers; w < concurrency; w++ {
		g.Go(func() error {
			for done.Load() < int64(n) {
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("%d of %d tasks done: %w", done.Load(), n, err)
				}
				id, dlv, ok, err := p.claimNext(ctx, w, "default", claimWait)
				if err != nil {
					return fmt.Errorf("claim next: %w", err)
				}
				if !ok {
					continue
				}
				if err := p.finish(ctx, w, id, dlv); err != nil {
					return fmt.Errorf("result of %s: %w", id, err)
				}
				if done.Add(1) == int64(n) {
					end.Store(time.Now().UnixNano())
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return lifecycleRun{}, err
	}
	return lifecycleRun{
		elapsed: time.Unix(0, end.Load()).Sub(start), scheduling: time.Unix(0, schedEnd.Load()).Sub(start), taskIDs: taskIDs,
	}, nil
}

// lifecycleRun is what runLifecycle measured.
type lifecycleRun struct {
	elapsed    time.Duration // first schedule to last result
	scheduling time.Duration // first schedule to last schedule
	taskIDs    []string
}

// lastSeq returns the last sequence of the node's event stream.
func lastSeq(b *testing.B, n *node.Node) uint64 {
	b.Helper()
	info, err := n.Store.Stream().Info(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	return info.State.LastSeq
}

// measureLifecycle runs n tasks through p and reports the rate and the
// JetStream writes it takes, as "lifecycle <name>: ...". It returns the
// rate in tasks/s.
func measureLifecycle(b *testing.B, nd *node.Node, p pipeline, name string, n int, raw float64) float64 {
	b.Helper()
	before := lastSeq(b, nd)
	run, err := runLifecycle(b.Context(), p, n)
	if err != nil {
		b.Fatalf("lifecycle %s: %v", name, err)
	}
	elapsed, taskIDs := run.elapsed, run.taskIDs
	rate := float64(n) / elapsed.Seconds()
	logged := float64(lastSeq(b, nd)-before) / float64(n)

	sample := taskIDs[n/2]
	hist, err := nd.Store.History(b.Context(), sample)
	if err != nil {
		b.Fatal(err)
	}
	types := make([]string, len(hist))
	for i, ev := range hist {
		types[i] = string(ev.Type())
	}
	if last := hist[len(hist)-1].Data; last.EventType() != events.TypeResultRecorded {
		b.Fatalf("sample task %s ends with %s, want ResultRecorded", sample, last.EventType())
	}
	writes := float64(len(hist) + 1) // the events and one ready publish
	wrate := rate * writes
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(rate, "tasks/s")
	b.ReportMetric(writes, "writes/task")
	b.ReportMetric(wrate, "writes/s")
	b.ReportMetric(raw, "raw-msgs/s")
	report(b, 100*wrate/raw, "pct-of-raw",
		"lifecycle %s: %.0f tasks/s (%.0f JetStream writes per task → %.0f writes/s = %.0f%% of raw sync append)",
		name, rate, writes, wrate, 100*wrate/raw)
	say("  %d tasks in %.2fs (all scheduled after %.2fs), %d schedulers + %d claimers; sample task: %s + 1 ready publish; log average %.2f events/task",
		n, elapsed.Seconds(), run.scheduling.Seconds(), concurrency/2, concurrency-concurrency/2, strings.Join(types, ", "), logged)
	return rate
}

// BenchmarkLifecycle measures full lifecycle throughput — schedule, the
// alarm's release, the ready publish, claim, result — on one node, in
// process through its Service and over HTTP through api.Client.
func BenchmarkLifecycle(b *testing.B) {
	nd, nc := startNode(b)
	raw := rawRate(b, nc)
	n := scaleMin(3000, 300)
	b.Run("in-process", func(b *testing.B) {
		lifecycleRate = measureLifecycle(b, nd, inProcess{nd.Service}, "in-process", n, raw)
	})
	b.Run("http", func(b *testing.B) {
		measureLifecycle(b, nd, serveHTTP(b, nd, concurrency), "http", n, raw)
	})
}

// pace returns a channel that receives n values at rate per second,
// evenly, catching up after a late tick, and is closed after the last one
// or when ctx ends.
func pace(ctx context.Context, n int, rate float64) <-chan struct{} {
	ch := make(chan struct{}, n)
	go func() {
		defer close(ch)
		tick := time.NewTicker(max(time.Duration(float64(time.Second)/rate), time.Millisecond))
		defer tick.Stop()
		start, sent := time.Now(), 0
		for sent < n {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for due := min(n, int(time.Since(start).Seconds()*rate)+1); sent < due; sent++ {
				ch <- struct{}{}
			}
		}
	}()
	return ch
}

// stamps records a time per task id.
type stamps struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (s *stamps) set(id string, t time.Time) {
	s.mu.Lock()
	s.m[id] = t
	s.mu.Unlock()
}

// pacedRun schedules n tasks at rate per second from concurrency/2
// workers and claims them (ClaimNext, then a result) from as many: freely
// when gate is nil, else one ClaimNext per value gate receives. It returns
// when n tasks have results, with each task's Schedule return time, its
// claim time and the duration of every successful ClaimNext.
func pacedRun(ctx context.Context, svc *scheduler.Service, n int, rate float64, gate <-chan struct{}) (scheduled, claimed map[string]time.Time, calls []time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	p := inProcess{svc}
	sched, clm := &stamps{m: make(map[string]time.Time, n)}, &stamps{m: make(map[string]time.Time, n)}
	var callsMu sync.Mutex
	var done atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	tokens := pace(ctx, n, rate)
	var i atomic.Int64
	for w := range concurrency / 2 {
		g.Go(func() error {
			for range tokens {
				id, err := p.schedule(ctx, w, scheduleRequest(int(i.Add(1)), "default"))
				if err != nil {
					return fmt.Errorf("schedule: %w", err)
				}
				sched.set(id, time.Now())
			}
			return ctx.Err()
		})
	}
	for w := concurrency / 2; w < concurrency; w++ {
		g.Go(func() error {
			for done.Load() < int64(n) {
				if gate != nil {
					select {
					case <-gate:
					case <-ctx.Done():
					}
				}
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("%d of %d tasks done: %w", done.Load(), n, err)
				}
				t0 := time.Now()
				id, dlv, ok, err := p.claimNext(ctx, w, "default", claimWait)
				t1 := time.Now()
				if err != nil {
					return fmt.Errorf("claim next: %w", err)
				}
				if !ok {
					continue
				}
				clm.set(id, t1)
				callsMu.Lock()
				calls = append(calls, t1.Sub(t0))
				callsMu.Unlock()
				if err := p.finish(ctx, w, id, dlv); err != nil {
					return fmt.Errorf("result of %s: %w", id, err)
				}
				done.Add(1)
			}
			return nil
		})
	}
	err = g.Wait()
	return sched.m, clm.m, calls, err
}

// waitQueued waits until the node shows at least n queued tasks in queue.
func waitQueued(b *testing.B, nd *node.Node, queue string, n int) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for nd.Engine.QueueCounts()[queue][aggregate.StatusQueued] < n {
		if time.Now().After(deadline) {
			b.Fatalf("only %v of %d tasks queued after a minute", nd.Engine.QueueCounts()[queue], n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkScheduleToClaimable measures, at about half the in-process
// lifecycle throughput, the time from Schedule returning to a claimer's
// ClaimNext succeeding for that task, and separately how long ClaimNext
// takes when a task is already waiting.
func BenchmarkScheduleToClaimable(b *testing.B) {
	nd, nc := startNode(b)
	raw := rawRate(b, nc)
	full := lifecycleRate
	if full == 0 {
		n := scaleMin(1000, 300)
		run, err := runLifecycle(b.Context(), inProcess{nd.Service}, n)
		if err != nil {
			b.Fatal(err)
		}
		full = float64(n) / run.elapsed.Seconds()
		say("lifecycle in-process, %d tasks (BenchmarkLifecycle did not run): %.0f tasks/s", n, full)
	}
	rate := full / 2

	// Claimers poll freely: every latency is schedule → release → ready
	// publish → fetch → claim append, with no queueing behind other work.
	n := scaleMin(2000, 300)
	scheduled, claimed, _, err := pacedRun(b.Context(), nd.Service, n, rate, nil)
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, n)
	early := 0
	for id, at := range claimed {
		d := at.Sub(scheduled[id])
		if d < 0 { // claimed before its Schedule call had returned
			early, d = early+1, 0
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(rate, "paced-tasks/s")
	b.ReportMetric(raw, "raw-msgs/s")
	p50, p99 := millis(percentile(lat, .50)), millis(percentile(lat, .99))
	b.ReportMetric(p50, "sched-to-claim-p50-ms")
	b.ReportMetric(p99, "sched-to-claim-p99-ms")
	say("schedule → claimable at %.0f tasks/s (half of %.0f; raw sync append %.0f msgs/s), %d tasks: p50 %.1f ms, p99 %.1f ms",
		rate, full, raw, len(lat), p50, p99)
	if early > 0 {
		say("  %d tasks were claimed before their Schedule call returned (counted as 0 ms)", early)
	}

	// A backlog of ready tasks, kept up by scheduling at the same pace as
	// claims are made, so every ClaimNext finds a task waiting.
	backlog := max(n/10, 100)
	var g errgroup.Group
	for w := range concurrency {
		g.Go(func() error {
			for i := w; i < backlog; i += concurrency {
				if _, err := (inProcess{nd.Service}).schedule(b.Context(), w, scheduleRequest(i, "default")); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	waitQueued(b, nd, "default", backlog)
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	_, _, calls, err := pacedRun(ctx, nd.Service, n, rate, pace(ctx, n+backlog, rate))
	if err != nil {
		b.Fatal(err)
	}
	slices.Sort(calls)
	q := []float64{millis(percentile(calls, .50)), millis(percentile(calls, .99)), millis(percentile(calls, .999))}
	b.ReportMetric(q[0], "claim-p50-ms")
	b.ReportMetric(q[1], "claim-p99-ms")
	b.ReportMetric(q[2], "claim-p999-ms")
	say("ClaimNext with a task ready (claim append + read-your-writes) at %.0f claims/s, %d calls: p50 %.2f ms, p99 %.2f ms, p999 %.2f ms",
		rate, len(calls), q[0], q[1], q[2])
}

// eventOf returns the first event of type typ in evs.
func eventOf(evs []events.Event, typ events.Type) (events.Event, bool) {
	for _, ev := range evs {
		if ev.Type() == typ {
			return ev, true
		}
	}
	return events.Event{}, false
}

// histories loads the history of every task, from concurrency goroutines.
func histories(ctx context.Context, nd *node.Node, taskIDs []string) ([][]events.Event, error) {
	out := make([][]events.Event, len(taskIDs))
	err := forEach(ctx, len(taskIDs), func(i int) (err error) {
		out[i], err = nd.Store.History(ctx, taskIDs[i])
		return err
	})
	return out, err
}

// waitTimers waits until timer queue t is empty.
func waitTimers(b *testing.B, nd *node.Node, t projections.Timer, within time.Duration) {
	b.Helper()
	deadline := time.Now().Add(within)
	for nd.Engine.TimerLen(t) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%d tasks still in the %s timer queue after %s", nd.Engine.TimerLen(t), t, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// latenessReport sorts lateness and reports its p50, p99 and max.
func latenessReport(b *testing.B, prefix, what string, late []time.Duration, raw float64) {
	b.Helper()
	slices.Sort(late)
	v := []float64{millis(percentile(late, .50)), millis(percentile(late, .99)), millis(late[len(late)-1])}
	b.ReportMetric(v[0], prefix+"-p50-ms")
	b.ReportMetric(v[1], prefix+"-p99-ms")
	b.ReportMetric(v[2], prefix+"-max-ms")
	say("%s, %d tasks: p50 %.1f ms, p99 %.1f ms, max %.1f ms (raw sync append %.0f msgs/s)", what, len(late), v[0], v[1], v[2], raw)
}

// BenchmarkReleaseLateness measures how late the alarm releases tasks
// scheduled for a time over the next 3 s (DeliveryPending's At − runAt),
// and how late it times out runs (TimedOut's At − deadline).
func BenchmarkReleaseLateness(b *testing.B) {
	nd, nc := startNode(b)
	raw := rawRate(b, nc)
	ctx := b.Context()
	svc := inProcess{nd.Service}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(raw, "raw-msgs/s")

	// Releases: runAt spread evenly over 3 s, starting a little after now
	// so that scheduling them all (faster than they fall due) is done in
	// time; tasks are scheduled in runAt order.
	n := scaleMin(2000, 200)
	const window, lead = 3 * time.Second, 200 * time.Millisecond
	t0 := time.Now().Add(lead)
	runAt := make([]time.Time, n)
	taskIDs := make([]string, n)
	var afterRunAt atomic.Int64
	if err := forEach(ctx, n, func(i int) error {
		runAt[i] = t0.Add(time.Duration(i) * window / time.Duration(n))
		req := scheduleRequest(i, "default")
		req.RunAt = &runAt[i]
		id, err := svc.schedule(ctx, 0, req)
		if time.Now().After(runAt[i]) {
			afterRunAt.Add(1)
		}
		taskIDs[i] = id
		return err
	}); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Until(t0.Add(window)))
	waitTimers(b, nd, projections.Release, 30*time.Second)
	hs, err := histories(ctx, nd, taskIDs)
	if err != nil {
		b.Fatal(err)
	}
	late := make([]time.Duration, n)
	for i, h := range hs {
		ev, ok := eventOf(h, events.TypeDeliveryPending)
		if !ok {
			b.Fatalf("task %s has no DeliveryPending", taskIDs[i])
		}
		late[i] = ev.At.Sub(runAt[i])
	}
	latenessReport(b, "release-late", fmt.Sprintf("release lateness (runAt over %s)", window), late, raw)
	if k := afterRunAt.Load(); k > 0 {
		say("  %d tasks were still being scheduled at their runAt", k)
	}

	// Timeouts: runs claimed with a 1 s timeout, never reported.
	m := scaleMin(200, 20)
	one := 1
	taskIDs = make([]string, m)
	if err := forEach(ctx, m, func(i int) error {
		req := scheduleRequest(i, "timeouts")
		req.TimeoutSeconds = &one
		id, err := svc.schedule(ctx, 0, req)
		taskIDs[i] = id
		return err
	}); err != nil {
		b.Fatal(err)
	}
	var claimed atomic.Int64
	var g errgroup.Group
	for w := range concurrency {
		g.Go(func() error {
			deadline := time.Now().Add(time.Minute)
			for claimed.Load() < int64(m) {
				if time.Now().After(deadline) {
					return fmt.Errorf("only %d of %d timeout tasks claimed in a minute", claimed.Load(), m)
				}
				if _, _, ok, err := svc.claimNext(ctx, w, "timeouts", claimWait); err != nil {
					return err
				} else if ok {
					claimed.Add(1)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second)
	waitTimers(b, nd, projections.Expire, 30*time.Second)
	if hs, err = histories(ctx, nd, taskIDs); err != nil {
		b.Fatal(err)
	}
	late = make([]time.Duration, m)
	for i, h := range hs {
		ev, ok := eventOf(h, events.TypeTimedOut)
		if !ok {
			b.Fatalf("task %s has no TimedOut", taskIDs[i])
		}
		late[i] = ev.At.Sub(ev.Data.(events.TimedOut).Deadline)
	}
	latenessReport(b, "timeout-late", "timeout lateness (timeoutSeconds 1)", late, raw)
}

// BenchmarkProjectionMemory measures the heap a projection engine holds
// per active (queued) task: each task folded from TaskScheduled,
// DeliveryPending and ReadyPublished through Engine.Apply, no server.
func BenchmarkProjectionMemory(b *testing.B) {
	n := scaleMin(100000, 10000)
	// Creation times spread over an hour, so the usage view keeps only the
	// last minute's admissions, as it would for tasks that accumulated.
	base := time.Now().Add(-time.Hour)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc

	eng := projections.New(nil, projections.Config{})
	seq := uint64(0)
	start := time.Now()
	for i := range n {
		taskID, dlv, cust := ids.New(), ids.New(), customer(i)
		at := base.Add(time.Duration(i) * time.Hour / time.Duration(n))
		for k, p := range []events.Payload{
			events.TaskScheduled{Spec: spec(taskID, at)},
			events.DeliveryPending{DeliveryID: dlv, Attempt: 1, NextAt: at},
			events.ReadyPublished{DeliveryID: dlv},
		} {
			data, err := events.Encode(events.Event{ID: ids.New(), TaskID: taskID, CustomerID: cust, Number: k + 1, At: at, Actor: "scheduler", Data: p})
			if err != nil {
				b.Fatal(err)
			}
			seq++
			eng.Apply(seq, data)
		}
	}
	elapsed := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	after := ms.HeapAlloc
	if got := eng.QueueCounts()["default"][aggregate.StatusQueued]; got != n {
		b.Fatalf("%d tasks queued, want %d", got, n)
	}
	runtime.KeepAlive(eng)

	per := float64(int64(after)-int64(before)) / float64(n)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(seq)/elapsed.Seconds(), "applied-events/s")
	report(b, per, "B/task", "projection memory: %.0f bytes per active task (%d queued tasks, heap +%.1f MB; encode+apply %.0f events/s)",
		per, n, float64(int64(after)-int64(before))/(1<<20), float64(seq)/elapsed.Seconds())
	if rawSyncRate > 0 {
		say("  (raw sync append in this run: %.0f msgs/s; this benchmark needs no server)", rawSyncRate)
	}
}
