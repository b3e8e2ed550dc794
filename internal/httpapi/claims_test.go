package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

func TestClaimConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("WrongTokenIsTokenMismatch", func(t *testing.T) {
		t.Parallel()
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "claims"})
		_, err := b.client.Claim(ctx, q.ID, "not-the-token", "w1")
		apiError(t, err, http.StatusConflict, "token_mismatch")
		if got := b.waitStatus(t, q.ID, "queued"); got.Version != q.Version || got.Claim != nil {
			t.Fatalf("a refused claim changed the task: %+v", got)
		}
	})

	t.Run("ReusedTokenIsNotClaimable", func(t *testing.T) {
		t.Parallel()
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "claims"})
		first, err := b.client.Claim(ctx, q.ID, q.Delivery.ID, "w1")
		if err != nil {
			t.Fatal(err)
		}
		if first.Status != "running" || first.Claim == nil || first.Claim.DeliveryID != q.Delivery.ID || first.Claim.ExecutorID != "w1" {
			t.Fatalf("claimed: %+v", first)
		}
		for _, executor := range []string{"w1", "w2"} {
			_, err = b.client.Claim(ctx, q.ID, q.Delivery.ID, executor)
			apiError(t, err, http.StatusConflict, "not_claimable")
		}
		if n := countType(t, b, q.ID, "Claimed"); n != 1 {
			t.Fatalf("%d Claimed events, want 1", n)
		}
	})

	t.Run("ScheduledNotReleasedIsNotClaimable", func(t *testing.T) {
		t.Parallel()
		delay := 3600.0
		s := mustSchedule(t, b, api.ScheduleRequest{Queue: "claims", DelaySeconds: &delay})
		if s.Status != "scheduled" || s.Delivery != nil {
			t.Fatalf("delayed task: %+v", s)
		}
		for _, token := range []string{"any-token", "d-guess"} {
			_, err := b.client.Claim(ctx, s.ID, token, "w1")
			apiError(t, err, http.StatusConflict, "not_claimable")
		}
	})

	t.Run("TerminalIsNotClaimable", func(t *testing.T) {
		t.Parallel()
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "claims"})
		if _, err := b.client.Cancel(ctx, q.ID, "changed my mind"); err != nil {
			t.Fatal(err)
		}
		_, err := b.client.Claim(ctx, q.ID, q.Delivery.ID, "w1")
		apiError(t, err, http.StatusConflict, "not_claimable")
	})

	t.Run("MissingTaskIsNotFound", func(t *testing.T) {
		t.Parallel()
		_, err := b.client.Claim(ctx, "no-such-task", "d1", "w1")
		apiError(t, err, http.StatusNotFound, "")
	})
}

func TestConcurrentClaimsOneWinner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	q := queuedTask(t, b, api.ScheduleRequest{Queue: "race"})

	const claimers = 16
	errs := make([]error, claimers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range claimers {
		wg.Go(func() {
			<-start
			_, errs[i] = b.client.Claim(ctx, q.ID, q.Delivery.ID, "w"+string(rune('a'+i)))
		})
	}
	close(start)
	wg.Wait()

	won, lost := 0, 0
	for _, err := range errs {
		var e *api.Error
		switch {
		case err == nil:
			won++
		case errors.As(err, &e) && e.Status == http.StatusConflict && e.Reason == "not_claimable":
			lost++
		default:
			t.Errorf("claim answered %v, want 200 or 409 not_claimable", err)
		}
	}
	if won != 1 || lost != claimers-1 {
		t.Fatalf("%d claims won and %d lost, want 1 and %d", won, lost, claimers-1)
	}
	if n := countType(t, b, q.ID, "Claimed"); n != 1 {
		t.Fatalf("%d Claimed events, want 1", n)
	}
	if got := b.waitStatus(t, q.ID, "running"); got.Claim == nil || got.Claim.DeliveryID != q.Delivery.ID {
		t.Fatalf("running task: %+v", got)
	}
}

func TestResultAndCancelConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("ResultOnTerminalIsTerminal", func(t *testing.T) {
		t.Parallel()
		r := runningTask(t, b, api.ScheduleRequest{Queue: "results"})
		done, err := b.client.RecordResult(ctx, r.ID, api.ResultRequest{DeliveryID: r.Claim.DeliveryID, Success: true, Summary: "ok"})
		if err != nil || done.Status != "succeeded" {
			t.Fatalf("first result: %v %+v", err, done)
		}
		for _, req := range []api.ResultRequest{
			{DeliveryID: r.Claim.DeliveryID, Success: true, Summary: "again"},
			{Success: false, Error: "late failure"},
			{DeliveryID: "other-token", Success: true},
		} {
			_, err = b.client.RecordResult(ctx, r.ID, req)
			apiError(t, err, http.StatusConflict, "terminal")
		}
		got, err := b.client.Get(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != done.Version || got.Status != "succeeded" || got.Result == nil || got.Result.Summary != "ok" {
			t.Fatalf("refused results changed the task: %+v", got)
		}
	})

	t.Run("ResultOnCanceledIsTerminal", func(t *testing.T) {
		t.Parallel()
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "results"})
		if _, err := b.client.Cancel(ctx, q.ID, "stop"); err != nil {
			t.Fatal(err)
		}
		_, err := b.client.RecordResult(ctx, q.ID, api.ResultRequest{Success: true})
		apiError(t, err, http.StatusConflict, "terminal")
	})

	t.Run("ResultWithOtherDeliveryIsTokenMismatch", func(t *testing.T) {
		t.Parallel()
		r := runningTask(t, b, api.ScheduleRequest{Queue: "results"})
		_, err := b.client.RecordResult(ctx, r.ID, api.ResultRequest{DeliveryID: "not-the-claim", Success: true})
		apiError(t, err, http.StatusConflict, "token_mismatch")
		got := b.waitStatus(t, r.ID, "running")
		if got.Version != r.Version {
			t.Fatalf("a refused result changed the task: %+v", got)
		}
		done, err := b.client.RecordResult(ctx, r.ID, api.ResultRequest{DeliveryID: r.Claim.DeliveryID, Success: false, Error: "boom"})
		if err != nil || done.Status != "failed" || done.Result == nil || done.Result.Error != "boom" {
			t.Fatalf("result with the claim's token: %v %+v", err, done)
		}
	})

	t.Run("CancelOnTerminalIsTerminal", func(t *testing.T) {
		t.Parallel()
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "results"})
		canceled, err := b.client.Cancel(ctx, q.ID, "first")
		if err != nil || canceled.Status != "canceled" || canceled.Reason != "first" {
			t.Fatalf("cancel: %v %+v", err, canceled)
		}
		_, err = b.client.Cancel(ctx, q.ID, "second")
		apiError(t, err, http.StatusConflict, "terminal")

		r := runningTask(t, b, api.ScheduleRequest{Queue: "results"})
		if _, err := b.client.RecordResult(ctx, r.ID, api.ResultRequest{Success: true}); err != nil {
			t.Fatal(err)
		}
		_, err = b.client.Cancel(ctx, r.ID, "too late")
		apiError(t, err, http.StatusConflict, "terminal")
		if got, _ := b.client.Get(ctx, q.ID); got.Reason != "first" || got.Version != canceled.Version {
			t.Fatalf("a refused cancel changed the task: %+v", got)
		}
	})
}

func TestClaimNext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("EmptyQueueAnswersNoContent", func(t *testing.T) {
		t.Parallel()
		a := rawDo(t, b, http.MethodPost, "/v1/claims/next", `{"queue":"empty","executorId":"w1","waitSeconds":0}`)
		if a.status != http.StatusNoContent || len(a.body) != 0 {
			t.Fatalf("claims/next on an empty queue: %d %q, want 204 and no body", a.status, a.body)
		}
		_, ok, err := b.client.ClaimNext(ctx, "empty", "w1", 0)
		if err != nil || ok {
			t.Fatalf("client claims/next on an empty queue: ok=%v err=%v", ok, err)
		}
	})

	t.Run("QueuedTaskIsClaimedRunning", func(t *testing.T) {
		t.Parallel()
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "next", Message: text("m1", "do it")})
		got, ok, err := b.client.ClaimNext(ctx, "next", "w7", 5*time.Second)
		if err != nil || !ok {
			t.Fatalf("claims/next: ok=%v err=%v", ok, err)
		}
		if got.ID != q.ID || got.Status != "running" || got.Claim == nil ||
			got.Claim.ExecutorID != "w7" || got.Claim.DeliveryID != q.Delivery.ID || got.StartedAt.IsZero() {
			t.Fatalf("claimed: %+v", got)
		}
		if len(got.Message.Content) != 1 || got.Message.Content[0].Text != "do it" {
			t.Fatalf("claimed task lost its message: %+v", got.Message)
		}
		// The notification was consumed: the queue is empty again.
		if _, ok, err := b.client.ClaimNext(ctx, "next", "w8", 0); err != nil || ok {
			t.Fatalf("second claims/next: ok=%v err=%v", ok, err)
		}
		if n := countType(t, b, q.ID, "Claimed"); n != 1 {
			t.Fatalf("%d Claimed events, want 1", n)
		}
	})

	t.Run("StaleNotificationIsSkipped", func(t *testing.T) {
		t.Parallel()
		stale := queuedTask(t, b, api.ScheduleRequest{Queue: "stale"})
		if _, err := b.client.Cancel(ctx, stale.ID, "gone"); err != nil {
			t.Fatal(err)
		}
		fresh := queuedTask(t, b, api.ScheduleRequest{Queue: "stale"})
		got, ok, err := b.client.ClaimNext(ctx, "stale", "w1", 5*time.Second)
		if err != nil || !ok || got.ID != fresh.ID {
			t.Fatalf("claims/next past a stale notification: ok=%v err=%v task=%s, want %s", ok, err, got.ID, fresh.ID)
		}
	})
}
