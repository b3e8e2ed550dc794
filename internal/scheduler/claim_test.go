package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
)

func TestClaimAndResult(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()

	t.Run("WrongTokenIsTokenMismatch", func(t *testing.T) {
		t.Parallel()
		q := claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{}).TaskID)
		_, err := n.Service.Claim(ctx, acme, q.TaskID, "not-the-token", "w1")
		requireIs(t, err, aggregate.ErrTokenMismatch)
		if st := get(t, n, q.TaskID); st.Status != aggregate.StatusQueued || st.Version != q.Version {
			t.Fatalf("a refused claim changed the task: status %s v%d, was v%d", st.Status, st.Version, q.Version)
		}
	})

	t.Run("InvalidIDs", func(t *testing.T) {
		t.Parallel()
		q := claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{}).TaskID)
		for _, c := range []struct{ id, delivery, executor string }{
			{"bad.id", q.Delivery.ID, "w1"},
			{q.TaskID, "bad token", "w1"},
			{q.TaskID, q.Delivery.ID, "w>"},
			{q.TaskID, q.Delivery.ID, ""},
		} {
			_, err := n.Service.Claim(ctx, acme, c.id, c.delivery, c.executor)
			requireIs(t, err, aggregate.ErrInvalid)
		}
		_, err := n.Service.RecordResult(ctx, acme, q.TaskID, "bad token", events.Result{Success: true})
		requireIs(t, err, aggregate.ErrInvalid)
		if st := get(t, n, q.TaskID); st.Status != aggregate.StatusQueued {
			t.Fatalf("invalid calls changed the task to %s", st.Status)
		}
	})

	t.Run("MissingTaskNotFound", func(t *testing.T) {
		t.Parallel()
		for _, p := range []scheduler.Principal{operator, acme} {
			_, err := n.Service.Claim(ctx, p, "no-such-task", "d1", "w1")
			requireIs(t, err, aggregate.ErrNotFound)
			_, err = n.Service.RecordResult(ctx, p, "no-such-task", "", events.Result{Success: true})
			requireIs(t, err, aggregate.ErrNotFound)
			_, err = n.Service.Cancel(ctx, p, "no-such-task", "")
			requireIs(t, err, aggregate.ErrNotFound)
		}
	})

	t.Run("NotReleasedNotClaimable", func(t *testing.T) {
		t.Parallel()
		st := idle(t, n, acme, scheduler.ScheduleRequest{})
		_, err := n.Service.Claim(ctx, acme, st.TaskID, "any-token", "w1")
		requireIs(t, err, aggregate.ErrNotClaimable)
	})

	t.Run("Lifecycle", func(t *testing.T) {
		t.Parallel()
		run := running(t, n, acme, scheduler.ScheduleRequest{TimeoutSeconds: new(600)})
		if d := run.Deadline.Sub(run.StartedAt); d != 600*time.Second {
			t.Fatalf("running deadline %v after the start, want the 600s timeout", d)
		}
		_, err := n.Service.Claim(ctx, acme, run.TaskID, run.Claim.DeliveryID, "w2")
		requireIs(t, err, aggregate.ErrNotClaimable)
		_, err = n.Service.RecordResult(ctx, acme, run.TaskID, "another-token", events.Result{Success: true})
		requireIs(t, err, aggregate.ErrTokenMismatch)

		done, err := n.Service.RecordResult(ctx, acme, run.TaskID, run.Claim.DeliveryID, events.Result{
			Success: true, Summary: "done", Effects: []events.Effect{{Kind: "pull_request", Ref: "42"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if done.Status != aggregate.StatusSucceeded || done.Result == nil || done.Result.Summary != "done" || done.CompletedAt.IsZero() {
			t.Fatalf("finished task: status %s result %+v", done.Status, done.Result)
		}

		// A terminal task takes no further result (the claim's, or an
		// operator's without a token), cancel or new mail. A customer's
		// result without a token is an operator's action: refused first.
		for p, dl := range map[scheduler.Principal]string{acme: run.Claim.DeliveryID, operator: ""} {
			_, err = n.Service.RecordResult(ctx, p, run.TaskID, dl, events.Result{Success: false})
			requireIs(t, err, aggregate.ErrTerminal)
		}
		_, err = n.Service.RecordResult(ctx, acme, run.TaskID, "", events.Result{Success: false})
		requireIs(t, err, scheduler.ErrOperatorOnly)
		_, err = n.Service.Cancel(ctx, acme, run.TaskID, "too late")
		requireIs(t, err, aggregate.ErrTerminal)
		_, err = n.Service.Claim(ctx, acme, run.TaskID, run.Claim.DeliveryID, "w1")
		requireIs(t, err, aggregate.ErrNotClaimable)
		want := []events.Type{events.TypeTaskScheduled, events.TypeReadyPublished, // released in TaskScheduled
			events.TypeClaimed, events.TypeResultRecorded}
		if got := types(history(t, n, run.TaskID)); !slices.Equal(got, want) {
			t.Fatalf("history %v, want %v", got, want)
		}
	})

	t.Run("ResultLimits", func(t *testing.T) {
		t.Parallel()
		run := running(t, n, acme, scheduler.ScheduleRequest{})
		effects := func(k int) []events.Effect {
			out := make([]events.Effect, k)
			for i := range out {
				out[i] = events.Effect{Kind: "comment"}
			}
			return out
		}
		for name, r := range map[string]events.Result{
			"SummaryTooLong": {Summary: strings.Repeat("s", events.MaxSummaryBytes+1)},
			"TooManyEffects": {Effects: effects(events.MaxEffects + 1)},
			"EffectNoKind":   {Effects: []events.Effect{{Kind: "comment"}, {Ref: "no kind"}}},
		} {
			for p, dl := range map[scheduler.Principal]string{acme: run.Claim.DeliveryID, operator: ""} {
				_, err := n.Service.RecordResult(ctx, p, run.TaskID, dl, r)
				if err == nil {
					t.Fatalf("%s (delivery %q): accepted", name, dl)
				}
				requireIs(t, err, aggregate.ErrInvalid)
			}
		}
		if st := get(t, n, run.TaskID); st.Status != aggregate.StatusRunning || st.Version != run.Version {
			t.Fatalf("refused results changed the task: status %s v%d, was v%d", st.Status, st.Version, run.Version)
		}
		// The limits are inclusive.
		done, err := n.Service.RecordResult(ctx, acme, run.TaskID, run.Claim.DeliveryID, events.Result{
			Summary: strings.Repeat("s", events.MaxSummaryBytes), Effects: effects(events.MaxEffects),
		})
		if err != nil || done.Status != aggregate.StatusFailed || len(done.Result.Effects) != events.MaxEffects {
			t.Fatalf("result at the limits: status %s, %v", done.Status, err)
		}
	})
}

func TestClaimNext(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()

	t.Run("NothingReady", func(t *testing.T) {
		t.Parallel()
		idle(t, n, acme, scheduler.ScheduleRequest{Queue: "empty"}) // not released
		start := time.Now()
		st, ok, err := n.Service.ClaimNext(ctx, operator, "empty", "w1", 200*time.Millisecond)
		if err != nil || ok || st.Exists() {
			t.Fatalf("claim next on an empty queue: ok %v task %q err %v", ok, st.TaskID, err)
		}
		if waited := time.Since(start); waited < 200*time.Millisecond {
			t.Fatalf("claim next answered after %v, before its 200ms wait", waited)
		}
	})

	t.Run("InvalidArguments", func(t *testing.T) {
		t.Parallel()
		_, _, err := n.Service.ClaimNext(ctx, operator, "q.*", "w1", 0)
		requireIs(t, err, aggregate.ErrInvalid)
		_, _, err = n.Service.ClaimNext(ctx, operator, "work", "", 0)
		requireIs(t, err, aggregate.ErrInvalid)
	})

	t.Run("ClaimsReadyTask", func(t *testing.T) {
		t.Parallel()
		want := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "work"})
		// The long poll waits for the alarm to release and publish it.
		st, ok, err := n.Service.ClaimNext(ctx, operator, "work", "w1", 20*time.Second)
		if err != nil || !ok {
			t.Fatalf("claim next: ok %v err %v", ok, err)
		}
		if st.TaskID != want.TaskID || st.Status != aggregate.StatusRunning || st.Claim.ExecutorID != "w1" {
			t.Fatalf("claimed task %s status %s executor %q, want %s running for w1", st.TaskID, st.Status, st.Claim.ExecutorID, want.TaskID)
		}
		if got := get(t, n, want.TaskID); got.Status != aggregate.StatusRunning {
			t.Fatalf("stored task is %s", got.Status)
		}
		// Its notification was consumed: nothing more to claim.
		if st, ok, err := n.Service.ClaimNext(ctx, operator, "work", "w2", 100*time.Millisecond); ok || err != nil {
			t.Fatalf("second claim next: task %s ok %v err %v, want nothing", st.TaskID, ok, err)
		}
	})

	t.Run("StaleNotificationSkipped", func(t *testing.T) {
		t.Parallel()
		stale := claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "stale"}).TaskID)
		if _, err := n.Service.Cancel(ctx, acme, stale.TaskID, "gone"); err != nil {
			t.Fatal(err)
		}
		st, ok, err := n.Service.ClaimNext(ctx, operator, "stale", "w1", 200*time.Millisecond)
		if err != nil || ok {
			t.Fatalf("claim next over a canceled task's notification: task %s ok %v err %v", st.TaskID, ok, err)
		}
		fresh := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "stale"})
		st, ok, err = n.Service.ClaimNext(ctx, operator, "stale", "w1", 20*time.Second)
		if err != nil || !ok || st.TaskID != fresh.TaskID {
			t.Fatalf("claim next: task %s ok %v err %v, want %s", st.TaskID, ok, err, fresh.TaskID)
		}
	})

	t.Run("CustomerClaimsOnlyOwn", func(t *testing.T) {
		t.Parallel()
		theirs := claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "shared"}).TaskID)
		st, ok, err := n.Service.ClaimNext(ctx, globex, "shared", "g1", 300*time.Millisecond)
		if err != nil || ok {
			t.Fatalf("globex claimed from acme's queue: task %s ok %v err %v", st.TaskID, ok, err)
		}
		if got := get(t, n, theirs.TaskID); got.Status != aggregate.StatusQueued {
			t.Fatalf("acme's task is %s after globex's poll, want queued", got.Status)
		}
		st, ok, err = n.Service.ClaimNext(ctx, acme, "shared", "a1", 20*time.Second)
		if err != nil || !ok || st.TaskID != theirs.TaskID || st.Claim.ExecutorID != "a1" {
			t.Fatalf("acme's claim next: task %s ok %v err %v, want %s", st.TaskID, ok, err, theirs.TaskID)
		}
	})
}

