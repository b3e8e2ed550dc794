package bench

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/projections"
)

// releaseWindow is how far apart the delayed tasks' runAt times spread,
// from scale 0.1 up; below, it shrinks with the scale (a smoke run).
const releaseWindow = 5 * time.Second

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
	err := forEach(ctx, len(taskIDs), func(ctx context.Context, i int) (err error) {
		out[i], err = nd.Store.History(ctx, taskIDs[i])
		return err
	})
	return out, err
}

// waitTimers waits until timer queue t of the node is empty.
func waitTimers(ctx context.Context, nd *node.Node, t projections.Timer, within time.Duration) error {
	return waitFor(ctx, within, func() string { return fmt.Sprintf("%d tasks still in the %s timer queue", nd.Engine.TimerLen(t), t) },
		func() bool { return nd.Engine.TimerLen(t) == 0 })
}

// lateness returns, for every task, how late its first event of type typ
// was logged against the due time due returns.
func lateness(ctx context.Context, nd *node.Node, taskIDs []string, typ events.Type, due func(i int, ev events.Event) time.Time) ([]time.Duration, error) {
	hs, err := histories(ctx, nd, taskIDs)
	if err != nil {
		return nil, err
	}
	late := make([]time.Duration, len(hs))
	for i, h := range hs {
		ev, ok := eventOf(h, typ)
		if !ok {
			return nil, fmt.Errorf("task %s has no %s", taskIDs[i], typ)
		}
		late[i] = ev.At.Sub(due(i, ev))
	}
	slices.Sort(late)
	return late, nil
}

// sleep returns after d, or with ctx's error when ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// timers measures how late the alarm releases delayed tasks whose runAt
// spread over releaseWindow with all of them pending (DeliveryPending's
// time − runAt), and how late it times out runs (TimedOut's time − the
// deadline).
func (r *run) timers(ctx context.Context, nd *node.Node) error {
	a := httpapi.NewLocal(nd.Service)

	// Releases: every task is scheduled before the first falls due, in
	// runAt order; the lead allows for the schedule rate this run
	// measured, with half as much again to spare.
	n := r.scaled(10000, 50)
	window := time.Duration(float64(releaseWindow) * min(1, 10*r.cfg.Scale))
	lead := max(500*time.Millisecond, time.Duration(1.5*float64(n)/r.schedRate*float64(time.Second)))
	t0 := time.Now().Add(lead)
	runAt := make([]time.Time, n)
	taskIDs := make([]string, n)
	var tardy atomic.Int64
	if err := forEach(ctx, n, func(ctx context.Context, i int) error {
		runAt[i] = t0.Add(time.Duration(i) * window / time.Duration(n))
		req := scheduleRequest(i, "timers")
		req.RunAt = &runAt[i]
		t, _, err := a.Schedule(ctx, req)
		if time.Now().After(runAt[i]) {
			tardy.Add(1)
		}
		taskIDs[i] = t.ID
		return err
	}); err != nil {
		return err
	}
	r.say("  %d delayed tasks scheduled in %s (runAt from %s on, over %s); %d were still being scheduled at their runAt; %d in the release queue",
		n, time.Since(t0.Add(-lead)).Round(time.Millisecond), lead.Round(time.Millisecond), window, tardy.Load(), nd.Engine.TimerLen(projections.Release))
	// The collections that end while the tasks are released: each can
	// hold both cores for 10-25 ms (docs/performance.md, "Garbage
	// collection on two cores"), so the tail depends on how many fell in the window.
	if err := sleep(ctx, time.Until(t0)); err != nil {
		return err
	}
	before := collections("total")
	if err := sleep(ctx, time.Until(t0.Add(window))); err != nil {
		return err
	}
	gcs := collections("total") - before
	if err := waitTimers(ctx, nd, projections.Release, 30*time.Second); err != nil {
		return err
	}
	late, err := lateness(ctx, nd, taskIDs, events.TypeDeliveryPending, func(i int, _ events.Event) time.Time { return runAt[i] })
	if err != nil {
		return err
	}
	p50, p99, mx := millis(percentile(late, .5)), millis(percentile(late, .99)), millis(late[len(late)-1])
	early := float64(len(late) - len(slices.DeleteFunc(slices.Clone(late), func(d time.Duration) bool { return d < 0 })))
	r.add(atMost(Figure{Section: "timers", Name: FigReleaseEarly, Value: early, Unit: "tasks"}, early, 0, "0"))
	r.add(r.rttRatio(Figure{Section: "timers", Name: FigReleaseP50, Value: p50, Unit: "ms"}))
	r.add(atMost(r.rttRatio(Figure{Section: "timers", Name: FigReleaseP99, Value: p99, Unit: "ms"}), p99, 5, "≤ 5 ms"))
	r.add(atMost(r.rttRatio(Figure{Section: "timers", Name: FigReleaseMax, Value: mx, Unit: "ms"}), mx, 50, "≤ 50 ms"))
	r.add(Figure{Section: "timers", Name: FigReleaseGCs, Value: float64(gcs), Unit: "collections"})

	// Timeouts: runs claimed with a one-second timeout, never reported.
	m := r.scaled(500, 20)
	one := 1
	taskIDs = make([]string, m)
	if err := forEach(ctx, m, func(ctx context.Context, i int) error {
		req := scheduleRequest(i, "timeouts")
		req.TimeoutSeconds = &one
		t, _, err := a.Schedule(ctx, req)
		taskIDs[i] = t.ID
		return err
	}); err != nil {
		return err
	}
	if err := claimAll(ctx, a, "timeouts", m, concurrency, time.Minute); err != nil {
		return err
	}
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	if err := waitTimers(ctx, nd, projections.Expire, 30*time.Second); err != nil {
		return err
	}
	late, err = lateness(ctx, nd, taskIDs, events.TypeTimedOut, func(_ int, ev events.Event) time.Time {
		return ev.Data.(events.TimedOut).Deadline
	})
	if err != nil {
		return err
	}
	r.say("  %d runs timed out", m)
	r.add(r.rttRatio(Figure{Section: "timers", Name: FigTimeoutP50, Value: millis(percentile(late, .5)), Unit: "ms"}))
	r.add(r.rttRatio(Figure{Section: "timers", Name: FigTimeoutP99, Value: millis(percentile(late, .99)), Unit: "ms"}))
	r.add(r.rttRatio(Figure{Section: "timers", Name: FigTimeoutMax, Value: millis(late[len(late)-1]), Unit: "ms"}))
	return r.fires(ctx, nd)
}

