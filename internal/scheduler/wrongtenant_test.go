package scheduler_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
)

// A ready notification carries no truth: one that names a task of another
// customer (or on another queue) than the task is, as anyone able to
// publish on the ready subjects could forge, yields no claim. It is
// dropped and counted, and the task stays claimable by its customer.
func TestForgedNotificationYieldsNoClaim(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	n := setup(t, func(c *node.Config) { c.Registry = reg })
	ctx := context.Background()

	t.Run("AnotherCustomer", func(t *testing.T) {
		const queue = "forged-customer"
		theirs := claimable(t, n, mustSchedule(t, n, globex, scheduler.ScheduleRequest{Queue: queue}).TaskID)
		before := wrongTenantClaims(t, reg)
		forge(t, n, queue, events.ReadyNotification{TaskID: theirs.TaskID, CustomerID: acme.CustomerID, RootID: theirs.TaskID, Queue: queue, DeliveryID: theirs.Delivery.ID})

		st, ok, err := n.Service.ClaimNext(ctx, acme, queue, "thief", 2*time.Second)
		if err != nil || ok {
			t.Fatalf("acme's claim on a forged notification for globex's task: ok %v task %q err %v, want nothing", ok, st.TaskID, err)
		}
		if got := wrongTenantClaims(t, reg); got != before+1 {
			t.Fatalf("taskledger_claims_wrong_tenant_total went from %v to %v, want one more: the forged notification never reached a claim", before, got)
		}
		if got := get(t, n, theirs.TaskID); got.Status != aggregate.StatusQueued || got.Delivery.ID != theirs.Delivery.ID {
			t.Fatalf("globex's task after the forged claim: %s delivery %s, want queued under %s", got.Status, got.Delivery.ID, theirs.Delivery.ID)
		}
		st, ok, err = n.Service.ClaimNext(ctx, globex, queue, "owner", 5*time.Second)
		if err != nil || !ok || st.TaskID != theirs.TaskID || st.Claim.ExecutorID != "owner" {
			t.Fatalf("globex's own claim: ok %v task %q executor %q err %v, want %s", ok, st.TaskID, st.Claim.ExecutorID, err, theirs.TaskID)
		}
	})

	t.Run("BatchClaim", func(t *testing.T) {
		const queue = "forged-batch"
		theirs := claimable(t, n, mustSchedule(t, n, globex, scheduler.ScheduleRequest{Queue: queue}).TaskID)
		before := wrongTenantClaims(t, reg)
		forge(t, n, queue, events.ReadyNotification{TaskID: theirs.TaskID, CustomerID: acme.CustomerID, RootID: theirs.TaskID, Queue: queue, DeliveryID: theirs.Delivery.ID})
		got, err := n.Service.ClaimBatch(ctx, acme, queue, "thief", 10, 2*time.Second)
		if err != nil || len(got) != 0 {
			t.Fatalf("acme's batch claim on a forged notification: %d tasks, %v; want none", len(got), err)
		}
		if got := wrongTenantClaims(t, reg); got != before+1 {
			t.Fatalf("taskledger_claims_wrong_tenant_total went from %v to %v, want one more", before, got)
		}
		got, err = n.Service.ClaimBatch(ctx, globex, queue, "owner", 10, 5*time.Second)
		if err != nil || len(got) != 1 || got[0].TaskID != theirs.TaskID {
			t.Fatalf("globex's own batch claim: %d tasks, %v; want %s", len(got), err, theirs.TaskID)
		}
	})

	// Under a terminal ancestor a claim cancels instead: that cancel is
	// refused as the claim is, and the task stays queued.
	t.Run("UnderTerminalAncestor", func(t *testing.T) {
		const queue = "forged-ancestor"
		root := idle(t, n, globex, scheduler.ScheduleRequest{Queue: queue})
		theirs := claimable(t, n, mustSchedule(t, n, globex, scheduler.ScheduleRequest{Queue: queue, ParentID: root.TaskID}).TaskID)
		if _, err := n.Service.Cancel(ctx, globex, root.TaskID, "stop"); err != nil {
			t.Fatal(err)
		}
		testnode.Eventually(t, "the root's cancel applied", func() bool { return get(t, n, root.TaskID).Status.Terminal() })
		before := wrongTenantClaims(t, reg)
		forge(t, n, queue, events.ReadyNotification{TaskID: theirs.TaskID, CustomerID: acme.CustomerID, RootID: root.TaskID, Queue: queue, DeliveryID: theirs.Delivery.ID})

		if st, ok, err := n.Service.ClaimNext(ctx, acme, queue, "thief", 2*time.Second); err != nil || ok {
			t.Fatalf("acme's claim on a forged notification for globex's task: ok %v task %q err %v, want nothing", ok, st.TaskID, err)
		}
		if got := wrongTenantClaims(t, reg); got != before+1 {
			t.Fatalf("taskledger_claims_wrong_tenant_total went from %v to %v, want one more", before, got)
		}
		if got := get(t, n, theirs.TaskID); got.Status != aggregate.StatusQueued {
			t.Fatalf("globex's task after acme's forged claim: %s (%s), want queued: acme's claim canceled it", got.Status, got.Reason)
		}
	})

	t.Run("AnotherQueue", func(t *testing.T) {
		const queue, other = "forged-real", "forged-other"
		idle(t, n, globex, scheduler.ScheduleRequest{Queue: other}) // the queue exists, nothing on it is released
		theirs := claimable(t, n, mustSchedule(t, n, globex, scheduler.ScheduleRequest{Queue: queue}).TaskID)
		before := wrongTenantClaims(t, reg)
		forge(t, n, other, events.ReadyNotification{TaskID: theirs.TaskID, CustomerID: globex.CustomerID, RootID: theirs.TaskID, Queue: other, DeliveryID: theirs.Delivery.ID})

		// The operator claims whatever its notification names, but only
		// on the queue the task is on.
		st, ok, err := n.Service.ClaimNext(ctx, operator, other, "elsewhere", 2*time.Second)
		if err != nil || ok {
			t.Fatalf("a claim on %s through a notification for a task on %s: ok %v task %q err %v, want nothing", other, queue, ok, st.TaskID, err)
		}
		if got := wrongTenantClaims(t, reg); got != before+1 {
			t.Fatalf("taskledger_claims_wrong_tenant_total went from %v to %v, want one more", before, got)
		}
		st, ok, err = n.Service.ClaimNext(ctx, globex, queue, "owner", 5*time.Second)
		if err != nil || !ok || st.TaskID != theirs.TaskID {
			t.Fatalf("globex's own claim on %s: ok %v task %q err %v, want %s", queue, ok, st.TaskID, err, theirs.TaskID)
		}
	})
}

// forge publishes n on queue's ready subject, as a local process with
// access to the ready stream could.
func forge(t *testing.T, n *testnode.Node, queue string, note events.ReadyNotification) {
	t.Helper()
	body, err := json.Marshal(note)
	if err != nil {
		t.Fatal(err)
	}
	msg := &nats.Msg{Subject: n.NS.Subjects.Ready(queue), Data: body, Header: nats.Header{events.ContentTypeHeader: {events.ContentTypeJSON}}}
	if _, err := n.Store.JetStream().PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

// wrongTenantClaims reads taskledger_claims_wrong_tenant_total from reg.
func wrongTenantClaims(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "taskledger_claims_wrong_tenant_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("taskledger_claims_wrong_tenant_total is not registered")
	return 0
}
