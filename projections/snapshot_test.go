package projections

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

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
	return out
}

func TestSnapshotRestoresEveryView(t *testing.T) {
	t.Parallel()
	// Keeping every task, and keeping two of the closed lineages' tasks:
	// r3 and r4 (one task each) are evicted when r5 and c5 close.
	for _, retain := range []int{-1, 2} {
		t.Run(fmt.Sprint("retain=", retain), func(t *testing.T) { testSnapshotRestores(t, retain) })
	}
}

func testSnapshotRestores(t *testing.T, retain int) {
	live, _ := New(Config{Retain: retain})
	for i, b := range snapshotLog(t) {
		live.Apply(uint64(i+1), b)
	}
	for _, id := range []string{"r1", "c1", "r2", "r3", "r4", "r5", "c5"} {
		_, ok := live.Task(id)
		if evicted := retain == 2 && (id == "r3" || id == "r4"); ok == evicted {
			t.Errorf("task %s kept %v, want %v", id, ok, !evicted)
		}
	}
	data, err := encodeSnapshot(live.Applied(), live.v.body())
	if err != nil {
		t.Fatal(err)
	}
	applied, b, err := decodeSnapshot(data, live.Applied())
	if err != nil {
		t.Fatal(err)
	}
	restored, _ := New(Config{Retain: retain})
	restored.v, _ = restore(b, retain), restored.applied.Swap(applied)
	for id, lt := range live.v.tasks {
		if rt := restored.v.tasks[id]; !reflect.DeepEqual(lt, rt) {
			t.Fatalf("task %s:\nlive     %+v\nrestored %+v", id, *lt, *rt)
		}
	}
	if !reflect.DeepEqual(live.v.admissions, restored.v.admissions) || !reflect.DeepEqual(live.v.activeRoots, restored.v.activeRoots) ||
		!reflect.DeepEqual(live.v.byStatus, restored.v.byStatus) || !reflect.DeepEqual(live.v.queueCounts, restored.v.queueCounts) {
		t.Fatalf("derived views differ:\nlive     %v %v %v %v\nrestored %v %v %v %v", live.v.admissions, live.v.activeRoots, live.v.byStatus, live.v.queueCounts,
			restored.v.admissions, restored.v.activeRoots, restored.v.byStatus, restored.v.queueCounts)
	}
	for i := range live.v.timers {
		if !reflect.DeepEqual(live.v.timers[i].owner, restored.v.timers[i].owner) {
			t.Fatalf("timer %d differs", i)
		}
	}
	if live.v.kept != restored.v.kept || !slices.Equal(closedNow(live.v), closedNow(restored.v)) {
		t.Fatalf("retention differs: live %d %v, restored %d %v", live.v.kept, closedNow(live.v), restored.v.kept, closedNow(restored.v))
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
}

// closedNow returns the closed lineages that eviction would still act on,
// in order: the live list may also hold entries a reopen made stale.
func closedNow(v *views) []closedLineage {
	var out []closedLineage
	for _, c := range v.closed {
		if h := v.tasks[c.head]; h != nil && h.closedSeq == c.seq {
			out = append(out, c)
		}
	}
	return out
}
