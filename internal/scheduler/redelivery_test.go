package scheduler_test

import (
	"bufio"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/reactors"
)

// republishAfter sets how soon the node's alarm checks a queued task's
// notification.
func republishAfter(d time.Duration) testnode.Option {
	return func(c *node.Config) { c.Alarm.RepublishAfter = d }
}

// loseNotification deletes the ready stream's copy of queued task st's
// notification, as a lost write or an operator's purge would.
func loseNotification(t *testing.T, n *testnode.Node, st aggregate.State) {
	t.Helper()
	if st.Delivery.ReadySeq == 0 {
		t.Fatalf("queued task without its ready sequence: %+v", st.Delivery)
	}
	rs, err := n.Store.JetStream().Stream(context.Background(), n.NS.ReadyStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.DeleteMsg(context.Background(), st.Delivery.ReadySeq); err != nil {
		t.Fatal(err)
	}
}

// claimNext claims the next task of queue as p within wait, or fails.
func claimNext(t *testing.T, n *testnode.Node, p scheduler.Principal, queue string, wait time.Duration) aggregate.State {
	t.Helper()
	st, ok, err := n.Service.ClaimNext(context.Background(), p, queue, "w1", wait)
	if err != nil || !ok {
		t.Fatalf("claims/next on %s as %q: ok %v, err %v", queue, p.CustomerID, ok, err)
	}
	return st
}

// A queued task whose ready notification is lost is claimed after all by
// an operator's poll, which takes notifications (a customer's poll also
// claims its queued tasks straight from the projections): the alarm
// finds the notification gone and publishes it again with the same token.
func TestLostNotificationIsRepublished(t *testing.T) {
	t.Parallel()
	n := setup(t, republishAfter(100*time.Millisecond))
	q := claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "lost"}).TaskID)
	loseNotification(t, n, q)
	// Nobody polls meanwhile, so the republish is recorded before a claim
	// (a claimer fast enough may claim the new copy first; then the
	// record is stale and Claimed follows ReadyPublished directly).
	testnode.Eventually(t, "ReadyRepublished", func() bool {
		return slices.Contains(types(history(t, n, q.TaskID)), events.TypeReadyRepublished)
	})

	st := claimNext(t, n, operator, "lost", 20*time.Second)
	if st.TaskID != q.TaskID || st.Claim.DeliveryID != q.Delivery.ID {
		t.Fatalf("claimed %s with %s, want %s with %s", st.TaskID, st.Claim.DeliveryID, q.TaskID, q.Delivery.ID)
	}
	want := []events.Type{events.TypeTaskScheduled, events.TypeReadyPublished, // released in TaskScheduled
		events.TypeReadyRepublished, events.TypeClaimed}
	if got := types(history(t, n, q.TaskID)); !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
}

// A notification lost while no process checks it (here: a node that
// would check only after an hour) is healed by the next process to start
// on the log.
func TestLostNotificationHealsAfterRestart(t *testing.T) {
	t.Parallel()
	first := setup(t, republishAfter(time.Hour))
	q := claimable(t, first, mustSchedule(t, first, acme, scheduler.ScheduleRequest{Queue: "lost"}).TaskID)
	loseNotification(t, first, q)
	if _, ok, err := first.Service.ClaimNext(context.Background(), operator, "lost", "w1", 200*time.Millisecond); ok || err != nil {
		t.Fatalf("claims/next found a lost notification: ok %v, err %v", ok, err)
	}
	first.Stop()

	second := setup(t, testnode.On(first.NC, first.NS), republishAfter(100*time.Millisecond))
	st := claimNext(t, second, operator, "lost", 20*time.Second)
	if st.TaskID != q.TaskID || st.Claim.DeliveryID != q.Delivery.ID {
		t.Fatalf("claimed %s with %s, want %s with %s", st.TaskID, st.Claim.DeliveryID, q.TaskID, q.Delivery.ID)
	}
}

// A delivery that cannot be published within its budget fails the task
// and is counted on /metrics.
func TestExhaustedDeliveryCounted(t *testing.T) {
	t.Parallel()
	n := setup(t, func(c *node.Config) {
		c.Alarm = reactors.AlarmConfig{DeliveryBudget: 100 * time.Millisecond, RetryBase: 5 * time.Millisecond}
	})
	if err := n.Store.JetStream().DeleteStream(context.Background(), n.NS.ReadyStream); err != nil {
		t.Fatal(err)
	}
	task := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "nowhere"})
	testnode.Eventually(t, "task failed", func() bool { return get(t, n, task.TaskID).Status == aggregate.StatusFailed })
	if got := types(history(t, n, task.TaskID)); got[len(got)-1] != events.TypeDeliveryExhausted {
		t.Fatalf("history %v, want it to end with DeliveryExhausted", got)
	}
	testnode.Eventually(t, "exhaustion counted", func() bool { return metric(t, n, "taskledger_deliveries_exhausted_total") == 1 })
}

