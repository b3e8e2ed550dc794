package projections_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// liveNode is a running scheduler node; stop ends it (once).
type liveNode struct {
	ns   testnats.Namespace
	node *node.Node
	stop func()
}

func startNode(t *testing.T, retain, shards int) *liveNode {
	t.Helper()
	n := testnode.Start(t, func(c *node.Config) {
		c.Logger = testLogger(t)
		c.Shards = shards
		// One customer is capped so the traffic includes a rejection.
		c.Admission = scheduler.Admission{PerCustomer: map[string]scheduler.Quota{capped: {MaxActiveRoots: 1}}}
		c.Retain = retain
	})
	return &liveNode{ns: n.NS, node: n.Node, stop: n.Stop}
}

// capped may have one active root at a time.
const capped = "capped"

var (
	customers = []string{"acme", "globex", "initech"}
	queues    = []string{"q0", "q1"}
)

// traffic drives a mixed workload through the node's service: roots,
// children and grandchildren on three customers and two queues, delayed
// tasks, claims with successful and failed results, cancels, mailbox
// messages and stop checks, and one run that times out.
type traffic struct {
	t   *testing.T
	svc *scheduler.Service
	eng *projections.Engine
}

func (tr *traffic) schedule(customer, queue, parent string, delay float64, timeout int) aggregate.State {
	tr.t.Helper()
	req := scheduler.ScheduleRequest{
		CustomerID: customer, ParentID: parent, Queue: queue,
		Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "work for " + customer}}},
	}
	if parent == "" { // children carry none: the index holds labeled and unlabeled tasks
		req.Labels = map[string]string{"customer": customer, "queue": queue}
	}
	if delay > 0 {
		req.DelaySeconds = &delay
	}
	if timeout > 0 {
		req.TimeoutSeconds = &timeout
	}
	st, created, err := tr.svc.Schedule(context.Background(), scheduler.Operator, req)
	if err != nil || !created {
		tr.t.Fatalf("schedule %+v: created=%v err=%v", req, created, err)
	}
	return st
}

// status reads a task from the log: retention may have evicted it from
// the projections.
func (tr *traffic) status(id string) aggregate.Status {
	s, err := tr.svc.Get(context.Background(), scheduler.Operator, id)
	if err != nil {
		tr.t.Fatal(err)
	}
	return s.Status
}

func (tr *traffic) waitStatus(id string, want aggregate.Status) {
	tr.t.Helper()
	eventually(tr.t, fmt.Sprintf("task %s %s", id, want), func() bool { return tr.status(id) == want })
}

// reportEffects reports effects of a running task. The run may time out
// first: a timeout settles the task the same way in both projections.
func (tr *traffic) reportEffects(id, deliveryID string, effects ...events.Effect) {
	tr.t.Helper()
	_, err := tr.svc.ReportEffects(context.Background(), scheduler.Operator, id, deliveryID, effects)
	if err != nil && !errors.Is(err, aggregate.ErrTerminal) {
		tr.t.Fatalf("report effects of %s: %v", id, err)
	}
}

