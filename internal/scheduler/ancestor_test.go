package scheduler_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
)

// requireClosed fails the test unless task id ended canceled with reason
// ancestor_terminal, recorded by the scheduler, not by an executor.
func requireClosed(t *testing.T, n *testnode.Node, id string) {
	t.Helper()
	st := get(t, n, id)
	if st.Status != aggregate.StatusCanceled || st.Reason != events.ReasonAncestorTerminal {
		t.Fatalf("task %s is %s (%q), want canceled (%s)", id, st.Status, st.Reason, events.ReasonAncestorTerminal)
	}
	evs := history(t, n, id)
	if last := evs[len(evs)-1]; last.Type() != events.TypeCanceled || last.Actor != "scheduler" {
		t.Fatalf("task %s's last event: %s by %q, want Canceled by the scheduler", id, last.Type(), last.Actor)
	}
}

// TestScheduleUnderTerminalAncestor: once a root is canceled, no task of
// its lineage gets a new child: under the root itself parent_terminal,
// under any descendant ancestor_terminal, and nothing is written; a
// repeated request id still answers the child it made before.
func TestScheduleUnderTerminalAncestor(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	root := idle(t, n, acme, scheduler.ScheduleRequest{})
	child := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: root.TaskID})
	grand := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: child.TaskID, RequestID: "grand"})
	if _, err := n.Service.Cancel(ctx, acme, root.TaskID, "stop"); err != nil {
		t.Fatal(err)
	}
	before := streamMsgs(t, n)
	_, _, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{ParentID: root.TaskID})
	requireIs(t, err, scheduler.ErrParentTerminal)
	for _, parent := range []string{child.TaskID, grand.TaskID} {
		for _, reqID := range []string{"", "late-" + parent} {
			st, created, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{ParentID: parent, RequestID: reqID})
			requireIs(t, err, scheduler.ErrAncestorTerminal)
			if created || st.Exists() {
				t.Fatalf("refused child of %s: created %v, task %+v", parent, created, st)
			}
		}
	}
	if after := streamMsgs(t, n); after != before {
		t.Fatalf("refused children appended %d events", after-before)
	}
	again, created, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{ParentID: child.TaskID, RequestID: "grand"})
	if err != nil || created || again.TaskID != grand.TaskID {
		t.Fatalf("repeat of the child made before: task %s created %v err %v, want %s", again.TaskID, created, err, grand.TaskID)
	}

	t.Run("OverHTTP", func(t *testing.T) {
		_, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{CustomerID: "acme", ParentID: grand.TaskID})
		requireIs(t, err, api.ErrAncestorTerminal)
	})
}

// TestClaimUnderTerminalAncestor: the queued descendants of a canceled
// root are canceled (ancestor_terminal) by the claims that find them,
// on every claim path, instead of running; the tree then shows the whole
// lineage terminal.
func TestClaimUnderTerminalAncestor(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	const queue, own = "lineage", "lineage-own"
	queued := func(q, parent string) string {
		return claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: q, ParentID: parent}).TaskID).TaskID
	}
	root := idle(t, n, acme, scheduler.ScheduleRequest{Queue: queue})
	mid := queued(queue, root.TaskID)
	byDelivery := claimable(t, n, queued(queue, mid))
	next := []string{mid, queued(queue, byDelivery.TaskID), queued(queue, byDelivery.TaskID)}
	mine := []string{queued(own, byDelivery.TaskID), queued(own, mid)}
	if _, err := n.Service.Cancel(ctx, acme, root.TaskID, "stop"); err != nil {
		t.Fatal(err)
	}

	t.Run("ByDelivery", func(t *testing.T) {
		st, err := n.Service.Claim(ctx, acme, byDelivery.TaskID, byDelivery.Delivery.ID, "w1")
		requireIs(t, err, scheduler.ErrAncestorTerminal)
		if st.Status != aggregate.StatusCanceled {
			t.Fatalf("claimed task is %s, want canceled", st.Status)
		}
		requireClosed(t, n, byDelivery.TaskID)
		// The token is spent: a second claim is not_claimable.
		_, err = n.Service.Claim(ctx, acme, byDelivery.TaskID, byDelivery.Delivery.ID, "w1")
		requireIs(t, err, aggregate.ErrNotClaimable)
	})
	// The operator's claims/next takes the notifications; a customer's
	// looks at its queued tasks first. Neither gets a task.
	for _, c := range []struct {
		name  string
		p     scheduler.Principal
		queue string
		ids   []string
	}{{"NextFromNotifications", operator, queue, next}, {"NextFromQueued", acme, own, mine}} {
		t.Run(c.name, func(t *testing.T) {
			for range c.ids {
				if st, ok, err := n.Service.ClaimNext(ctx, c.p, c.queue, "w1", 100*time.Millisecond); err != nil || ok {
					t.Fatalf("claims/next: task %s ok %v err %v, want none", st.TaskID, ok, err)
				}
			}
			for _, id := range c.ids {
				testnode.Eventually(t, "task "+id+" ended", func() bool { return get(t, n, id).Status.Terminal() })
				requireClosed(t, n, id)
			}
		})
	}
	t.Run("TreeAllTerminal", func(t *testing.T) {
		tree, err := n.Service.Tree(ctx, acme, root.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		var walk func(scheduler.Node) int
		walk = func(nd scheduler.Node) int {
			if !nd.Task.Status.Terminal() {
				t.Errorf("task %s in the tree is %s", nd.Task.TaskID, nd.Task.Status)
			}
			c := 1
			for _, k := range nd.Children {
				c += walk(k)
			}
			return c
		}
		if got := walk(tree); got != 7 {
			t.Fatalf("tree holds %d tasks, want 7", got)
		}
	})
	testnode.Verify(t, n.Store)
}