// burst measures how late tasks all due at one instant (1,000 at scale
// 1) are claimed by
// claimers already waiting: Claimed's time − runAt, for every task.
func (r *run) burst(ctx context.Context, nd *node.Node) error {
	a := httpapi.NewLocal(nd.Service)
	n := r.scaled(1000, 50)
	// Every task scheduled well before the instant, so what is measured
	// is the release and the claims, not the scheduling.
	lead := max(500*time.Millisecond, time.Duration(3*float64(n)/r.schedRate*float64(time.Second)))
	at := time.Now().Add(lead)
	taskIDs := make([]string, n)
	if err := forEach(ctx, n, func(ctx context.Context, i int) error {
		req := scheduleRequest(i, "burst")
		req.RunAt = &at
		t, _, err := a.Schedule(ctx, req)
		taskIDs[i] = t.ID
		return err
	}); err != nil {
		return err
	}
	if time.Now().After(at) {
		return fmt.Errorf("burst: scheduling %d tasks outlasted their %s lead", n, lead)
	}
	if err := claimAll(ctx, a, "burst", n, burstClaimers, phaseTimeout); err != nil {
		return err
	}
	late, err := lateness(ctx, nd, taskIDs, events.TypeClaimed, func(int, events.Event) time.Time { return at })
	if err != nil {
		return err
	}
	hs, err := histories(ctx, nd, taskIDs)
	if err != nil {
		return err
	}
	handed := 0
	for _, h := range hs {
		if _, published := eventOf(h, events.TypeReadyPublished); !published {
			handed++
		}
	}
	r.say("  %d tasks due at one instant, claimed by %d waiting claimers; %d without ReadyPublished (handed off, or claimed before it was recorded)", n, burstClaimers, handed)
	for _, typ := range []events.Type{events.TypeDeliveryPending} {
		l, err := lateness(ctx, nd, taskIDs, typ, func(int, events.Event) time.Time { return at })
		if err != nil {
			return err
		}
		r.say("  burst %s after the instant: p50 %.1f ms, max %.1f ms", typ, millis(percentile(l, .5)), millis(l[len(l)-1]))
	}
	p99, mx := millis(percentile(late, .99)), millis(late[len(late)-1])
	r.add(atMost(Figure{Section: "timers", Name: FigBurstP99, Value: p99, Unit: "ms"}, p99, 100, "≤ 100 ms"))
	r.add(Figure{Section: "timers", Name: FigBurstMax, Value: mx, Unit: "ms"})
	return nil
}

// claimAll claims n tasks of queue with claimers goroutines of claims/next
// (leaving them running), failing if that takes longer than within.
func claimAll(ctx context.Context, a *httpapi.Local, queue string, n, claimers int, within time.Duration) error {
	var claimed atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for w := range claimers {
		g.Go(func() error {
			deadline := time.Now().Add(within)
			for claimed.Load() < int64(n) {
				if time.Now().After(deadline) {
					return fmt.Errorf("%s: only %d of %d tasks claimed in %s", queue, claimed.Load(), n, within)
				}
				if _, ok, err := a.ClaimNext(gctx, queue, fmt.Sprintf("%s-%d", queue, w), claimWait); err != nil {
					return err
				} else if ok {
					claimed.Add(1)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// burstClaimers is how many claimers wait for the burst.
const burstClaimers = 64
