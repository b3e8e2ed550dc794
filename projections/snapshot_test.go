package projections

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// snapshotLog is a small log touching every view: roots and a child,
// releases, a claim, a result, a cancel, mail, a child report pending.
func snapshotLog(t *testing.T) [][]byte {
	t.Helper()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var out [][]byte
	n := map[string]int{}
	add := func(task, cust string, p events.Payload) {
		n[task]++
		at = at.Add(time.Millisecond)
		b, err := events.Encode(events.Event{ID: task + "-" + string(p.EventType()), TaskID: task, CustomerID: cust, Number: n[task], At: at, Data: p})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	spec := func(root, parent string) events.TaskSpec {
		return events.TaskSpec{RootID: root, ParentID: parent, Queue: "q", RunAt: at, TimeoutSeconds: 60,
			Message: events.Message{CreatedAt: at, Content: []events.ContentPart{{Type: "text", Text: "x"}}}}
	}
	labeled := func(s events.TaskSpec, kv ...string) events.TaskSpec {
		s.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			s.Labels[kv[i]] = kv[i+1]
		}
		return s
	}
	add("r1", "a", events.TaskScheduled{Spec: labeled(spec("r1", ""), "repo", "x", "team", "a")})
	add("r1", "a", events.DeliveryPending{DeliveryID: "d1", Attempt: 1, NextAt: at})
	add("r1", "a", events.ReadyPublished{DeliveryID: "d1"})
	add("r1", "a", events.Claimed{DeliveryID: "d1", ExecutorID: "w", Deadline: at.Add(time.Minute)})
	add("c1", "a", events.TaskScheduled{Spec: labeled(spec("r1", "r1"), "repo", "x")})
	add("c1", "a", events.Canceled{Reason: "no"})
	add("r1", "a", events.MailboxAppended{Index: 1, Message: events.Message{ID: "m1", CreatedAt: at}})
	add("r2", "b", events.TaskScheduled{Spec: spec("r2", "")})
	add("r3", "b", events.AdmissionRejected{Spec: spec("r3", ""), Reason: "quota"})
	add("r4", "b", events.TaskScheduled{Spec: labeled(spec("r4", ""), "repo", "y")})
	add("r4", "b", events.DeliveryPending{DeliveryID: "d4", Attempt: 1, NextAt: at})
	add("r4", "b", events.ReadyPublished{DeliveryID: "d4"})
	add("r4", "b", events.Claimed{DeliveryID: "d4", ExecutorID: "w", Deadline: at.Add(time.Minute)})
	add("r4", "b", events.ResultRecorded{DeliveryID: "d4", Result: events.Result{Success: true, Effects: []events.Effect{{Kind: "pr"}}}})
	// A lineage that closes last: its child reports, then the root ends.
	add("r5", "a", events.TaskScheduled{Spec: spec("r5", "")})
	add("c5", "a", events.TaskScheduled{Spec: spec("r5", "r5")})
	add("c5", "a", events.Canceled{Reason: "no"})
	add("r5", "a", events.MailboxAppended{Index: 1, Message: events.Message{ID: "child-c5", CreatedAt: at}})
	add("r5", "a", events.Canceled{Reason: "done"})
	// Mail on a finished task, which may have been evicted by then.
	add("r4", "b", events.MailboxAppended{Index: 1, Message: events.Message{ID: "late", CreatedAt: at}})
	// A concurrency key with limit 2: r6 holds and runs, r8 held and
	// finished (its slot not yet released), r9 took a slot after it was
	// canceled, r7 waits; r10 held, finished and gave its slot back.
	kid := events.KeyID("a", "k")
	keyed := func(root string) events.TaskSpec {
		s := spec(root, "")
		s.Concurrency = &events.Concurrency{Key: "k", Limit: 2}
		return s
	}
	for _, id := range []string{"r6", "r7", "r8", "r9", "r10"} {
		add(id, "a", events.TaskScheduled{Spec: keyed(id)})
	}
	add(kid, "a", events.SlotAcquired{Key: "k", TaskID: "r10", Limit: 2})
	add("r10", "a", events.DeliveryPending{DeliveryID: "d10", Attempt: 1, NextAt: at})
	add("r10", "a", events.Canceled{})
	add(kid, "a", events.SlotReleased{Key: "k", TaskID: "r10", Status: "canceled"})
	add(kid, "a", events.SlotAcquired{Key: "k", TaskID: "r6", Limit: 2})
	add("r6", "a", events.DeliveryPending{DeliveryID: "d6", Attempt: 1, NextAt: at})
	add(kid, "a", events.SlotAcquired{Key: "k", TaskID: "r8", Limit: 2})
	add("r8", "a", events.DeliveryPending{DeliveryID: "d8", Attempt: 1, NextAt: at})
	add("r8", "a", events.Canceled{})
	add("r9", "a", events.Canceled{})
	add(kid, "a", events.SlotAcquired{Key: "k", TaskID: "r9", Limit: 3})
	// Key k2, limit 1, and retried tasks: r11 gave its first attempt's
	// slot back and took one for its second, not yet released; r12
	// failed its first attempt and still holds that attempt's slot (in
	// the Free queue).
	k2 := events.KeyID("a", "k2")
	for i, id := range []string{"r11", "r12"} {
		sp := spec(id, "")
		sp.Concurrency = &events.Concurrency{Key: "k2", Limit: 1}
		sp.Retry = &events.RetryPolicy{MaxAttempts: 3, MaxBackoffSeconds: 60, On: []string{events.RetryOnFailed}}
		add(id, "a", events.TaskScheduled{Spec: sp})
		add(k2, "a", events.SlotAcquired{Key: "k2", TaskID: id, Limit: 1})
		d := fmt.Sprint("d", id)
		add(id, "a", events.DeliveryPending{DeliveryID: d, Attempt: 1, NextAt: at})
		add(id, "a", events.ReadyPublished{DeliveryID: d})
		add(id, "a", events.Claimed{DeliveryID: d, ExecutorID: "w", Deadline: at.Add(time.Minute)})
		add(id, "a", events.RetryScheduled{Attempt: 2, NextAt: at, Cause: events.RetryOnFailed, DeliveryID: d, Result: &events.Result{Error: "flaky"}})
		if i == 0 {
			add(k2, "a", events.SlotReleased{Key: "k2", TaskID: id, Status: "scheduled"})
		}
	}
	add(k2, "a", events.SlotAcquired{Key: "k2", TaskID: "r11", Limit: 1, Attempt: 2})
	// Schedules: one whose last run's task is not in the log yet (due at
	// once), one paused, one deleted, one whose run's task exists.
	every := events.ScheduleSpec{Every: "1h", Timezone: "UTC", Overlap: events.OverlapSkip, Catchup: events.CatchupOne, Task: events.TaskSpec{Queue: "q", TimeoutSeconds: 60}}
	add("s1", "a", events.ScheduleCreated{Spec: every})
	add("s1", "a", events.ScheduleFired{At: at, TaskID: "rnotyet", RequestID: "fnotyet"})
	add("s2", "a", events.ScheduleCreated{Spec: every, Paused: true})
	add("s3", "b", events.ScheduleCreated{Spec: every})
	add("s3", "b", events.ScheduleDeleted{})
	add("s4", "b", events.ScheduleCreated{Spec: every})
	add("s4", "b", events.ScheduleFired{At: at, TaskID: "r4", RequestID: "f4", Manual: true})
	// A schedule whose runs' task has labels (enough that map order shows
	// in an encoding that does not sort them), a retry policy and a key.
	withLabels := every
	withLabels.Task.Labels = map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		withLabels.Task.Labels[k] = "v" + k
	}
	withLabels.Task.Retry = &events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: 10, MaxBackoffSeconds: 60, On: []string{events.RetryOnFailed}}
	withLabels.Task.Concurrency = &events.Concurrency{Key: "k", Limit: 2}
	add("s5", "c", events.ScheduleCreated{Spec: withLabels})
	return out
}

