package replay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// TestVerifyCleanAtScale drives VERIFY_TASKS tasks (default 1000; the
// closing notes report 100000) through a real node — schedules, children,
// claims by competing executors, results and cancels — and requires the
// verifier to find the whole log clean.
func TestVerifyCleanAtScale(t *testing.T) {
	t.Parallel()
	n := 1000
	if s := os.Getenv("VERIFY_TASKS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("VERIFY_TASKS=%q", s)
		}
	}
	r := testnode.Start(t)
	svc, ctx, p := r.Service, context.Background(), scheduler.Operator
	var next, created, done atomic.Int64
	var g errgroup.Group
	for w := range 8 { // schedulers: every fifth task is a child of the previous root
		g.Go(func() error {
			var root string
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				req := scheduler.ScheduleRequest{CustomerID: fmt.Sprintf("c%d", w%3), Queue: "scale",
					Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "task"}}}}
				if i%5 == 0 && root != "" {
					req.ParentID = root
				}
				st, _, err := svc.Schedule(ctx, p, req)
				if errors.Is(err, scheduler.ErrParentTerminal) { // the root was canceled first
					req.ParentID = ""
					st, _, err = svc.Schedule(ctx, p, req)
				}
				if err != nil {
					return err
				}
				created.Add(1)
				if req.ParentID == "" {
					root = st.TaskID
				}
			}
			return nil
		})
	}
	// Until every task is created and none waits: a child whose root
	// ended first is canceled (ancestor_terminal) by the claim that finds
	// it instead of claimed.
	waiting := func() bool {
		for _, st := range []aggregate.Status{aggregate.StatusScheduled, aggregate.StatusQueued} {
			if len(r.Engine.List(projections.Filter{Status: st, Queue: "scale"}, "", 1)) > 0 {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(5 * time.Minute)
	for w := range 8 { // executors: results, with a cancel now and then
		g.Go(func() error {
			for created.Load() < int64(n) || waiting() {
				if time.Now().After(deadline) {
					return fmt.Errorf("%d of %d tasks created, %d claimed after 5m", created.Load(), n, done.Load())
				}
				st, ok, err := svc.ClaimNext(ctx, p, "scale", fmt.Sprintf("x%d", w), 100*time.Millisecond)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				if done.Add(1)%11 == 0 {
					_, err = svc.Cancel(ctx, p, st.TaskID, "scale test")
				} else {
					_, err = svc.RecordResult(ctx, p, st.TaskID, st.Claim.DeliveryID, events.Result{Success: true})
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	msgs, _ := streamState(t, r.Store.JetStream(), r.NS.Stream)
	start := time.Now()
	report, err := verifyLog(ctx, logOf(r.Store.JetStream(), r.NS), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("verified %d tasks, %d events in %s", report.Tasks, report.Events, time.Since(start).Round(time.Millisecond))
	if !report.Clean() || uint64(report.Events) != msgs || report.Tasks != n {
		t.Fatalf("report: %d events (stream %d), %d tasks (want %d), violations %v", report.Events, msgs, report.Tasks, n, report.Violations)
	}
}