// metric reads an unlabelled counter or gauge from the node's /metrics.
func metric(t *testing.T, n *testnode.Node, name string) float64 {
	t.Helper()
	resp, err := n.Client.HTTP.Get(n.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", sc.Text(), err)
			}
			return v
		}
	}
	t.Fatalf("metric %s not in /metrics (%v)", name, sc.Err())
	return 0
}

// A task due at once is released in its TaskScheduled, and its
// notification published by the ready queue's publishers, not the
// alarm's grace later: queued, two events, the notification in the ready
// stream under the delivery id. A delayed task waits unreleased for the
// alarm.
func TestScheduleDuePublishedAtOnce(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	answered := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "direct"})
	if answered.Delivery.ID == "" {
		t.Fatalf("task due at once answered %s with delivery %+v, want released", answered.Status, answered.Delivery)
	}
	st := testnode.Published(t, n, answered.TaskID, events.DefaultReadyGrace/2)
	if st.Status != aggregate.StatusQueued || st.Delivery.ID != answered.Delivery.ID || st.Delivery.ReadySeq == 0 {
		t.Fatalf("task due at once is %s with delivery %+v, want queued under %s", st.Status, st.Delivery, answered.Delivery.ID)
	}
	evs := history(t, n, st.TaskID)
	if got, want := types(evs), []events.Type{events.TypeTaskScheduled, events.TypeReadyPublished}; !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	if ts := evs[0].Data.(events.TaskScheduled); ts.DeliveryID != st.Delivery.ID || ts.NextAt.IsZero() {
		t.Fatalf("TaskScheduled released %q (next at %v), want %q", ts.DeliveryID, ts.NextAt, st.Delivery.ID)
	}
	rs, err := n.Store.JetStream().Stream(ctx, n.NS.ReadyStream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := rs.GetMsg(ctx, st.Delivery.ReadySeq)
	if err != nil {
		t.Fatalf("notification at ready sequence %d: %v", st.Delivery.ReadySeq, err)
	}
	if id := msg.Header.Get("Nats-Msg-Id"); id != st.Delivery.ID {
		t.Fatalf("notification's message id %q, want the delivery id %q", id, st.Delivery.ID)
	}
	if got := claimNext(t, n, acme, "direct", 10*time.Second); got.TaskID != st.TaskID || got.Claim.DeliveryID != st.Delivery.ID {
		t.Fatalf("claimed %s with %s, want %s with %s", got.TaskID, got.Claim.DeliveryID, st.TaskID, st.Delivery.ID)
	}

	delay := 3600.0
	later := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "direct", DelaySeconds: &delay})
	if later.Status != aggregate.StatusScheduled || later.Delivery.ID != "" {
		t.Fatalf("delayed task answered %s with delivery %+v, want scheduled and not released", later.Status, later.Delivery)
	}
	if ts := history(t, n, later.TaskID)[0].Data.(events.TaskScheduled); ts.DeliveryID != "" {
		t.Fatalf("delayed task released in its TaskScheduled: %+v", ts)
	}
}

// Notifications are msgpack by default; with ReadyJSON they are JSON for
// consumers that read only JSON. Either way the Content-Type header names
// the encoding, and claims/next reads both.
func TestReadyNotificationEncoding(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		json bool
		want string
	}{{"Msgpack", false, events.ContentTypeMsgpack}, {"JSON", true, events.ContentTypeJSON}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			n := setup(t, func(cfg *node.Config) { cfg.ReadyJSON = c.json })
			ctx := context.Background()
			st := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "enc"})
			st = testnode.Published(t, n, st.TaskID, 10*time.Second)
			rs, err := n.Store.JetStream().Stream(ctx, n.NS.ReadyStream)
			if err != nil {
				t.Fatal(err)
			}
			msg, err := rs.GetMsg(ctx, st.Delivery.ReadySeq)
			if err != nil {
				t.Fatal(err)
			}
			if ct := msg.Header.Get(events.ContentTypeHeader); ct != c.want {
				t.Fatalf("Content-Type %q, want %q", ct, c.want)
			}
			if c.json && !json.Valid(msg.Data) {
				t.Fatalf("JSON notification %q is not JSON", msg.Data)
			}
			note, err := events.UnmarshalReady(msg.Data, c.want)
			if err != nil || note.TaskID != st.TaskID || note.DeliveryID != st.Delivery.ID || note.CustomerID != "acme" || note.Queue != "enc" {
				t.Fatalf("notification %+v (%v), want task %s with %s", note, err, st.TaskID, st.Delivery.ID)
			}
			if got := claimNext(t, n, acme, "enc", 10*time.Second); got.TaskID != st.TaskID {
				t.Fatalf("claimed %s, want %s", got.TaskID, st.TaskID)
			}
		})
	}
}
