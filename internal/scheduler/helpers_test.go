package scheduler_test

import (
	"context"
	"errors"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
)

// history and types are the shared harness's.
var history, types = testnode.History, testnode.Types

// Helpers shared by the tests of scheduler.Service, called directly (no
// HTTP) on a real node of the package's embedded NATS server.

var (
	operator = scheduler.Operator
	acme     = scheduler.Principal{CustomerID: "acme"}
	globex   = scheduler.Principal{CustomerID: "globex"}
)

// later is a delay that keeps a task scheduled (unreleased) for the whole
// test, so the alarm appends nothing to it.
const later = 3600.0

// setup starts a node for one test and returns it; its Service is the
// one under test.
func setup(t *testing.T, opts ...testnode.Option) *testnode.Node {
	t.Helper()
	return testnode.Start(t, opts...)
}

// withAdmission configures the node's admission control.
func withAdmission(a scheduler.Admission) testnode.Option {
	return func(c *node.Config) { c.Admission = a }
}

// text is a one-part text message with id ("" for none).
func text(id, s string) events.Message {
	return events.Message{ID: id, Content: []events.ContentPart{{Type: "text", Text: s}}}
}

// mustSchedule is the shared harness's.
var mustSchedule = testnode.MustSchedule

// idle schedules a task as p that stays scheduled for the whole test.
func idle(t *testing.T, n *testnode.Node, p scheduler.Principal, req scheduler.ScheduleRequest) aggregate.State {
	t.Helper()
	req.DelaySeconds = new(later)
	return mustSchedule(t, n, p, req)
}

// get reads a task as the operator and fails the test on any error.
func get(t *testing.T, n *testnode.Node, id string) aggregate.State {
	t.Helper()
	st, err := n.Service.Get(context.Background(), operator, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return st
}

// claimable waits until the alarm has released task id and published its
// ready notification, and returns it queued with its delivery token.
func claimable(t *testing.T, n *testnode.Node, id string) aggregate.State {
	t.Helper()
	var st aggregate.State
	testnode.Eventually(t, "task "+id+" queued", func() bool {
		st = get(t, n, id)
		return st.Status == aggregate.StatusQueued
	})
	if st.Delivery.ID == "" {
		t.Fatalf("queued task without a delivery token: %+v", st)
	}
	return st
}

// running schedules req as p, waits for its release and claims it as
// executor "w1" with its delivery token.
func running(t *testing.T, n *testnode.Node, p scheduler.Principal, req scheduler.ScheduleRequest) aggregate.State {
	t.Helper()
	q := claimable(t, n, mustSchedule(t, n, p, req).TaskID)
	st, err := n.Service.Claim(context.Background(), p, q.TaskID, q.Delivery.ID, "w1")
	if err != nil {
		t.Fatalf("claim %s: %v", q.TaskID, err)
	}
	if st.Status != aggregate.StatusRunning || st.Claim.DeliveryID != q.Delivery.ID || st.Claim.ExecutorID != "w1" {
		t.Fatalf("claimed task: %+v", st)
	}
	return st
}

// requireIs fails the test unless errors.Is(err, target).
func requireIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want %v", err, target)
	}
}

// streamMsgs returns how many events the node's log holds now, read from
// the server (not from the projections, which may lag).
func streamMsgs(t *testing.T, n *testnode.Node) uint64 {
	t.Helper()
	info, err := n.Store.Stream().Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}
