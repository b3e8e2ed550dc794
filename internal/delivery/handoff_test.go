package delivery_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
)

// history and types are the shared harness's.
var history, types = testnode.History, testnode.Types

// The principals of the handoff tests.
var (
	operator = scheduler.Operator
	acme     = scheduler.Principal{CustomerID: "acme"}
	globex   = scheduler.Principal{CustomerID: "globex"}
)

// TestHandoff: a task released while a claimer that may claim it waits in
// the process goes straight to that claimer, released by the schedule
// call or by the alarm, with no ready notification and no ReadyPublished;
// a claimer of another customer is never handed it, and the task is
// published as before.
func TestHandoff(t *testing.T) {
	t.Parallel()
	n := testnode.Start(t)
	ctx := context.Background()

	type claimed struct {
		st  aggregate.State
		ok  bool
		err error
	}
	// waiting starts a long poll of p on queue and returns once it waits
	// in the queue's dispatcher.
	waiting := func(p scheduler.Principal, queue string, wait time.Duration) chan claimed {
		t.Helper()
		idle(t, n, p, scheduler.ScheduleRequest{Queue: queue}) // the queue exists: the poll waits in its dispatcher
		before := n.Service.Waiting(queue)
		ch := make(chan claimed, 1)
		go func() {
			st, ok, err := n.Service.ClaimNext(ctx, p, queue, "w", wait)
			ch <- claimed{st, ok, err}
		}()
		for deadline := time.Now().Add(10 * time.Second); n.Service.Waiting(queue) == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the long poll on %s is not waiting after 10s", queue)
			}
		}
		return ch
	}
	readyStored := func() uint64 {
		t.Helper()
		rs, err := n.Store.JetStream().Stream(ctx, n.NS.ReadyStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := rs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	handed := func(queue string, req scheduler.ScheduleRequest, want ...events.Type) {
		t.Helper()
		got := waiting(operator, queue, scheduler.MaxWait)
		stored := readyStored()
		req.Queue = queue
		task := mustSchedule(t, n, acme, req)
		c := <-got
		if c.err != nil || !c.ok || c.st.TaskID != task.TaskID || c.st.Status != aggregate.StatusRunning {
			t.Fatalf("the waiting claimer got %s (%s, ok %v, %v), want %s running", c.st.TaskID, c.st.Status, c.ok, c.err, task.TaskID)
		}
		if h := types(history(t, n, task.TaskID)); !slices.Equal(h, want) {
			t.Fatalf("history %v, want %v", h, want)
		}
		if now := readyStored(); now != stored {
			t.Fatalf("the ready stream took %d notifications for a task handed off", now-stored)
		}
	}

	t.Run("Schedule", func(t *testing.T) {
		handed("handoff-now", scheduler.ScheduleRequest{}, events.TypeTaskScheduled, events.TypeClaimed)
	})
	t.Run("Alarm", func(t *testing.T) {
		handed("handoff-later", scheduler.ScheduleRequest{DelaySeconds: new(0.2)},
			events.TypeTaskScheduled, events.TypeDeliveryPending, events.TypeClaimed)
	})
	t.Run("OtherCustomer", func(t *testing.T) {
		got := waiting(globex, "handoff-shared", 300*time.Millisecond)
		task := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "handoff-shared"})
		if task = testnode.Published(t, n, task.TaskID, events.DefaultReadyGrace/2); task.Status != aggregate.StatusQueued {
			t.Fatalf("acme's task is %s, want queued: published, not handed to globex", task.Status)
		}
		if c := <-got; c.ok || c.err != nil {
			t.Fatalf("globex's claimer got %s (ok %v, %v), want nothing", c.st.TaskID, c.ok, c.err)
		}
		if !slices.Contains(types(history(t, n, task.TaskID)), events.TypeReadyPublished) {
			t.Fatalf("acme's task has no ReadyPublished: %v", types(history(t, n, task.TaskID)))
		}
	})
}

// mustSchedule is the shared harness's.
var mustSchedule = testnode.MustSchedule

// idle schedules a task as p that stays scheduled for the whole test.
func idle(t *testing.T, n *testnode.Node, p scheduler.Principal, req scheduler.ScheduleRequest) aggregate.State {
	t.Helper()
	req.DelaySeconds = new(3600.0)
	return mustSchedule(t, n, p, req)
}
