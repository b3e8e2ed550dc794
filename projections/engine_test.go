package projections_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

func TestEngineWaitFor(t *testing.T) {
	t.Parallel()

	t.Run("HonoursContext", func(t *testing.T) {
		t.Parallel()
		b := setupLog(t) // engine never runs: nothing is ever applied
		if err := b.engine.WaitFor(context.Background(), 0); err != nil {
			t.Fatalf("WaitFor(0) = %v, want nil", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- b.engine.WaitFor(ctx, 1) }()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitFor after cancel = %v, want context.Canceled", err)
		}
		dctx, dcancel := context.WithDeadline(context.Background(), time.Now())
		defer dcancel()
		if err := b.engine.WaitFor(dctx, 5); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitFor past deadline = %v, want DeadlineExceeded", err)
		}
	})

	t.Run("BlocksUntilApplied", func(t *testing.T) {
		t.Parallel()
		b := setupLog(t)
		run(t, b.engine)
		ctx := context.Background()
		a := b.schedule(t, "cust", nil, time.Time{})
		if err := b.engine.WaitFor(ctx, a.LastSeq); err != nil {
			t.Fatal(err)
		}
		if _, ok := b.engine.Task(a.TaskID); !ok {
			t.Fatal("task not projected after WaitFor returned")
		}
		next := events.Position(lastSeq(t, b.store.Stream()) + 1)
		done := make(chan error, 1)
		go func() { done <- b.engine.WaitFor(ctx, next) }()
		select {
		case err := <-done:
			t.Fatalf("WaitFor(%d) returned %v before the event existed", next, err)
		default:
		}
		// A second writer's event (the release the alarm would append):
		// the waiter must wake for it.
		st, _, err := b.store.Execute(ctx, a.TaskID, "", aggregate.Cancel{Reason: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if st.LastSeq != next {
			t.Fatalf("append landed at %d, want %d", st.LastSeq, next)
		}
		if err := <-done; err != nil {
			t.Fatalf("WaitFor(%d) = %v", next, err)
		}
		if got := b.engine.Applied(); got < uint64(next) {
			t.Fatalf("Applied = %d after WaitFor(%d)", got, next)
		}
		if s, _ := b.engine.Task(a.TaskID); s.Status != aggregate.StatusCanceled {
			t.Fatalf("status after WaitFor = %s, want canceled", s.Status)
		}
	})
}

func TestEngineCatchUp(t *testing.T) {
	t.Parallel()

	t.Run("ExistingLog", func(t *testing.T) {
		t.Parallel()
		b := setupLog(t)
		root := b.schedule(t, "cust", nil, time.Time{})
		child := b.schedule(t, "cust", &root, time.Time{})
		grand := b.schedule(t, "cust", &child, time.Time{})
		target := lastSeq(t, b.store.Stream())

		if b.engine.CaughtUp() {
			t.Fatal("CaughtUp before Run")
		}
		if _, err := b.engine.Ancestors(grand.TaskID); !errors.Is(err, projections.ErrNotReady) {
			t.Fatalf("Ancestors before catch-up = %v, want ErrNotReady", err)
		}
		run(t, b.engine)
		eventually(t, "catch-up", b.engine.CaughtUp)
		if got := b.engine.Applied(); got < target {
			t.Fatalf("caught up with Applied %d < last seq %d", got, target)
		}
		anc, err := b.engine.Ancestors(grand.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if len(anc) != 2 || anc[0].TaskID != child.TaskID || anc[1].TaskID != root.TaskID {
			t.Fatalf("Ancestors(grandchild) = %v, want [child root]", taskIDs(anc))
		}
		if anc, err := b.engine.Ancestors(root.TaskID); err != nil || len(anc) != 0 {
			t.Fatalf("Ancestors(root) = %v, %v", taskIDs(anc), err)
		}
		if got := b.engine.Children(root.TaskID); !slices.Equal(got, []string{child.TaskID}) {
			t.Fatalf("Children(root) = %v", got)
		}
		// TerminalAncestor: none while the lineage is live; the root once
		// it is canceled, for every descendant but not for itself.
		if id, _, found := b.engine.TerminalAncestor(grand.TaskID); found {
			t.Fatalf("TerminalAncestor of a live lineage = %s", id)
		}
		st, _, err := b.store.Execute(context.Background(), root.TaskID, "", aggregate.Cancel{})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.engine.WaitFor(context.Background(), st.LastSeq); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{child.TaskID, grand.TaskID} {
			if got, status, found := b.engine.TerminalAncestor(id); !found || got != root.TaskID || status != aggregate.StatusCanceled {
				t.Fatalf("TerminalAncestor(%s) = %s %s %v, want the canceled root", id, got, status, found)
			}
		}
		for _, id := range []string{root.TaskID, "no-such-task"} {
			if got, _, found := b.engine.TerminalAncestor(id); found {
				t.Fatalf("TerminalAncestor(%s) = %s", id, got)
			}
		}
	})

	t.Run("EmptyLog", func(t *testing.T) {
		t.Parallel()
		b := setupLog(t)
		if b.engine.CaughtUp() {
			t.Fatal("CaughtUp before Run")
		}
		run(t, b.engine)
		eventually(t, "catch-up on an empty log", b.engine.CaughtUp)
		a := b.schedule(t, "cust", nil, time.Time{})
		if err := b.engine.WaitFor(context.Background(), a.LastSeq); err != nil {
			t.Fatal(err)
		}
		if n, _ := b.engine.Admissions("cust", time.Time{}); n != 1 {
			t.Fatalf("active roots = %d, want 1", n)
		}
	})
}

func taskIDs(states []aggregate.State) []string {
	out := make([]string, len(states))
	for i, s := range states {
		out[i] = s.TaskID
	}
	return out
}

// offline feeds hand-made events to an engine through Apply, as an
// offline tool would; it needs no stream.
type offline struct {
	t   *testing.T
	e   *projections.Engine
	seq events.Position
	at  time.Time
	num map[string]int // events per task so far
}

func newOffline(t *testing.T) *offline {
	return &offline{t: t, e: mustEngine(projections.Config{Logger: testLogger(t)}), at: time.Unix(1_700_000_000, 0).UTC(), num: map[string]int{}}
}

func (o *offline) apply(taskID, customerID string, p events.Payload) {
	o.t.Helper()
	o.seq++
	o.at = o.at.Add(time.Second)
	o.num[taskID]++
	data, err := events.Encode(events.Event{
		ID: fmt.Sprintf("e%d", o.seq), TaskID: taskID, CustomerID: customerID, Number: o.num[taskID], At: o.at, Data: p,
	})
	if err != nil {
		o.t.Fatal(err)
	}
	o.e.Apply(o.seq, data)
}

func (o *offline) schedule(taskID, parentID, rootID string) {
	o.t.Helper()
	o.apply(taskID, "cust", events.TaskScheduled{Spec: events.TaskSpec{
		RootID: rootID, ParentID: parentID, Queue: "q", TimeoutSeconds: 60, RunAt: o.at,
	}})
}

func TestEngineApply(t *testing.T) {
	t.Parallel()

	t.Run("ChildReportWaitsForItsOwnParent", func(t *testing.T) {
		t.Parallel()
		o := newOffline(t)
		o.schedule("parent", "", "parent")
		o.schedule("other", "", "other")
		o.schedule("child", "parent", "parent")
		o.apply("child", "cust", events.Canceled{Reason: "done"})
		if n := o.e.TimerLen(projections.Report); n != 1 {
			t.Fatalf("Report queue holds %d, want the terminal child", n)
		}
		// A message that merely carries the child's report id, on another
		// task, does not report the child to its parent.
		o.apply("other", "cust", events.MailboxAppended{Index: 1, Message: events.Message{ID: events.ChildResultID("child")}})
		if n := o.e.TimerLen(projections.Report); n != 1 {
			t.Fatalf("Report queue holds %d after a look-alike message on another task, want 1", n)
		}
		o.apply("parent", "cust", events.MailboxAppended{Index: 1, Message: events.Message{ID: events.ChildResultID("child")}})
		if n := o.e.TimerLen(projections.Report); n != 0 {
			t.Fatalf("Report queue holds %d after the parent got the report, want 0", n)
		}
	})

	t.Run("TerminalParentDropsReports", func(t *testing.T) {
		t.Parallel()
		o := newOffline(t)
		o.schedule("parent", "", "parent")
		o.schedule("c1", "parent", "parent")
		o.schedule("c2", "parent", "parent")
		o.apply("c1", "cust", events.ResultRecorded{Result: events.Result{Success: true}})
		if n := o.e.TimerLen(projections.Report); n != 1 {
			t.Fatalf("Report queue holds %d, want 1", n)
		}
		o.apply("parent", "cust", events.Canceled{})
		if n := o.e.TimerLen(projections.Report); n != 0 {
			t.Fatalf("Report queue holds %d after the parent ended, want 0", n)
		}
		o.apply("c2", "cust", events.Canceled{})
		if n := o.e.TimerLen(projections.Report); n != 0 {
			t.Fatalf("child of a terminal parent queued for a report (%d)", n)
		}
		if n, _ := o.e.Admissions("cust", time.Time{}); n != 0 {
			t.Fatalf("active roots = %d, want 0", n)
		}
	})

	t.Run("UndecodableSkipped", func(t *testing.T) {
		t.Parallel()
		o := newOffline(t)
		o.schedule("a", "", "a")
		o.seq++
		o.e.Apply(o.seq, []byte("not msgpack at all"))
		o.schedule("b", "", "b")
		if o.e.Undecodable() != 1 || o.e.Applied() != uint64(o.seq) {
			t.Fatalf("Undecodable = %d, Applied = %d (want 1, %d)", o.e.Undecodable(), o.e.Applied(), o.seq)
		}
		if n, _ := o.e.Admissions("cust", time.Time{}); n != 2 {
			t.Fatalf("active roots = %d, want 2", n)
		}
	})
}