// TestClaimNextManyWaiters holds a thousand long polls on one queue while
// tasks arrive: no poll errs, every task is claimed exactly once, and the
// polls left over answer "nothing ready".
func TestClaimNextManyWaiters(t *testing.T) {
	t.Parallel()
	n := setup(t)
	// The polls wait as long as they may; once every task is claimed the
	// rest are ended, so a slow machine does not fail the test.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const polls, tasks = 1000, 300
	type answer struct {
		id  string
		ok  bool
		err error
	}
	answers := make(chan answer, polls)
	var wg sync.WaitGroup
	for i := range polls {
		wg.Go(func() {
			st, ok, err := n.Service.ClaimNext(ctx, operator, "crowd", fmt.Sprintf("w%d", i), scheduler.MaxWait)
			answers <- answer{st.TaskID, ok, err}
		})
	}
	for range tasks {
		mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "crowd"})
	}
	claimed := map[string]int{}
	for range polls {
		a := <-answers
		if a.err != nil {
			t.Fatalf("a long poll failed: %v", a.err)
		}
		if a.ok {
			if claimed[a.id]++; len(claimed) == tasks {
				cancel()
			}
		}
	}
	wg.Wait()
	if len(claimed) != tasks {
		t.Fatalf("%d tasks claimed, want %d", len(claimed), tasks)
	}
	for id, c := range claimed {
		if c != 1 {
			t.Fatalf("task %s claimed by %d polls", id, c)
		}
	}
}