func TestSnapshotRestoresEveryView(t *testing.T) {
	t.Parallel()
	// Keeping every task, and keeping two of the closed lineages' tasks:
	// r3, r4, r5 with c5 and r10 are evicted as r8 and r9 close.
	for _, retain := range []int{-1, 2} {
		t.Run(fmt.Sprint("retain=", retain), func(t *testing.T) { testSnapshotRestores(t, retain) })
	}
}

func testSnapshotRestores(t *testing.T, retain int) {
	live, _ := New(Config{Retain: retain})
	log := snapshotLog(t)
	for i, b := range log {
		live.Apply(events.Position(i+1), b)
	}
	live.Apply(events.Position(len(log)+1), []byte("\xc1 not an event")) // quarantined
	for _, id := range []string{"r1", "c1", "r2", "r3", "r4", "r5", "c5", "r6", "r7", "r8", "r9", "r10"} {
		_, ok := live.Task(id)
		if evicted := retain == 2 && slices.Contains([]string{"r3", "r4", "r5", "c5", "r10"}, id); ok == evicted {
			t.Errorf("task %s kept %v, want %v", id, ok, !evicted)
		}
	}
	data, err := encodeSnapshot(live.Positions(), live.v.body())
	if err != nil {
		t.Fatal(err)
	}
	applied, b, err := decodeSnapshot(data, live.Positions())
	if err != nil {
		t.Fatal(err)
	}
	restored, _ := New(Config{Retain: retain})
	restored.v = restore(b, retain, events.Shards{})
	restored.setApplied(applied[0])
	for id, lt := range live.v.tasks {
		// The timer slot and statusAt are places in a heap and a set,
		// which the order of insertions decides: the queues' and sets'
		// contents are compared below.
		l, r := *lt, *restored.v.tasks[id]
		l.timer, r.timer, l.statusAt, r.statusAt = timerSlot{}, timerSlot{}, 0, 0
		if !reflect.DeepEqual(l, r) {
			t.Fatalf("task %s:\nlive     %+v\nrestored %+v", id, l, r)
		}
	}
	if !reflect.DeepEqual(live.v.admissions, restored.v.admissions) || !reflect.DeepEqual(live.v.activeRoots, restored.v.activeRoots) ||
		!reflect.DeepEqual(live.v.statusIDs(), restored.v.statusIDs()) || !reflect.DeepEqual(live.v.queueCounts, restored.v.queueCounts) {
		t.Fatalf("derived views differ:\nlive     %v %v %v %v\nrestored %v %v %v %v", live.v.admissions, live.v.activeRoots, live.v.statusIDs(), live.v.queueCounts,
			restored.v.admissions, restored.v.activeRoots, restored.v.statusIDs(), restored.v.queueCounts)
	}
	for i := range live.v.timers {
		if !reflect.DeepEqual(live.v.timers[i].entries(), restored.v.timers[i].entries()) {
			t.Fatalf("timer %d differs", i)
		}
	}
	if live.v.kept != restored.v.kept || !slices.Equal(closedNow(live.v), closedNow(restored.v)) {
		t.Fatalf("retention differs: live %d %v, restored %d %v", live.v.kept, closedNow(live.v), restored.v.kept, closedNow(restored.v))
	}
	if !reflect.DeepEqual(live.v.keys, restored.v.keys) {
		t.Fatalf("keys differ:\nlive     %+v\nrestored %+v", live.v.keys, restored.v.keys)
	}
	if !reflect.DeepEqual(live.v.labels, restored.v.labels) {
		t.Fatalf("label index differs:\nlive     %v\nrestored %v", live.v.labels, restored.v.labels)
	}
	if want := map[string]string{"repo": "x", "team": "a"}; !reflect.DeepEqual(restored.v.labels.of["r1"], want) {
		t.Fatalf("r1's labels = %v, want %v", restored.v.labels.of["r1"], want)
	}
	if _, ok := restored.v.labels.of["r4"]; ok == (retain == 2) {
		t.Fatalf("evicted r4 in the label index: %v (retain %d)", ok, retain)
	}
	if live.Digest() != restored.Digest() {
		t.Fatalf("digest differs")
	}
	if n, q := restored.Quarantined(10); n != 1 || len(q) != 1 || q[0].Pos != events.Position(len(log)+1) || !reflect.DeepEqual(live.v.quarantine, restored.v.quarantine) {
		t.Fatalf("quarantine restored: %d %+v, live %+v", n, q, live.v.quarantine)
	}
	checkIDIndex(t, live.v)
	checkIDIndex(t, restored.v)
	if q := restored.v.timers[Fire]; !q.has(ScheduleKey("a", "s1")) || q.has(ScheduleKey("a", "s2")) || q.has(ScheduleKey("b", "s3")) || !q.has(ScheduleKey("b", "s4")) ||
		restored.v.scheds[ScheduleKey("a", "s1")].pending != "rnotyet" || restored.LiveSchedules("a") != 2 || restored.LiveSchedules("b") != 1 {
		t.Fatalf("schedules restored: fire queue %v", q.entries())
	}
}

