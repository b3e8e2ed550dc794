package scheduler_test

import (
	"context"
	"testing"

	"github.com/taskledger/taskledger/internal/scheduler"
)

// TestRequestIDUnderAnotherParent: a customer's requestId names one task;
// repeated under the same parent it answers that task, under another
// parent (or as a root, or for a child when it named a root) it is
// ErrRequestIDConflict, never the other parent's task.
func TestRequestIDUnderAnotherParent(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	a := idle(t, n, acme, scheduler.ScheduleRequest{})
	b := idle(t, n, acme, scheduler.ScheduleRequest{})
	child := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: a.TaskID, RequestID: "sub"})
	root := idle(t, n, acme, scheduler.ScheduleRequest{RequestID: "top"})

	again, created, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{ParentID: a.TaskID, RequestID: "sub"})
	if err != nil || created || again.TaskID != child.TaskID {
		t.Fatalf("repeat under the same parent: %s created %v err %v, want %s", again.TaskID, created, err, child.TaskID)
	}
	again, created, err = n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{RequestID: "top"})
	if err != nil || created || again.TaskID != root.TaskID {
		t.Fatalf("repeat of a root: %s created %v err %v, want %s", again.TaskID, created, err, root.TaskID)
	}
	before := streamMsgs(t, n)
	for _, req := range []scheduler.ScheduleRequest{
		{ParentID: b.TaskID, RequestID: "sub"},
		{RequestID: "sub"},
		{ParentID: a.TaskID, RequestID: "top"},
	} {
		st, created, err := n.Service.Schedule(ctx, acme, req)
		requireIs(t, err, scheduler.ErrRequestIDConflict)
		if created || st.Exists() {
			t.Fatalf("%+v: created %v, task %s; want nothing", req, created, st.TaskID)
		}
	}
	if after := streamMsgs(t, n); after != before {
		t.Fatalf("conflicting requests appended %d events", after-before)
	}
	// Another customer's requestId is its own.
	if _, created, err := n.Service.Schedule(ctx, globex, scheduler.ScheduleRequest{RequestID: "sub"}); err != nil || !created {
		t.Fatalf("globex's own sub: created %v err %v", created, err)
	}
}
