package projections

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Every field the record keeps comes back from it unchanged; of the spec
// it keeps root, parent, queue, runAt, the retry policy, and the signal
// while scheduled (with a retry policy, until terminal).
func TestTaskRecordKeepsState(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_800_000_000, 123).Local()
	sig := events.Signal{ID: "s", URI: "u", RequestID: "r", EventType: "e", EventAction: "a"}
	full := aggregate.State{
		TaskID: "t", CustomerID: "c",
		Spec: events.TaskSpec{RootID: "r", ParentID: "p", RequestID: "req", RelatedTaskID: "rel", Queue: "q", Signal: sig,
			Repo: "repo", Message: events.Message{ID: "m"}, RunAt: at, TimeoutSeconds: 60},
		Retries:   []aggregate.Attempt{{Number: 1, DeliveryID: "d0", ExecutorID: "x", StartedAt: at, EndedAt: at.Add(1), Outcome: "failed", Error: "e", NextAt: at.Add(2)}},
		CreatedAt: at.Add(1), StartedAt: at.Add(2), CompletedAt: at.Add(3), Deadline: at.Add(4),
		Delivery: aggregate.Delivery{ID: "d", Attempt: 3, NextAt: at.Add(5), Published: true},
		Claim:    aggregate.Owner{DeliveryID: "d", ExecutorID: "x"},
		Result:   &events.Result{Summary: "ok"}, Reason: "why", Rejected: true,
		MailIDs: []string{"m1"}, Cursor: 1, Version: 7, FirstSeq: 10, LastSeq: 20,
	}
	kept := func(s aggregate.State, withSignal bool) aggregate.State {
		s.Spec = events.TaskSpec{RootID: s.Spec.RootID, ParentID: s.Spec.ParentID, Queue: s.Spec.Queue, RunAt: s.Spec.RunAt, Retry: s.Spec.Retry}
		if withSignal {
			s.Spec.Signal = sig
		}
		return s
	}
	for _, status := range statuses[1:] {
		s := full
		s.Status = status
		var tk task
		tk.set(&s)
		if got, want := tk.state(), kept(s, status == aggregate.StatusScheduled); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\ngot  %+v\nwant %+v", status, got, want)
		}
		s.Spec.Retry = &events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: 1, MaxBackoffSeconds: 2, On: []string{events.RetryOnFailed}}
		tk.set(&s)
		if got, want := tk.state(), kept(s, !status.Terminal()); !reflect.DeepEqual(got, want) {
			t.Errorf("%s with a retry policy:\ngot  %+v\nwant %+v", status, got, want)
		}
	}
	var tk task
	tk.set(&full)
	tk.set(&aggregate.State{})
	if got := tk.state(); !reflect.DeepEqual(got, aggregate.State{}) || tk.extra != nil {
		t.Errorf("zero state came back as %+v (extra %+v)", got, tk.extra)
	}
}

func TestStatusSet(t *testing.T) {
	t.Parallel()
	var set statusSet
	tasks := make([]*task, 100)
	for i := range tasks {
		tasks[i] = &task{id: fmt.Sprintf("t%03d", i)}
		set.add(tasks[i])
	}
	other := &task{id: "other", statusAt: 3} // another set's task, at an index this one uses
	set.remove(other)
	for _, tk := range tasks[:90] {
		set.remove(tk)
		set.remove(tk) // twice is harmless
	}
	if len(set) != 10 || cap(set) >= 100 {
		t.Fatalf("after removes: %d tasks (cap %d), want 10", len(set), cap(set))
	}
	for i, tk := range set {
		if tk.id < "t090" || int(tk.statusAt) != i {
			t.Fatalf("%s at %d says %d", tk.id, i, tk.statusAt)
		}
	}
	for _, tk := range tasks[90:] {
		set.remove(tk)
	}
	if set != nil {
		t.Fatalf("emptied set = %v", set)
	}
}