// closedNow returns the closed lineages that eviction would still act on,
// in order: the live list may also hold entries a reopen made stale.
func closedNow(v *views) []closedLineage {
	var out []closedLineage
	for _, c := range v.parts[0].closed {
		if h := v.tasks[c.head]; h != nil && h.closedSeq() == c.seq {
			out = append(out, c)
		}
	}
	return out
}

// TestRetriedHoldersFromTheLog checks the retried holders of snapshotLog's
// key k2: r12, holding its first attempt's slot at its second attempt, is
// in the Free queue (due when that attempt ended) and not offered for
// release; r11, holding a slot for its second attempt, is offered.
func TestRetriedHoldersFromTheLog(t *testing.T) {
	t.Parallel()
	e, _ := New(Config{Retain: -1})
	for i, b := range snapshotLog(t) {
		e.Apply(events.Position(i+1), b)
	}
	now := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	k, _, _ := e.ConcurrencyKey("a", "k2", now)
	if !slices.Equal(k.Holders, []string{"r12", "r11"}) || k.HeldFor("r11") != 2 || k.HeldFor("r12") != 1 {
		t.Fatalf("k2 holders %v attempts %v", k.Holders, k.Attempts)
	}
	var freed []aggregate.State
	for _, s := range e.Due(Free, now, 10, nil) {
		if s.Spec.Concurrency.Key == "k2" {
			freed = append(freed, s)
		}
	}
	r12, _ := e.Task("r12")
	if len(freed) != 1 || freed[0].TaskID != "r12" || freed[0].Status != aggregate.StatusScheduled || freed[0].Attempt() != 2 ||
		!FreeAt(freed[0]).Equal(r12.Retries[0].EndedAt) {
		t.Fatalf("k2's Free queue %+v", freed)
	}
	due := e.Due(Release, now, 10, nil)
	if !slices.ContainsFunc(due, func(s aggregate.State) bool { return s.TaskID == "r11" }) ||
		slices.ContainsFunc(due, func(s aggregate.State) bool { return s.TaskID == "r12" }) {
		t.Fatalf("release offers %v, want r11 and not r12", due)
	}
}

