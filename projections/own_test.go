package projections_test

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

// TestApplyOwnRules: on an engine without a tail, ApplyOwn folds in a root
// task's TaskScheduled and the events after it while the task is exactly
// at the event before, and refuses what must follow the log's order (a
// child's creation, a terminal event, mail) and an event ahead of a gap;
// the tail's copy of an event folded in changes nothing again.
func TestApplyOwnRules(t *testing.T) {
	t.Parallel()
	e := mustEngine(projections.Config{Logger: testLogger(t)})
	at := time.Unix(1_700_000_000, 0)
	seq := uint64(0)
	num := map[string]int{}
	var stored [][]byte // what the log holds, by seq-1
	event := func(task string, p events.Payload) events.Event {
		seq++
		num[task]++
		at = at.Add(1e9)
		ev := events.Event{ID: fmt.Sprintf("e%d", seq), TaskID: task, CustomerID: "cust", Number: num[task], At: at, Data: p, Seq: events.Position(seq)}
		b, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, b)
		ev.Hash = events.HashOf(b)
		return ev
	}
	spec := func(id, parent string) events.TaskSpec {
		return events.TaskSpec{RootID: "root", ParentID: parent, Queue: "q", TimeoutSeconds: 60, RunAt: at}
	}
	root := event("root", events.TaskScheduled{Spec: spec("root", ""), DeliveryID: "d1", NextAt: at})
	published := event("root", events.ReadyPublished{DeliveryID: "d1", ReadySeq: 1})
	claimed := event("root", events.Claimed{DeliveryID: "d1", ExecutorID: "x", Deadline: at.Add(6e10)})
	read := event("root", events.MailboxRead{Cursor: 0})
	child := event("child", events.TaskScheduled{Spec: spec("child", "root")})
	mail := event("root", events.MailboxAppended{Index: 1, Message: events.Message{ID: "m1", CreatedAt: at,
		Content: []events.ContentPart{{Type: "text", Text: "hi"}}}})
	done := event("root", events.ResultRecorded{DeliveryID: "d1", Result: events.Result{Success: true}})

	if !e.ApplyOwn([]events.Event{root, published}) {
		t.Fatal("a root task's TaskScheduled and ReadyPublished were not folded in")
	}
	if st, ok := e.Task("root"); !ok || st.Status != aggregate.StatusQueued || st.Version != 2 {
		t.Fatalf("root after ApplyOwn: %+v %v, want queued at version 2", st, ok)
	}
	if e.Applied() != 0 {
		t.Fatalf("ApplyOwn moved Applied to %d; only the tail does", e.Applied())
	}
	if e.ApplyOwn([]events.Event{read}) {
		t.Error("an event folded in ahead of its task's previous one")
	}
	if !e.ApplyOwn([]events.Event{claimed, read}) || !e.ApplyOwn([]events.Event{claimed}) {
		t.Fatal("Claimed and MailboxRead after ReadyPublished were not folded in, or not reported in the second time")
	}
	for _, c := range []struct {
		name string
		ev   events.Event
	}{{"Child", child}, {"Mail", mail}, {"Terminal", done}} {
		if e.ApplyOwn([]events.Event{c.ev}) {
			t.Errorf("%s: folded in ahead of the log's order", c.name)
		}
	}
	// The tail brings every event in log order: those folded in already
	// change nothing, the others apply.
	for i, b := range stored {
		e.Apply(events.Position(i+1), b)
	}
	st, _ := e.Task("root")
	want := aggregate.Replay([]events.Event{root, published, claimed, read, mail, done})
	if st.Version != 6 || st.Status != aggregate.StatusSucceeded || !reflect.DeepEqual(st.MailIDs, want.MailIDs) {
		t.Fatalf("root after the tail: version %d, status %s, mail %v; want 6, succeeded, %v", st.Version, st.Status, st.MailIDs, want.MailIDs)
	}
	if children := e.Children("root"); len(children) != 1 || children[0] != "child" {
		t.Fatalf("children of root %v, want [child]", children)
	}
}

// TestApplyOwnRacesTheTail folds each append in at once, as the service
// does, while the engine's tail follows the same log: whichever comes
// first, every event is applied exactly once, so every task equals its
// replay from the log and the views equal a rebuild.
func TestApplyOwnRacesTheTail(t *testing.T) {
	t.Parallel()
	b := setupLog(t)
	run(t, b.engine)
	ctx := context.Background()
	var folded, waited atomic.Int64
	own := func(st aggregate.State, evs []events.Event, err error) aggregate.State {
		t.Helper()
		if err != nil {
			t.Error(err)
			return st
		}
		if b.engine.ApplyOwn(evs) {
			folded.Add(1)
		} else {
			waited.Add(1)
		}
		return st
	}
	var g errgroup.Group
	for w := range 8 {
		g.Go(func() error {
			for i := range 40 {
				id := events.NewID()
				spec := events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 60}
				st := own(b.store.Execute(ctx, id, "", aggregate.Schedule{TaskID: id, CustomerID: fmt.Sprintf("c%d", w), Spec: spec, DeliveryID: events.NewID()}))
				st = own(b.store.Execute(ctx, id, "", aggregate.MarkReadyPublished{DeliveryID: st.Delivery.ID, ReadySeq: 1}))
				st = own(b.store.Execute(ctx, id, "x", aggregate.Claim{DeliveryID: st.Delivery.ID, ExecutorID: "x"}))
				if i%2 == 0 {
					own(b.store.Execute(ctx, id, "", aggregate.RecordResult{DeliveryID: st.Claim.DeliveryID, Result: events.Result{Success: true}}))
				}
			}
			return nil
		})
	}
	g.Wait()
	last := lastSeq(t, b.store.Stream())
	eventually(t, "tail caught up", func() bool { return b.engine.Applied() == last })
	if folded.Load() == 0 || waited.Load() == 0 {
		t.Fatalf("%d writes folded in, %d waited: want both", folded.Load(), waited.Load())
	}
	for _, s := range b.engine.List(projections.Filter{}, "", 1<<30) {
		want, err := b.store.Load(ctx, s.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if want = projected(want); !reflect.DeepEqual(s, want) {
			t.Errorf("task %s:\nprojected %+v\nreplayed  %+v", s.TaskID, s, want)
		}
	}
	sameProjection(t, b.engine, rebuild(t, b.ns, last, projections.DefaultRetain))
}
