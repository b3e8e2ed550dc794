package node_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// epochClock is a clock an hour-long epoch period apart from real time
// that the test moves on a period at a time. It starts a minute into a
// period, five periods before now, so it never crosses a period by
// itself during a test and never runs ahead of real time.
type epochClock struct {
	start, base time.Time
	shift       atomic.Int64
}

const testPeriod = time.Hour

func newEpochClock() *epochClock {
	now := time.Now()
	return &epochClock{start: now, base: now.Truncate(testPeriod).Add(-5*testPeriod + time.Minute)}
}

func (c *epochClock) Now() time.Time {
	return c.base.Add(time.Since(c.start) + time.Duration(c.shift.Load()))
}

func (c *epochClock) next() { c.shift.Add(int64(testPeriod)) }

// withEpochs gives a node a log with two epoch slots on clock c.
func withEpochs(c *epochClock) testnode.Option {
	return func(cfg *node.Config) {
		cfg.EpochSlots, cfg.EpochPeriod, cfg.EpochRetain, cfg.EpochCheck = 2, testPeriod, 1, 20*time.Millisecond
		cfg.Now = c.Now
	}
}

// TestEpochs runs a log with two epoch slots through their life: new
// lineages start in the current epoch and children in their root's, a
// repeated request finds its task in the older epoch, an epoch whose
// period is over is sealed only once its lineages ended (and stays so
// across a restart), and once removed
// its slot takes a later epoch whose positions continue; a node started
// afresh on the log afterwards rebuilds what is left and the log
// verifies clean.
func TestEpochs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newEpochClock()
	n := testnode.Start(t, withEpochs(clock))
	shards := n.Store.Shards()
	if shards.Slots != 2 || shards.N() != 3 {
		t.Fatalf("shards %+v, want one shard and two epoch slots", shards)
	}
	slotOf := func(id string) int {
		t.Helper()
		h, err := n.Client.History(ctx, id)
		if err != nil || len(h.Events) == 0 {
			t.Fatalf("history of %s: %v", id, err)
		}
		part, _ := shards.Split(events.Position(h.Events[0].Seq))
		slot, ok := shards.SlotOf(part)
		if !ok {
			t.Fatalf("task %s is in part %d, not in an epoch slot", id, part)
		}
		return slot
	}
	schedule := func(req api.ScheduleRequest) api.Task {
		t.Helper()
		req.Queue = "epochs"
		task, _, err := n.Client.Schedule(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	finish := func(id string) {
		t.Helper()
		task, err := n.Client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for task.Delivery == nil || task.Delivery.ID == "" {
			if time.Now().After(deadline) {
				t.Fatalf("task %s never became claimable: %+v", id, task)
			}
			time.Sleep(10 * time.Millisecond)
			if task, err = n.Client.Get(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.Client.Claim(ctx, id, task.Delivery.ID, "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Client.RecordResult(ctx, id, api.ResultRequest{DeliveryID: task.Delivery.ID, Success: true}); err != nil {
			t.Fatal(err)
		}
	}

	first := waitEpochs(t, n, "first epoch", func(e eventlog.Epochs) bool { return e.Current == 0 })
	n0 := first.Slots[0].Epoch
	root := schedule(api.ScheduleRequest{RequestID: "r1"})
	child := schedule(api.ScheduleRequest{ParentID: root.ID})
	done := schedule(api.ScheduleRequest{})
	finish(done.ID)
	if slotOf(root.ID) != 0 || slotOf(child.ID) != 0 {
		t.Fatal("the first epoch's tasks are not in slot 0")
	}

	clock.next()
	waitEpochs(t, n, "the second epoch opened", func(e eventlog.Epochs) bool { return e.Current == 1 && e.Slots[1].Epoch == n0+1 })
	waitStoreEpoch(t, n, 1)
	later := schedule(api.ScheduleRequest{})
	child2 := schedule(api.ScheduleRequest{ParentID: root.ID})
	again, created, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "epochs", RequestID: "r1"})
	if err != nil || created || again.ID != root.ID {
		t.Fatalf("repeated request in the next epoch: %s created %v (%v), want the first epoch's %s", again.ID, created, err, root.ID)
	}
	if slotOf(later.ID) != 1 || slotOf(child2.ID) != 0 {
		t.Fatalf("new root in slot %d, want 1; child of the old root in slot %d, want 0", slotOf(later.ID), slotOf(child2.ID))
	}

	// Past its retention the first epoch is sealed only once its lineage
	// ended: checks while the lineage is open leave it open.
	clock.next()
	for range 10 {
		time.Sleep(40 * time.Millisecond) // two epoch checks
		if e, _, _ := eventlog.ReadEpochs(ctx, n.Store.JetStream(), n.NS.Stream); e.Slots[0].State != eventlog.SlotOpen {
			t.Fatalf("slot 0 is %s while its lineage runs", e.Slots[0].State)
		}
	}
	for _, id := range []string{child.ID, child2.ID, root.ID} {
		finish(id)
	}
	waitEpochs(t, n, "the first epoch sealed", func(e eventlog.Epochs) bool { return e.Slots[0].State == eventlog.SlotSealed })
	js := n.Store.JetStream()
	sealed, err := js.Stream(ctx, shards.Stream(n.NS.Stream, shards.Part(0, 0)))
	if err != nil || !sealed.CachedInfo().Config.Sealed {
		t.Fatalf("slot 0's stream not sealed: %v", err)
	}
	last := sealed.CachedInfo().State.LastSeq
	waitStoreSealed := time.Now().Add(10 * time.Second)
	for {
		stats, err := n.Client.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ep := stats.Epochs; ep != nil && len(ep.Slots) == 2 && ep.Slots[0].State == eventlog.SlotSealed && ep.Slots[0].Sealed != nil && *ep.Slots[0].Epoch == n0 && ep.Current == 1 {
			break
		}
		if time.Now().After(waitStoreSealed) {
			t.Fatalf("GET /v1/stats epochs %+v, want slot 0 sealed", stats.Epochs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Mail to a task of a sealed epoch is refused as to any ended task.
	if _, err := n.Client.AppendMail(ctx, root.ID, events.Message{ID: "late", Content: []events.ContentPart{{Type: "text", Text: "too late"}}}); !errors.Is(err, api.ErrTerminal) {
		t.Fatalf("mail to a sealed epoch's task: %v, want 409 terminal", err)
	}
	// A restart opens the sealed streams as they are.
	n.Stop()
	n = testnode.Start(t, testnode.On(n.NC, n.NS), withEpochs(clock))
	js = n.Store.JetStream()
	if _, err := n.Client.Get(ctx, root.ID); err != nil {
		t.Fatalf("a sealed epoch's task after a restart: %v", err)
	}

	log := n.Store.Log()
	if err := eventlog.RemoveEpoch(ctx, log, n0+1); err == nil {
		t.Fatal("the open second epoch was removed")
	}
	if err := eventlog.RemoveEpoch(ctx, log, n0); err != nil {
		t.Fatal(err)
	}
	e := waitEpochs(t, n, "the third epoch in the freed slot", func(e eventlog.Epochs) bool { return e.Current == 0 && e.Slots[0].Epoch == n0+2 })
	if len(e.Removed) != 1 || e.Removed[0] != n0 {
		t.Fatalf("removed epochs %v, want [%d]", e.Removed, n0)
	}
	fresh, err := js.Stream(ctx, shards.Stream(n.NS.Stream, shards.Part(0, 0)))
	if err != nil || fresh.CachedInfo().Config.Sealed || fresh.CachedInfo().Config.FirstSeq != last+1 {
		t.Fatalf("slot 0's new stream: %+v (%v), want unsealed from %d", fresh.CachedInfo().Config, err, last+1)
	}
	waitStoreEpoch(t, n, 0)
	third := schedule(api.ScheduleRequest{})
	finish(third.ID)
	h, err := n.Client.History(ctx, third.ID)
	if err != nil {
		t.Fatal(err)
	}
	if part, seq := shards.Split(events.Position(h.Events[0].Seq)); part != shards.Part(0, 0) || seq != last+1 {
		t.Fatalf("the third epoch's first event at part %d seq %d, want part %d seq %d", part, seq, shards.Part(0, 0), last+1)
	}

	nc, ns := n.NC, n.NS
	n.Stop()
	verifyClean(t, ctx, log)
	restarted := testnode.Start(t, testnode.On(nc, ns), withEpochs(clock), func(c *node.Config) { c.NoSnapshots = true })
	if _, err := restarted.Client.Get(ctx, third.ID); err != nil {
		t.Fatalf("the third epoch's task after a rebuild: %v", err)
	}
	if _, err := restarted.Client.Get(ctx, later.ID); err != nil {
		t.Fatalf("the second epoch's task after a rebuild: %v", err)
	}
	if m := restarted.Engine.Missing(); m != 0 {
		t.Fatalf("the rebuilt projections found %d sequences missing: the removed epoch's", m)
	}
}

// waitEpochs waits until the epochs of n's log are as ok wants them, and
// returns them; what says what it waits for.
func waitEpochs(t *testing.T, n *testnode.Node, what string, ok func(eventlog.Epochs) bool) eventlog.Epochs {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		e, _, err := eventlog.ReadEpochs(context.Background(), n.Store.JetStream(), n.NS.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if ok(e) {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: epochs %+v", what, e)
		}
	}
}

// waitStoreEpoch waits until n's store routes new lineages to slot.
func waitStoreEpoch(t *testing.T, n *testnode.Node, slot int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); n.Store.Epochs().Current != slot; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the store still routes to slot %d, want %d", n.Store.Epochs().Current, slot)
		}
	}
}

// verifyClean runs replay verify's checks over the whole log.
func verifyClean(t *testing.T, ctx context.Context, log eventlog.Log) {
	t.Helper()
	v := replay.NewVerifier(log.Subjects)
	v.Shard(log.Shards)
	for i := range log.Shards.N() {
		first, err := log.FirstSeq(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		v.StartAt(i, first)
	}
	if err := log.Read(ctx, eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := v.Report(); !r.Clean() {
		t.Fatalf("verify: %+v", r.Violations)
	}
}

// TestEmptyEpochRemoved: an epoch no lineage started in is sealed and
// removed without an archive, so the slot ring moves on by itself.
func TestEmptyEpochRemoved(t *testing.T) {
	t.Parallel()
	clock := newEpochClock()
	n := testnode.Start(t, withEpochs(clock))
	n0 := waitEpochs(t, n, "the first epoch", func(e eventlog.Epochs) bool { return e.Current == 0 }).Slots[0].Epoch
	clock.next()
	waitEpochs(t, n, "the second epoch", func(e eventlog.Epochs) bool { return e.Current == 1 })
	clock.next() // the first is past its retention, and empty
	waitEpochs(t, n, "the empty epoch removed and its slot taken by the third", func(e eventlog.Epochs) bool {
		return len(e.Removed) == 1 && e.Removed[0] == n0 && e.Current == 0 && e.Slots[0].Epoch == n0+2
	})
}