// TestKeysFromTheLog checks the key view of snapshotLog: holders in the
// order they took a slot, the due waiter, and the terminal holders in the
// Free queue (one finished holding, one canceled before it acquired).
func TestKeysFromTheLog(t *testing.T) {
	t.Parallel()
	e, _ := New(Config{Retain: -1})
	for i, b := range snapshotLog(t) {
		e.Apply(events.Position(i+1), b)
	}
	now := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	k, holders, waiters := e.ConcurrencyKey("a", "k", now)
	ids := func(ss []aggregate.State) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.TaskID)
		}
		return out
	}
	if !slices.Equal(k.Holders, []string{"r6", "r8", "r9"}) || !slices.Equal(ids(holders), k.Holders) {
		t.Fatalf("holders %v %v", k.Holders, ids(holders))
	}
	if !slices.Equal(ids(waiters), []string{"r7"}) || !slices.Equal(ids(e.Waiters("a", "k", now, 5)), []string{"r7"}) {
		t.Fatalf("waiters %v", ids(waiters))
	}
	if free := ids(e.Due(Free, now, 10, nil)); !slices.Equal(free, []string{"r8", "r9", "r12"}) { // r12: key k2's
		t.Fatalf("free queue %v", free)
	}
	// Full (3 holders, r7's limit 2): r7 is not offered for release.
	if due := ids(e.Due(Release, now, 10, nil)); slices.Contains(due, "r7") {
		t.Fatalf("release offers %v", due)
	}
	if _, _, w := e.ConcurrencyKey("b", "k", now); len(w) != 0 {
		t.Fatalf("another customer's key of the same name has waiters %v", ids(w))
	}
}

