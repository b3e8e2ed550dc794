package httpapi_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
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
	for _, ev := range testnode.LogEvents(t, b.node.Store) {
		states[ev.TaskID] = aggregate.Apply(states[ev.TaskID], ev)
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

// TestStatsKeysSchedulesAlarm: GET /v1/stats counts a concurrency key's
// holder and waiters, shows each live schedule's next instant and last
// run with its task's status (none while paused, gone once deleted), and
// the alarm's lateness once it acted; a customer sees only its own keys
// and schedules.
func TestStatsKeysSchedulesAlarm(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Tokens = tenantTokens })
	ctx := context.Background()
	a, bc, op := api.NewClient(b.url, "tok-a"), api.NewClient(b.url, "tok-b"), api.NewClient(b.url, "tok-op")
	keyedOn := func(c *api.Client, key string) api.Task {
		task, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "kq", Concurrency: &events.Concurrency{Key: key, Limit: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	holder := keyedOn(a, "repo:a")
	keyedOn(a, "repo:a")
	keyedOn(a, "repo:a")
	keyedOn(bc, "repo:b")
	every := api.ScheduleTask{Queue: "sq", Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "nightly"}}}}
	for _, id := range []string{"nightly", "paused"} {
		if _, _, err := a.CreateSchedule(ctx, api.ScheduleCreateRequest{ID: id, Every: "1h", Task: every, Paused: id == "paused"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := bc.CreateSchedule(ctx, api.ScheduleCreateRequest{ID: "theirs", Every: "1h", Task: every}); err != nil {
		t.Fatal(err)
	}
	run, err := a.TriggerSchedule(ctx, "nightly", api.ScheduleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Cancel(ctx, run.ID, "test"); err != nil {
		t.Fatal(err)
	}

	var stats, opStats api.Stats
	eventually(t, "the key's holder, the run's status and the alarm's lateness in the stats", func() bool {
		if stats, err = a.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		if opStats, err = op.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		return len(stats.Keys) == 1 && stats.Keys[0].Holders == 1 && len(stats.Schedules) == 2 &&
			stats.Schedules[0].LastRun != nil && stats.Schedules[0].LastRun.Status == "canceled" && opStats.Alarm.Lateness.Samples > 0
	})
	// The log's and the process's figures are the operator's alone: a
	// customer's answer holds its own rows and nothing global.
	for token, want := range map[string][]string{
		"tok-a":  {"at", "caughtUp", "keys", "queues", "schedules"},
		"tok-op": {"alarm", "applied", "at", "caughtUp", "keys", "lag", "lastSeq", "partitions", "quarantine", "queues", "schedules"},
	} {
		raw := authDo(t, b, "Bearer "+token, http.MethodGet, "/v1/stats", "")
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw.body, &fields); err != nil || raw.status != http.StatusOK {
			t.Fatalf("%s: %d %s", token, raw.status, raw.body)
		}
		got := slices.Sorted(maps.Keys(fields))
		if !slices.Equal(got, want) {
			t.Errorf("%s sees the fields %v, want %v", token, got, want)
		}
	}
	if stats.Applied != 0 || stats.LastSeq != 0 || stats.Alarm.Lateness.Samples != 0 || stats.Partitions != nil || stats.Epochs != nil {
		t.Errorf("a customer's stats hold global figures: %+v", stats)
	}
	stats.Alarm = opStats.Alarm
	if k := stats.Keys[0]; k != (api.KeyStats{CustomerID: "A", Key: "repo:a", Limit: 1, Holders: 1, Waiting: 2}) {
		t.Errorf("A's key: %+v", k)
	}
	k, err := a.Concurrency(ctx, "repo:a", "")
	if err != nil || len(k.Holders) != 1 || k.Holders[0].TaskID != holder.ID {
		t.Fatalf("the key's holder: %v %+v, want %s", err, k.Holders, holder.ID)
	}
	nightly, paused := stats.Schedules[0], stats.Schedules[1]
	if nightly.ID != "nightly" || nightly.Paused || nightly.Next.IsZero() || nightly.RunCount != 1 || nightly.LastRun.TaskID != run.ID || !nightly.LastRun.Manual {
		t.Errorf("nightly: %+v last run %+v", nightly, nightly.LastRun)
	}
	if paused.ID != "paused" || !paused.Paused || !paused.Next.IsZero() || paused.LastRun != nil {
		t.Errorf("paused: %+v", paused)
	}
	if l := stats.Alarm.Lateness; l.P50Seconds > l.P99Seconds || l.P99Seconds > l.MaxSeconds || l.MaxSeconds < 0 {
		t.Errorf("alarm lateness %+v", l)
	}
	if _, ok := stats.Alarm.Timers["release"]; !ok {
		t.Errorf("no release lateness: %+v", stats.Alarm.Timers)
	}

	if _, err := a.DeleteSchedule(ctx, "paused", api.ScheduleOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted schedule gone from the stats", func() bool {
		if stats, err = op.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		return len(stats.Schedules) == 2
	})
	var keys, scheds []string
	for _, k := range stats.Keys {
		keys = append(keys, k.CustomerID+"/"+k.Key)
	}
	for _, s := range stats.Schedules {
		scheds = append(scheds, s.CustomerID+"/"+s.ID)
	}
	if !slices.Equal(keys, []string{"A/repo:a", "B/repo:b"}) || !slices.Equal(scheds, []string{"A/nightly", "B/theirs"}) {
		t.Errorf("the operator's keys %v and schedules %v", keys, scheds)
	}
}
