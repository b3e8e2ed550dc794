package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
)

// claimWait is the long poll of the latency claimers: short, so an idle
// claimer notices the end of a run quickly.
const claimWait = 100 * time.Millisecond

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

// pacedRun schedules n tasks at rate per second from schedulers
// goroutines and claims them (ClaimNext, then a result) from workers
// goroutines: freely when gate is nil, else one ClaimNext per value gate
// receives. It returns when n tasks have results, with each task's
// Schedule return time, its claim time and the duration of every
// successful ClaimNext.
func pacedRun(ctx context.Context, a executor.API, n int, rate float64, gate <-chan struct{}) (scheduled, claimed map[string]time.Time, calls []time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	sched, clm := &stamps{m: make(map[string]time.Time, n)}, &stamps{m: make(map[string]time.Time, n)}
	var callsMu sync.Mutex
	var done, next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	tokens := pace(ctx, n, rate)
	for range schedulers {
		g.Go(func() error {
			for range tokens {
				t, _, err := a.Schedule(ctx, scheduleRequest(int(next.Add(1)), "default"))
				if err != nil {
					return fmt.Errorf("schedule: %w", err)
				}
				sched.set(t.ID, time.Now())
			}
			return ctx.Err()
		})
	}
	for w := range workers {
		executor := fmt.Sprintf("lat-%d", w)
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
				t, ok, err := a.ClaimNext(ctx, "default", executor, claimWait)
				t1 := time.Now()
				if err != nil {
					return fmt.Errorf("claim next: %w", err)
				}
				if !ok {
					continue
				}
				clm.set(t.ID, t1)
				callsMu.Lock()
				calls = append(calls, t1.Sub(t0))
				callsMu.Unlock()
				if _, err := a.RecordResult(ctx, t.ID, api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: true, Summary: "done"}); err != nil {
					return fmt.Errorf("result of %s: %w", t.ID, err)
				}
				done.Add(1)
			}
			return nil
		})
	}
	err = g.Wait()
	return sched.m, clm.m, calls, err
}

// waitFor polls cond every few milliseconds until it holds, for at most
// within.
func waitFor(ctx context.Context, within time.Duration, what func() string, cond func() bool) error {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s after %s", what(), within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// quantiles sorts d and returns its p50, p99 and p999 in milliseconds.
func quantiles(d []time.Duration) (p50, p99, p999 float64) {
	slices.Sort(d)
	return millis(percentile(d, .50)), millis(percentile(d, .99)), millis(percentile(d, .999))
}

// latencyRate is the rate of the latency section's runs, tasks/s: the
// rate the latency targets (schedule → claimable and release lateness,
// p99 ≤ 5 ms) are set at.
const latencyRate = 500

// latency measures, at latencyRate (or half the Go SDK lifecycle rate, if
// lower), the time from
// Schedule returning to a claimer's ClaimNext returning that task, and
// separately how long ClaimNext takes when a task is already waiting.
func (r *run) latency(ctx context.Context, nd *node.Node) error {
	a := httpapi.NewLocal(nd.Service)
	rate := min(latencyRate, r.sdkRate/2)
	n := r.scaled(4000, 100)

	// Claimers poll freely: every latency is schedule → release → ready
	// publish → fetch → claim append, with no queueing behind other work.
	scheduled, claimed, _, err := pacedRun(ctx, a, n, rate, nil)
	if err != nil {
		return err
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
	r.say("  schedule→claimable at %.0f tasks/s, %d tasks; %d claimed before Schedule returned (counted as 0)", rate, len(lat), early)
	p50, p99, p999 := quantiles(lat)
	r.add(r.rttRatio(Figure{Section: "latency", Name: FigSchedClaimP50, Value: p50, Unit: "ms"}))
	f := r.rttRatio(Figure{Section: "latency", Name: FigSchedClaimP99, Value: p99, Unit: "ms"})
	r.add(atMost(f, p99, 5, "≤ 5 ms"))
	r.add(r.rttRatio(Figure{Section: "latency", Name: FigSchedClaimP999, Value: p999, Unit: "ms"}))

	// A backlog of ready tasks, kept up by scheduling at the pace claims
	// are made, so every ClaimNext finds a task waiting.
	backlog := max(n/10, 20)
	if err := forEach(ctx, backlog, func(ctx context.Context, i int) error {
		_, _, err := a.Schedule(ctx, scheduleRequest(i, "default"))
		return err
	}); err != nil {
		return err
	}
	queued := func() int { return nd.Engine.QueueCounts()["default"][aggregate.StatusQueued] }
	if err := waitFor(ctx, time.Minute, func() string { return fmt.Sprintf("only %d of %d tasks queued", queued(), backlog) },
		func() bool { return queued() >= backlog }); err != nil {
		return err
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, _, calls, err := pacedRun(pctx, a, n, rate, pace(pctx, n+backlog, rate))
	if err != nil {
		return err
	}
	r.say("  claim request with a task ready (claim append + read-your-writes) at %.0f claims/s, %d calls", rate, len(calls))
	p50, p99, p999 = quantiles(calls)
	r.add(r.rttRatio(Figure{Section: "latency", Name: FigClaimP50, Value: p50, Unit: "ms"}))
	r.add(r.rttRatio(Figure{Section: "latency", Name: FigClaimP99, Value: p99, Unit: "ms"}))
	r.add(r.rttRatio(Figure{Section: "latency", Name: FigClaimP999, Value: p999, Unit: "ms"}))
	return nil
}
