package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// TestConcurrencyTwoSchedulers runs two schedulers on one stream, each
// with its own connection, store, projections and alarm, and 200 tasks of
// one key with limit 3, scheduled through both and run by executors of
// both; every fifth task fails its first attempt and is retried (its slot
// given back for the backoff and taken again). Folding the log
// afterwards, no more than 3 tasks ever hold a slot or a delivery token
// at once, every task succeeded, and the verifier finds the log clean.
func TestConcurrencyTwoSchedulers(t *testing.T) {
	t.Parallel()
	const total, limit, key = 200, 3, "repo:example/storefront"
	a := setup(t)
	st := a.node.Store
	ns := testnats.Namespace{Stream: st.Config().Stream, ReadyStream: events.ReadyStreamName(st.Config().Stream), Subjects: st.Subjects()}
	b := testnode.Start(t, testnode.On(nil, ns))
	clients := []*api.Client{a.client, b.Client}
	// Bounded: the traffic takes seconds; the budget is for a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for half := range 2 {
		reqs := make([]api.ScheduleRequest, total/2)
		for i := range reqs {
			id := fmt.Sprintf("t%03d", half*total/2+i)
			reqs[i] = api.ScheduleRequest{Queue: "conc2", RequestID: id, Message: text("objective", id),
				Concurrency: &events.Concurrency{Key: key, Limit: limit}}
			if i%5 == 0 {
				reqs[i].Retry = &api.RetryRequest{MaxAttempts: refOf(2), BackoffSeconds: refOf(0)}
			}
		}
		items, err := clients[half].ScheduleBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.Status != 201 {
				t.Fatalf("schedule: %+v", it)
			}
		}
	}

	// Two executors per scheduler claim and succeed at once (or fail a
	// retried task's first attempt), until every task has succeeded.
	var done atomic.Int64
	work, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(work)
	for i := range 4 {
		c := clients[i%2]
		g.Go(func() error {
			for done.Load() < total {
				task, ok, err := c.ClaimNext(gctx, "conc2", fmt.Sprintf("w%d", i), time.Second)
				if gctx.Err() != nil {
					return nil
				}
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				res := api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}
				flaky := task.MaxAttempts > 1 && task.Attempt == 1
				if flaky {
					res = api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Error: "flaky tool"}
				}
				if _, err := c.RecordResult(gctx, task.ID, res); err != nil {
					return err
				}
				if !flaky && done.Add(1) == total {
					stop()
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if n := done.Load(); n != total {
		t.Fatalf("%d of %d tasks ran", n, total)
	}
	// Both processes give back the last slots.
	for _, c := range clients {
		waitKey(t, c, key, []string{}, []string{})
	}

	// Fold the whole log: slots held per key, and keyed tasks holding a
	// delivery token or running (released, not yet terminal).
	v := replay.NewVerifier(st.Subjects())
	holders, active := map[string]bool{}, map[string]bool{}
	maxHolders, maxActive, succeeded, retried := 0, 0, 0, 0
	err := eventlog.Log{JS: st.JetStream(), Stream: st.Config().Stream, Subjects: st.Subjects()}.Read(ctx, eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		ev, err := events.DecodeAt(m.Data, m.Pos)
		if err != nil {
			return err
		}
		switch p := ev.Data.(type) {
		case events.SlotAcquired:
			holders[p.TaskID] = true
		case events.SlotReleased:
			delete(holders, p.TaskID)
		case events.DeliveryPending:
			active[ev.TaskID] = true
		case events.ResultRecorded:
			delete(active, ev.TaskID)
			if p.Result.Success {
				succeeded++
			}
		case events.RetryScheduled:
			delete(active, ev.TaskID)
			retried++
		case events.Canceled, events.TimedOut, events.DeliveryExhausted:
			delete(active, ev.TaskID)
		}
		maxHolders, maxActive = max(maxHolders, len(holders)), max(maxActive, len(active))
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if maxHolders > limit || maxActive > limit {
		t.Fatalf("at most %d at once, but the log has %d slot holders and %d released tasks at once", limit, maxHolders, maxActive)
	}
	if maxActive < 2 {
		t.Fatalf("never more than %d task released at once: the limit of %d was not used", maxActive, limit)
	}
	if succeeded != total || retried != total/5 || len(holders) != 0 {
		t.Fatalf("%d tasks succeeded, %d were retried, %d still hold a slot", succeeded, retried, len(holders))
	}
	if r := v.Report(); !r.Clean() {
		t.Fatalf("verifier: %+v", r.Violations)
	}
}