// TestReleaseUnderTerminalAncestor: a delayed descendant of a canceled
// root is canceled by the alarm when it is due, instead of released.
func TestReleaseUnderTerminalAncestor(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	root := idle(t, n, acme, scheduler.ScheduleRequest{})
	child := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: root.TaskID})
	delayed := mustSchedule(t, n, acme, scheduler.ScheduleRequest{ParentID: child.TaskID, DelaySeconds: new(0.3)})
	keyed := mustSchedule(t, n, acme, scheduler.ScheduleRequest{ParentID: child.TaskID, DelaySeconds: new(0.3),
		Concurrency: &events.Concurrency{Key: "k", Limit: 1}})
	if _, err := n.Service.Cancel(ctx, acme, root.TaskID, "stop"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{delayed.TaskID, keyed.TaskID} {
		testnode.Eventually(t, "task "+id+" ended", func() bool { return get(t, n, id).Status.Terminal() })
		requireClosed(t, n, id)
		for _, ev := range history(t, n, id) {
			if ev.Type() == events.TypeDeliveryPending {
				t.Fatalf("task %s was released", id)
			}
		}
	}
	if k, err := n.Store.LoadKey(ctx, "acme", "k"); err != nil || len(k.Holders) != 0 {
		t.Fatalf("key k: %+v, %v; want no holder", k, err)
	}
}

// TestCancelRacesClaims: claims racing the cancel of their root either
// win (the task runs, and its stop check says ancestor_terminal) or cancel
// the task; a claim that starts after the cancel has answered never runs
// one. Every task ends canceled or running.
func TestCancelRacesClaims(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	const queue, kids = "race", 24
	root := idle(t, n, operator, scheduler.ScheduleRequest{Queue: queue})
	ids := make([]string, kids)
	for i := range ids {
		ids[i] = claimable(t, n, mustSchedule(t, n, operator, scheduler.ScheduleRequest{Queue: queue, ParentID: root.TaskID}).TaskID).TaskID
	}
	// A grandchild too, so the ancestor found is not only the parent.
	grand := claimable(t, n, mustSchedule(t, n, operator, scheduler.ScheduleRequest{Queue: queue, ParentID: ids[0]}).TaskID).TaskID

	// The cancel goes out once a first claim has run, so both outcomes
	// happen.
	first, firstOnce := make(chan struct{}), sync.Once{}
	var canceled atomic.Bool
	var mu sync.Mutex
	var late []string // claimed by a claim that started after the cancel answered
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range kids {
				after := canceled.Load()
				st, ok, err := n.Service.ClaimNext(ctx, operator, queue, "w"+string(rune('a'+w)), 100*time.Millisecond)
				if err != nil {
					t.Errorf("claims/next: %v", err)
					return
				}
				if ok {
					firstOnce.Do(func() { close(first) })
				}
				if ok && after {
					mu.Lock()
					late = append(late, st.TaskID)
					mu.Unlock()
				}
			}
		}()
	}
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no claim ran")
	}
	if _, err := n.Service.Cancel(ctx, operator, root.TaskID, "stop"); err != nil {
		t.Fatal(err)
	}
	canceled.Store(true)
	wg.Wait()
	if len(late) > 0 {
		t.Fatalf("claims after the cancel answered ran %v", late)
	}
	outcomes := map[aggregate.Status]int{}
	for _, id := range append(ids, grand) {
		st := get(t, n, id)
		outcomes[st.Status]++
		switch st.Status {
		case aggregate.StatusRunning:
			res, err := n.Service.Check(ctx, operator, id, "")
			if err != nil || !res.ShouldStop || res.Reason != api.ReasonAncestorTerminal {
				t.Fatalf("check of running %s: %+v, %v; want stop (ancestor_terminal)", id, res, err)
			}
		case aggregate.StatusCanceled:
			requireClosed(t, n, id)
		default:
			t.Fatalf("task %s is %s after the claims drained the queue", id, st.Status)
		}
	}
	if outcomes[aggregate.StatusRunning] == 0 {
		t.Fatalf("no claim won the race: %v", outcomes)
	}
	t.Logf("outcomes: %v", outcomes)
}
