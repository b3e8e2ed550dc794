package projections

import (
	"reflect"
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
	add("r1", "a", events.TaskScheduled{Spec: spec("r1", "")})
	add("r1", "a", events.DeliveryPending{DeliveryID: "d1", Attempt: 1, NextAt: at})
	add("r1", "a", events.ReadyPublished{DeliveryID: "d1"})
	add("r1", "a", events.Claimed{DeliveryID: "d1", ExecutorID: "w", Deadline: at.Add(time.Minute)})
	add("c1", "a", events.TaskScheduled{Spec: spec("r1", "r1")})
	add("c1", "a", events.Canceled{Reason: "no"})
	add("r1", "a", events.MailboxAppended{Index: 1, Message: events.Message{ID: "m1", CreatedAt: at}})
	add("r2", "b", events.TaskScheduled{Spec: spec("r2", "")})
	add("r3", "b", events.AdmissionRejected{Spec: spec("r3", ""), Reason: "quota"})
	add("r4", "b", events.TaskScheduled{Spec: spec("r4", "")})
	add("r4", "b", events.DeliveryPending{DeliveryID: "d4", Attempt: 1, NextAt: at})
	add("r4", "b", events.ReadyPublished{DeliveryID: "d4"})
	add("r4", "b", events.Claimed{DeliveryID: "d4", ExecutorID: "w", Deadline: at.Add(time.Minute)})
	add("r4", "b", events.ResultRecorded{DeliveryID: "d4", Result: events.Result{Success: true, Effects: []events.Effect{{Kind: "pr"}}}})
	return out
}

func TestSnapshotRestoresEveryView(t *testing.T) {
	t.Parallel()
	live := New(nil, Config{})
	for i, b := range snapshotLog(t) {
		live.Apply(uint64(i+1), b)
	}
	data, err := encodeSnapshot(live.Applied(), live.v.records())
	if err != nil {
		t.Fatal(err)
	}
	applied, records, err := decodeSnapshot(data, live.Applied())
	if err != nil {
		t.Fatal(err)
	}
	restored := New(nil, Config{})
	restored.v, _ = restore(records), restored.applied.Swap(applied)
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
	if live.Digest() != restored.Digest() {
		t.Fatalf("digest differs")
	}
}