func (tr *traffic) run() {
	t, ctx, p := tr.t, context.Background(), scheduler.Operator
	var roots, immediate, shortDelay, farDelay []string
	hasChildren := map[string]bool{}
	for i := range 60 {
		c, q := customers[i%3], queues[i%2]
		root := tr.schedule(c, q, "", 0, 0)
		child := tr.schedule(c, queues[(i+1)%2], root.TaskID, 0, 0)
		roots, hasChildren[root.TaskID] = append(roots, root.TaskID), true
		immediate = append(immediate, root.TaskID, child.TaskID)
		if i%3 == 0 {
			immediate = append(immediate, tr.schedule(c, q, root.TaskID, 0, 0).TaskID)
		}
		if i%2 == 0 {
			grand := tr.schedule(c, q, child.TaskID, 0, 0)
			immediate, hasChildren[child.TaskID] = append(immediate, grand.TaskID), true
		}
	}
	for i := range 15 {
		farDelay = append(farDelay, tr.schedule(customers[i%3], queues[i%2], "", 3600, 0).TaskID)
	}
	// A child of a delayed root, itself due now.
	immediate = append(immediate, tr.schedule(customers[0], queues[0], farDelay[0], 0, 0).TaskID)
	// Admission: the capped customer's second live root is rejected,
	// persisted as canceled.
	tr.schedule(capped, queues[0], "", 3600, 0)
	_, _, err := tr.svc.Schedule(ctx, p, scheduler.ScheduleRequest{CustomerID: capped, Queue: queues[0]})
	var rejected *scheduler.AdmissionError
	if !errors.As(err, &rejected) || rejected.Task.Status != aggregate.StatusCanceled {
		t.Fatalf("second root of the capped customer: %v", err)
	}
	for i := range 6 {
		shortDelay = append(shortDelay, tr.schedule(customers[i%3], queues[i%2], "", 0.2, 0).TaskID)
	}
	for _, id := range immediate {
		tr.waitStatus(id, aggregate.StatusQueued)
	}

	// Claims: some report effects as they go; some succeed, some fail, the
	// rest keep running.
	for k := range 50 {
		q := queues[k%2]
		st, ok, err := tr.svc.ClaimNext(ctx, p, q, fmt.Sprintf("w-%s-%d", q, k), 5*time.Second)
		if err != nil || !ok {
			t.Fatalf("claim next on %s: ok=%v err=%v", q, ok, err)
		}
		if k%2 == 0 {
			tr.reportEffects(st.TaskID, st.Claim.DeliveryID, events.Effect{Kind: "pull_request", Ref: "#" + fmt.Sprint(k), Uncertain: true},
				events.Effect{Kind: "comment", Ref: fmt.Sprint(k)})
		}
		switch k % 3 {
		case 0:
			_, err = tr.svc.RecordResult(ctx, p, st.TaskID, st.Claim.DeliveryID, events.Result{Success: true, Summary: "done",
				Effects: []events.Effect{{Kind: "pull_request", Ref: "#" + fmt.Sprint(k)}}})
		case 1:
			_, err = tr.svc.RecordResult(ctx, p, st.TaskID, st.Claim.DeliveryID, events.Result{Error: "boom"})
		}
		if err != nil {
			t.Fatalf("record result %s: %v", st.TaskID, err)
		}
	}

	// Cancels: a root with children that is still live, a few queued
	// tasks, a delayed root (leaves the release queue).
	canceledRoot := ""
	for _, id := range roots {
		if s := tr.status(id); !s.Terminal() && hasChildren[id] {
			canceledRoot = id
			break
		}
	}
	if canceledRoot == "" {
		t.Fatal("no live root with children to cancel")
	}
	toCancel := []string{canceledRoot, farDelay[1]}
	for _, id := range immediate {
		if len(toCancel) == 12 {
			break
		}
		if tr.status(id) == aggregate.StatusQueued && !slices.Contains(toCancel, id) {
			toCancel = append(toCancel, id)
		}
	}
	for _, id := range toCancel {
		if _, err := tr.svc.Cancel(ctx, p, id, "no longer needed"); err != nil {
			t.Fatalf("cancel %s: %v", id, err)
		}
	}
	if _, err := tr.svc.Cancel(ctx, p, canceledRoot, "again"); !errors.Is(err, aggregate.ErrTerminal) {
		t.Fatalf("second cancel = %v, want ErrTerminal", err)
	}

	// Mailbox: follow-ups on live tasks (one repeated by id), a rejected
	// one on a terminal task, and stop checks that advance the cursor.
	mailed := 0
	for i, id := range immediate {
		if mailed == 20 {
			break
		}
		if tr.status(id).Terminal() {
			continue
		}
		msg := events.Message{ID: fmt.Sprintf("m-%d", i), Content: []events.ContentPart{{Type: "text", Text: "also this"}}}
		for range 2 {
			if _, _, err := tr.svc.AppendMail(ctx, p, id, msg); err != nil {
				t.Fatalf("append mail %s: %v", id, err)
			}
		}
		if mailed%2 == 0 { // as the claim's holder, when one runs it: only its check moves the cursor
			st, err := tr.svc.Get(ctx, p, id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tr.svc.Check(ctx, p, id, st.Claim.DeliveryID); err != nil {
				t.Fatal(err)
			}
		}
		mailed++
	}
	if _, _, err := tr.svc.AppendMail(ctx, p, canceledRoot, events.Message{ID: "late"}); !errors.Is(err, aggregate.ErrTerminal) {
		t.Fatalf("mail on a canceled task = %v, want ErrTerminal", err)
	}

	// A run that times out.
	q := tr.schedule(customers[1], queues[0], "", 0, 1)
	tr.waitStatus(q.TaskID, aggregate.StatusQueued)
	got, err := tr.svc.Get(ctx, p, q.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.svc.Claim(ctx, p, q.TaskID, got.Delivery.ID, "w-slow"); err != nil {
		t.Fatal(err)
	}
	tr.reportEffects(q.TaskID, got.Delivery.ID, events.Effect{Kind: "comment", Ref: "slow"})
	tr.waitStatus(q.TaskID, aggregate.StatusTimedOut)
	// Released: queued, or, handed to one of the claims above that was
	// waiting as it fell due, claimed.
	for _, id := range shortDelay {
		eventually(t, "task "+id+" released", func() bool { return tr.status(id) != aggregate.StatusScheduled })
	}
}

// projected is s as Engine.Task has it: of the spec only the root,
// parent, queue, runAt and, until the ready notification is published,
// the signal; no LastHash.
func projected(s aggregate.State) aggregate.State {
	spec := events.TaskSpec{RootID: s.Spec.RootID, ParentID: s.Spec.ParentID, Queue: s.Spec.Queue, RunAt: s.Spec.RunAt, Labels: s.Spec.Labels}
	if s.Status == aggregate.StatusScheduled {
		spec.Signal = s.Spec.Signal
	}
	s.Spec = spec
	s.LastHash = events.Hash{} // only the store's appends need it
	return s
}

// quiescent: the engine applied the whole log and the alarm has nothing
// due (running deadlines and far releases are not due).
func quiescent(t *testing.T, e *projections.Engine, st *store.Store) bool {
	if e.Applied() != logSeqs(t, st) {
		return false
	}
	now := time.Now()
	for _, tm := range []projections.Timer{projections.Release, projections.Deliver, projections.Report} {
		if len(e.Due(tm, now, 1, nil)) > 0 {
			return false
		}
	}
	return true
}

// logSeqs returns the sum of the last stream sequences of st's shards
// (with one shard, its last sequence): what Engine.Applied reaches once
// it has applied the whole log.
func logSeqs(t *testing.T, st *store.Store) uint64 {
	t.Helper()
	last, err := st.LastPositions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, pos := range last {
		_, seq := st.Shards().Split(pos)
		n += seq
	}
	return n
}

// rebuild builds a fresh engine on the stream and runs it until it holds
// the whole log.
func rebuild(t *testing.T, ns testnats.Namespace, last uint64, retain int) *projections.Engine {
	t.Helper()
	return rebuildShards(t, ns, events.Shards{}, last, retain)
}

// rebuildShards is rebuild of a log of shards; last is what Applied
// reaches once the whole log is applied (logSeqs).
func rebuildShards(t *testing.T, ns testnats.Namespace, shards events.Shards, last uint64, retain int) *projections.Engine {
	t.Helper()
	js, err := jetstream.New(testnats.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	fresh := mustEngine(projections.Config{Log: eventlog.Log{JS: js, Stream: ns.Stream, Subjects: ns.Subjects, Shards: shards}, Shards: shards, Logger: testLogger(t), Retain: retain})
	run(t, fresh)
	eventually(t, "rebuild caught up", func() bool { return fresh.CaughtUp() && fresh.Applied() == last })
	return fresh
}

// sameProjection compares every read of two engines.
func sameProjection(t *testing.T, live, fresh *projections.Engine) {
	t.Helper()
	if l, f := live.Digest(), fresh.Digest(); l != f {
		t.Errorf("Digest: live %s, rebuilt %s", l, f)
	}
	all := live.List(projections.Filter{}, "", 1<<30)
	if got := fresh.List(projections.Filter{}, "", 1<<30); !slices.Equal(taskIDs(all), taskIDs(got)) {
		t.Fatalf("List: live %d tasks, rebuilt %d", len(all), len(got))
	}
	for _, c := range customers {
		f := projections.Filter{Labels: map[string]string{"customer": c, "queue": queues[0]}}
		if l, r := live.List(f, "", 1<<30), fresh.List(f, "", 1<<30); !slices.Equal(taskIDs(l), taskIDs(r)) {
			t.Errorf("List by labels of %s: live %v, rebuilt %v", c, taskIDs(l), taskIDs(r))
		}
	}
	for _, s := range all {
		l, _ := live.Task(s.TaskID)
		f, ok := fresh.Task(s.TaskID)
		if !ok || !reflect.DeepEqual(l, f) {
			t.Errorf("Task %s:\nlive    %+v\nrebuilt %+v", s.TaskID, l, f)
		}
		if l, f := live.Children(s.TaskID), fresh.Children(s.TaskID); !slices.Equal(l, f) {
			t.Errorf("Children %s: live %v, rebuilt %v", s.TaskID, l, f)
		}
	}
	now := time.Now()
	for _, c := range append(customers, capped, "nobody") {
		for _, since := range []time.Time{{}, now.Add(-projections.AdmissionWindow), now.Add(-time.Second)} {
			la, lr := live.Admissions(c, since)
			fa, fr := fresh.Admissions(c, since)
			if la != fa || lr != fr {
				t.Errorf("Admissions %s since %v: live %d active %d recent, rebuilt %d and %d", c, since, la, lr, fa, fr)
			}
		}
	}
	for tm := range projections.NumTimers {
		if l, f := live.TimerLen(tm), fresh.TimerLen(tm); l != f {
			t.Errorf("TimerLen %s: live %d, rebuilt %d", tm, l, f)
		}
	}
	le, lok := live.Earliest()
	fe, fok := fresh.Earliest()
	if lok != fok || !le.Equal(fe) {
		t.Errorf("Earliest: live %v %v, rebuilt %v %v", le, lok, fe, fok)
	}
	if l, f := live.QueueCounts(), fresh.QueueCounts(); !reflect.DeepEqual(l, f) {
		t.Errorf("QueueCounts: live %v, rebuilt %v", l, f)
	}
	if fresh.Undecodable() != live.Undecodable() {
		t.Errorf("Undecodable: live %d, rebuilt %d", live.Undecodable(), fresh.Undecodable())
	}
}

func TestRebuildEqualsLive(t *testing.T) {
	t.Parallel()
	rebuildEqualsLive(t, 1)
}

// With three shards the same traffic spreads over three streams, each
// lineage in one, and a rebuild that follows all three folds the same
// projections as the live engine did.
func TestShardedRebuildEqualsLive(t *testing.T) {
	t.Parallel()
	rebuildEqualsLive(t, 3)
}

func rebuildEqualsLive(t *testing.T, shards int) {
	ln := startNode(t, -1, shards)
	live, st := ln.node.Engine, ln.node.Store
	(&traffic{t: t, svc: ln.node.Service, eng: live}).run()
	eventually(t, "quiescence", func() bool { return quiescent(t, live, st) })

	// The live projection agrees with the aggregate replayed from the log.
	all := live.List(projections.Filter{}, "", 1<<30)
	if len(all) < 190 {
		t.Fatalf("only %d tasks projected", len(all))
	}
	statuses, reports, merged := map[aggregate.Status]int{}, 0, 0
	for _, s := range all {
		statuses[s.Status]++
		if len(s.Effects) == 2 && s.Status == aggregate.StatusSucceeded && !s.Effects[0].Uncertain {
			merged++ // the result's certain pull request replaced the uncertain report
		}
		for _, id := range s.MailIDs {
			if strings.HasPrefix(id, "child-") {
				reports++
			}
		}
		want, err := st.Load(context.Background(), s.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if shard, _ := st.Shards().Split(want.FirstSeq); shard != st.Shards().Of(want.CustomerID, want.Spec.RootID) {
			t.Errorf("task %s of root %s in shard %d, want its root's", s.TaskID, want.Spec.RootID, shard)
		}
		if want = projected(want); !reflect.DeepEqual(s, want) {
			t.Errorf("task %s:\nprojected %+v\nreplayed  %+v", s.TaskID, s, want)
		}
	}
	// The label index answers what a scan of every task would.
	for _, c := range customers {
		for _, q := range queues {
			want := map[string]string{"customer": c, "queue": q}
			var scanned []string
			for _, s := range all {
				if reflect.DeepEqual(s.Spec.Labels, want) {
					scanned = append(scanned, s.TaskID)
				}
			}
			indexed := taskIDs(live.List(projections.Filter{Labels: want}, "", 1<<30))
			if len(scanned) == 0 || !slices.Equal(indexed, scanned) {
				t.Errorf("labels %v: index %v, scan %v", want, indexed, scanned)
			}
		}
	}
	for _, want := range []aggregate.Status{aggregate.StatusScheduled, aggregate.StatusQueued, aggregate.StatusRunning,
		aggregate.StatusSucceeded, aggregate.StatusFailed, aggregate.StatusCanceled, aggregate.StatusTimedOut} {
		if statuses[want] == 0 {
			t.Errorf("traffic left no task %s (%v)", want, statuses)
		}
	}
	if reports == 0 {
		t.Error("no child result reached a parent's mailbox")
	}
	if merged == 0 {
		t.Error("no result's effects merged with the effects reported before it")
	}
	if live.TimerLen(projections.Release) == 0 || live.TimerLen(projections.Expire) == 0 {
		t.Errorf("expected far releases and running deadlines in the timer queues: release %d, expire %d",
			live.TimerLen(projections.Release), live.TimerLen(projections.Expire))
	}

	last, err := st.LastPositions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, pos := range last {
		if pos == 0 {
			t.Errorf("shard %d of %d holds no event", i, shards)
		}
	}
	ln.stop()
	if live.Applied() != logSeqs(t, st) {
		t.Fatalf("log moved after quiescence: applied %d, last %d", live.Applied(), logSeqs(t, st))
	}
	sameProjection(t, live, rebuildShards(t, ln.ns, st.Shards(), logSeqs(t, st), -1))
}

// With a small retention the same traffic evicts most finished lineages;
// every task of a lineage still open stays, and a rebuild from the log
// evicts exactly the same tasks.
func TestRetentionRebuildEqualsLive(t *testing.T) {
	t.Parallel()
	retentionRebuildEqualsLive(t, 1)
}

// With three shards retention evicts the same tasks live and in a
// rebuild, though the shards' events interleave differently in each.
func TestShardedRetentionRebuildEqualsLive(t *testing.T) {
	t.Parallel()
	retentionRebuildEqualsLive(t, 3)
}

func retentionRebuildEqualsLive(t *testing.T, shards int) {
	const retain = 8
	ln := startNode(t, retain, shards)
	live, st := ln.node.Engine, ln.node.Store
	(&traffic{t: t, svc: ln.node.Service, eng: live}).run()
	eventually(t, "quiescence", func() bool { return quiescent(t, live, st) })
	ln.stop()

	states := map[string]aggregate.State{}
	if err := st.Log().Events(context.Background(), eventlog.ReadOptions{}, func(ev events.Event) error {
		states[ev.TaskID] = aggregate.Apply(states[ev.TaskID], ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	openRoots := map[string]bool{}
	for _, s := range states {
		if !s.Status.Terminal() {
			openRoots[s.Spec.RootID] = true
		}
	}
	kept, finished := 0, 0
	for id, s := range states {
		_, ok := live.Task(id)
		switch {
		case openRoots[s.Spec.RootID] && !ok:
			t.Errorf("task %s of an open lineage was evicted", id)
		case !openRoots[s.Spec.RootID]:
			finished++
			if ok {
				kept++
			}
		}
	}
	if finished <= retain {
		t.Fatalf("the traffic finished only %d tasks' lineages; nothing to evict", finished)
	}
	// Whole lineages (of at most four tasks here) are evicted, so the
	// finished ones kept are the newest that fit in retain (in each
	// shard, its even share of it).
	all := live.List(projections.Filter{}, "", 1<<30)
	if maxKept := (retain + shards - 1) / shards * shards; kept > maxKept || kept <= retain-4*shards || len(all) == len(states) {
		t.Errorf("%d tasks of %d kept, %d of them of finished lineages (retain %d)", len(all), len(states), kept, retain)
	}
	sameProjection(t, live, rebuildShards(t, ln.ns, st.Shards(), logSeqs(t, st), retain))
}

func TestUndecodableEventSkipped(t *testing.T) {
	t.Parallel()
	b := setupLog(t)
	run(t, b.engine)
	ctx := context.Background()
	a := b.schedule(t, "cust", nil, time.Time{})
	ack, err := b.store.JetStream().Publish(ctx, b.ns.Subjects.Event("cust", a.TaskID), []byte("\xc1garbage"))
	if err != nil {
		t.Fatal(err)
	}
	c := b.schedule(t, "cust", nil, time.Time{})
	if c.LastSeq <= events.Position(ack.Sequence) {
		t.Fatalf("later task at %d, garbage at %d", c.LastSeq, ack.Sequence)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := b.engine.WaitFor(wctx, c.LastSeq); err != nil {
		t.Fatalf("WaitFor past the garbage: %v", err)
	}
	if n := b.engine.Undecodable(); n != 1 {
		t.Fatalf("Undecodable = %d, want 1", n)
	}
	if n, q := b.engine.Quarantined(10); n != 1 || len(q) != 1 || q[0].Pos != events.Position(ack.Sequence) || !strings.Contains(q[0].Reason, "malformed") {
		t.Fatalf("Quarantined = %d %+v, want the garbage at %d", n, q, ack.Sequence)
	}
	if s, ok := b.engine.Task(c.TaskID); !ok || s.Status != aggregate.StatusScheduled {
		t.Fatalf("task after the garbage: %+v %v", s, ok)
	}
	if s, _ := b.engine.Task(a.TaskID); s.Version != 1 || s.LastSeq != a.LastSeq {
		t.Fatalf("garbage changed task %s: version %d last seq %d", a.TaskID, s.Version, s.LastSeq)
	}
	if got, _ := b.engine.Admissions("cust", time.Time{}); got != 2 {
		t.Fatalf("active roots = %d, want 2", got)
	}
	// A rebuild skips the same event and ends in the same place.
	sameProjection(t, b.engine, rebuild(t, b.ns, uint64(c.LastSeq), 0))
	// So does an online rebuild, which keeps the quarantine.
	if err := b.engine.Rebuild(wctx, nil); err != nil {
		t.Fatal(err)
	}
	if n, q := b.engine.Quarantined(10); n != 1 || len(q) != 1 || q[0].Pos != events.Position(ack.Sequence) {
		t.Fatalf("Quarantined after an online rebuild = %d %+v, want the garbage at %d", n, q, ack.Sequence)
	}
}