// memSnapshots holds one snapshot in memory.
type memSnapshots struct{ data []byte }

func (m *memSnapshots) Load(context.Context) ([]byte, bool, error) { return m.data, m.data != nil, nil }
func (m *memSnapshots) Save(_ context.Context, d []byte) error     { m.data = d; return nil }
func (m *memSnapshots) Delete(context.Context) error               { m.data = nil; return nil }

// TestSnapshotEmptyShard: a snapshot of a sharded log with an empty shard
// restores every shard's position in its own place (an empty shard's 0
// once reset shard 0's position, which was then replayed from its
// start), and so does an offline rebuild's start; a position in another
// shard's place is refused.
func TestSnapshotEmptyShard(t *testing.T) {
	k := events.Shards{K: 3}
	applied := []events.Position{k.Position(0, 5), 0, k.Position(2, 4)}
	data, err := encodeSnapshot(applied, body{})
	if err != nil {
		t.Fatal(err)
	}
	last := []events.Position{k.Position(0, 9), 0, k.Position(2, 9)}
	e, err := New(Config{Shards: k})
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.Snapshots = &memSnapshots{data: data}
	e.restoreSnapshot(context.Background(), last)
	if got := e.Positions(); !slices.Equal(got, applied) {
		t.Fatalf("restored positions %v, snapshot %v", got, applied)
	}
	e.setPositions(last)
	if got := e.Positions(); !slices.Equal(got, last) {
		t.Fatalf("positions %v, set %v", got, last)
	}
	misplaced, err := encodeSnapshot([]events.Position{k.Position(1, 5), 0, 0}, body{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := decodeSnapshot(misplaced, last); !errors.Is(err, ErrSnapshotFormat) {
		t.Fatalf("a position in another shard's place: %v, want ErrSnapshotFormat", err)
	}
}

// TestFreezeIsACopy: the views frozen for a snapshot give the body they
// had when frozen, whatever the log applies after: the snapshot builds
// its body after it released the views' lock. Cut at every event of a
// log with children, mail, results, effects, retries and labels.
func TestFreezeIsACopy(t *testing.T) {
	t.Parallel()
	log := snapshotLog(t)
	for cut := range log {
		live, _ := New(Config{})
		for i, b := range log[:cut] {
			live.Apply(events.Position(i+1), b)
		}
		want := live.v.body()
		f := live.v.freeze()
		for i, b := range log[cut:] {
			live.Apply(events.Position(cut+i+1), b)
		}
		if got := f.body(); !reflect.DeepEqual(got, want) {
			t.Fatalf("cut at event %d: the frozen views changed with the events applied after", cut)
		}
	}
}
