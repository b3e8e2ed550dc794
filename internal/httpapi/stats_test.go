package httpapi_test

import (
	"context"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
)

// TestStats: after a mixed workload the counts of GET /v1/stats equal a
// fold of the log, the rates count the claims and results, a running
// task past 80 % of its timeout is counted, and a customer sees only its
// own rows.
func TestStats(t *testing.T) {
	t.Parallel()
	var offset atomic.Int64 // the clock's lead on the wall clock
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	b := setup(t, func(c *node.Config) {
		c.Tokens = tenantTokens
		c.Now = now
		c.Admission = scheduler.Admission{PerCustomer: map[string]scheduler.Quota{"B": {MaxActiveRoots: 2}}}
	})
	ctx := context.Background()
	a, bc, op := api.NewClient(b.url, "tok-a"), api.NewClient(b.url, "tok-b"), api.NewClient(b.url, "tok-op")
	scheduleN(t, a, "qa", 3)
	for i := range 2 {
		task, ok, err := a.ClaimNext(ctx, "qa", "w1", 0)
		if err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		if i == 0 {
			if _, err := a.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	queued := scheduleN(t, a, "qa2", 2)
	if _, err := a.Cancel(ctx, queued[0].ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Schedule(ctx, api.ScheduleRequest{Queue: "qa2", DelaySeconds: new(float64(3600))}); err != nil {
		t.Fatal(err)
	}
	scheduleN(t, bc, "qb", 2)
	if _, _, err := bc.Schedule(ctx, api.ScheduleRequest{Queue: "qb"}); err == nil {
		t.Fatal("B's third active root was admitted")
	}

	// The fold of the log: each task's state, counted per customer and
	// queue.
	type key struct{ customer, queue string }
	states := map[string]aggregate.State{}
	err := b.node.Store.Log().Events(ctx, store.ReadOptions{}, func(ev events.Event) error {
		states[ev.TaskID] = aggregate.Apply(states[ev.TaskID], ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want, rejected := map[key]map[string]int{}, map[key]int{}
	for _, st := range states {
		k := key{st.CustomerID, st.Spec.Queue}
		if want[k] == nil {
			want[k] = map[string]int{}
		}
		want[k][string(st.Status)]++
		if st.Rejected {
			rejected[k]++
		}
	}
	stats, err := op.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Applied == 0 || stats.LastSeq < stats.Applied || stats.Lag != stats.LastSeq-stats.Applied || !stats.CaughtUp {
		t.Fatalf("process facts: %+v", stats)
	}
	rows := map[key]api.QueueStats{}
	for _, q := range stats.Queues {
		rows[key{q.CustomerID, q.Queue}] = q
	}
	if len(rows) != len(want) {
		t.Fatalf("rows %v, want %v", rows, want)
	}
	for k, counts := range want {
		if got := rows[k]; !maps.Equal(got.Counts, counts) || got.Rejections != rejected[k] {
			t.Errorf("%v: counts %v rejections %d, the log folds to %v and %d", k, got.Counts, got.Rejections, counts, rejected[k])
		}
	}
	qa := rows[key{"A", "qa"}]
	if qa.Claims.Last1m <= 0 || qa.Claims.Last5m <= 0 || qa.Results.Last1m <= 0 || qa.Claims.Last1m < qa.Results.Last1m {
		t.Errorf("qa rates: claims %+v results %+v", qa.Claims, qa.Results)
	}
	if qa2 := rows[key{"A", "qa2"}]; qa2.OldestQueuedSeconds <= 0 || qa2.Claims.Last1m != 0 {
		t.Errorf("qa2: %+v", qa2)
	}
	if rows[key{"B", "qb"}].Rejections != 1 || qa.NearTimeout != 0 {
		t.Errorf("rejections %d, near timeout %d", rows[key{"B", "qb"}].Rejections, qa.NearTimeout)
	}

	// 50 minutes on, the running task (1 h timeout) is past 80 % of it.
	offset.Store(int64(50 * time.Minute))
	stats, err = op.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range stats.Queues {
		if q.Queue == "qa" && q.NearTimeout != 1 {
			t.Errorf("qa near timeout %d, want 1", q.NearTimeout)
		}
	}

	mine, err := bc.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(mine.Queues) != 1 || mine.Queues[0].CustomerID != "B" {
		t.Fatalf("B's stats: %+v", mine.Queues)
	}
}
