package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
)

// TestRequestRepeatedAfterItsEpochWasRemoved repeats a request whose task
// was in an epoch since removed, while the node's projections still hold
// that task: the answer is a task that runs, or the old one, never a new
// task that the projections fold onto the old terminal one and so never
// release.
func TestRequestRepeatedAfterItsEpochWasRemoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newEpochClock()
	n := testnode.Start(t, withEpochs(clock))
	delay := 1.0
	req := api.ScheduleRequest{Queue: "epochs", RequestID: "again", DelaySeconds: &delay}
	first, _, err := n.Client.Schedule(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Client.Cancel(ctx, first.ID, "done"); err != nil {
		t.Fatal(err)
	}
	n0 := n.Store.Epochs().Slots[0].Epoch
	clock.next()
	waitEpochs(t, n, "the second epoch", func(e eventlog.Epochs) bool { return e.Current == 1 })
	clock.next()
	waitEpochs(t, n, "the first sealed", func(e eventlog.Epochs) bool { return e.Slots[0].State == eventlog.SlotSealed })
	if err := eventlog.RemoveEpoch(ctx, n.Store.Log(), n0); err != nil {
		t.Fatal(err)
	}
	waitEpochs(t, n, "the third epoch in slot 0", func(e eventlog.Epochs) bool { return e.Current == 0 && e.Slots[0].Epoch == n0+2 })
	waitStoreEpoch(t, n, 0)
	again, created, err := n.Client.Schedule(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		if again.ID != first.ID || again.Status != first.Status && again.Status != "canceled" {
			t.Fatalf("the repeat answered %+v", again)
		}
		return
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		task, err := n.Client.Get(ctx, again.ID)
		if err != nil {
			t.Fatal(err)
		}
		if task.Delivery != nil && task.Delivery.ID != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the repeat created task %s again, which is never released: %+v; the projections hold %+v", again.ID, task, func() any { s, _ := n.Engine.Task(again.ID); return s.Status }())
		}
	}
}

// TestRemovalStoppedIsFinished: a removal of an epoch stopped after it
// recorded the next sequences (a crash of the node removing an empty
// epoch, or of epoch remove) is finished by the epoch check, so the slot
// ring moves on.
func TestRemovalStoppedIsFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newEpochClock()
	n := testnode.Start(t, withEpochs(clock))
	js := n.Store.JetStream()
	n0 := n.Store.Epochs().Slots[0].Epoch
	clock.next()
	waitEpochs(t, n, "the second epoch", func(e eventlog.Epochs) bool { return e.Current == 1 })
	// The crash: slot 0 sealed and its next sequences recorded, no more.
	if err := eventlog.SealSlot(ctx, js, n.NS.Stream, n.Store.Shards(), 0, n0); err != nil {
		t.Fatal(err)
	}
	if _, err := eventlog.UpdateEpochs(ctx, js, n.NS.Stream, func(e *eventlog.Epochs) bool {
		e.Slots[0].NextSeqs = []uint64{1}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	clock.next()
	waitEpochs(t, n, "the removal finished and slot 0 taken by the third epoch", func(e eventlog.Epochs) bool {
		return len(e.Removed) == 1 && e.Removed[0] == n0 && e.Current == 0 && e.Slots[0].Epoch == n0+2
	})
}

// TestCheckOfASealedEpochsTask: a stop check of a task that ended with
// mail unread, once its epoch is sealed, still answers stop (terminal)
// with the mail: the cursor it cannot record in a sealed stream is no
// failure of the check.
func TestCheckOfASealedEpochsTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newEpochClock()
	n := testnode.Start(t, withEpochs(clock))
	task, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "epochs"})
	if err != nil {
		t.Fatal(err)
	}
	msg := events.Message{ID: "last", Content: []events.ContentPart{{Type: "text", Text: "last words"}}}
	if _, err := n.Client.AppendMail(ctx, task.ID, msg); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Client.Cancel(ctx, task.ID, "stop"); err != nil {
		t.Fatal(err)
	}
	clock.next()
	clock.next()
	waitEpochs(t, n, "the first epoch sealed", func(e eventlog.Epochs) bool { return e.Slots[0].State == eventlog.SlotSealed })
	ch, err := n.Client.Check(ctx, task.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if !ch.ShouldStop || ch.Reason != api.ReasonTerminal || len(ch.Messages) != 1 {
		t.Fatalf("check of a sealed epoch's task: %+v, want stop (terminal) with its one message", ch)
	}
}

// TestSnapshotFromBeforeARemoval: a snapshot taken while a task of the
// first epoch was open, restored after that epoch ended and was removed,
// lacks the task's end, which no stream holds any more: the node must not
// keep the task open (it would hold the slot's next epoch unsealed for
// good, and its timers would act on a task the log no longer has).
func TestSnapshotFromBeforeARemoval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newEpochClock()
	noAuto := func(c *node.Config) { c.SnapshotEvery, c.SnapshotInterval = 1<<40, time.Hour }
	n := testnode.Start(t, withEpochs(clock), noAuto)
	task, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "epochs"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Engine.SaveSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Client.Cancel(ctx, task.ID, "stop"); err != nil {
		t.Fatal(err)
	}
	n0 := n.Store.Epochs().Slots[0].Epoch
	clock.next()
	waitStoreEpoch(t, n, 1)
	clock.next()
	waitEpochs(t, n, "the first epoch sealed", func(e eventlog.Epochs) bool { return e.Slots[0].State == eventlog.SlotSealed })
	if err := eventlog.RemoveEpoch(ctx, n.Store.Log(), n0); err != nil {
		t.Fatal(err)
	}
	// The slot takes the third epoch, whose first task puts its stream's
	// end past the snapshot's position in it.
	waitStoreEpoch(t, n, 0)
	if _, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "epochs"}); err != nil {
		t.Fatal(err)
	}
	nc, ns := n.NC, n.NS
	n.Stop()
	n = testnode.Start(t, testnode.On(nc, ns), withEpochs(clock), noAuto)
	if st, ok := n.Engine.Task(task.ID); ok && !st.Status.Terminal() {
		t.Fatalf("after restoring a snapshot from before the removal the projections hold task %s %s", task.ID, st.Status)
	}
	if open := n.Engine.OpenIn(n.Store.Shards().SlotParts(0)); open != 1 {
		t.Fatalf("%d lineages open in slot 0, want 1: the third epoch's task", open)
	}
}
