package httpapi_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

func TestDelayedRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// waitsThenQueues checks a task scheduled to run about a second from
	// now: it answers scheduled without a delivery while runAt is ahead,
	// and is queued once it has come.
	waitsThenQueues := func(t *testing.T, s api.Task) {
		t.Helper()
		if s.Status != "scheduled" || s.Delivery != nil {
			t.Fatalf("delayed task at scheduling: %+v", s)
		}
		if !s.RunAt.After(s.CreatedAt) {
			t.Fatalf("runAt %v is not after createdAt %v", s.RunAt, s.CreatedAt)
		}
		before := time.Now()
		got, err := b.client.Get(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		// Only a read made before runAt must see the task unreleased; on a
		// very slow machine the second may already have passed.
		if before.Before(s.RunAt) && (got.Status != "scheduled" || got.Delivery != nil) {
			t.Fatalf("task released before its runAt %v: %+v", s.RunAt, got)
		}
		_, err = b.client.Claim(ctx, s.ID, "guess", "w1")
		if time.Now().Before(s.RunAt) { // the claim was decided before runAt
			apiError(t, err, http.StatusConflict, "not_claimable")
		}
		q := b.waitStatus(t, s.ID, "queued")
		if q.Delivery == nil || q.Delivery.ID == "" || !q.RunAt.Equal(s.RunAt) {
			t.Fatalf("released task: %+v", q)
		}
		want := []string{"TaskScheduled", "DeliveryPending", "ReadyPublished"}
		if got := historyTypes(t, b, s.ID); !slices.Equal(got, want) {
			t.Fatalf("history %v, want %v", got, want)
		}
	}

	t.Run("DelaySeconds", func(t *testing.T) {
		t.Parallel()
		delay := 1.0
		waitsThenQueues(t, mustSchedule(t, b, api.ScheduleRequest{Queue: "later", DelaySeconds: &delay}))
	})

	t.Run("RunAtAhead", func(t *testing.T) {
		t.Parallel()
		runAt := time.Now().Add(time.Second).UTC()
		s := mustSchedule(t, b, api.ScheduleRequest{Queue: "later", RunAt: &runAt})
		if !s.RunAt.Equal(runAt) {
			t.Fatalf("runAt %v, want %v", s.RunAt, runAt)
		}
		waitsThenQueues(t, s)
	})

	t.Run("RunAtInThePastReleasesAtOnce", func(t *testing.T) {
		t.Parallel()
		runAt := time.Now().Add(-time.Hour).UTC()
		s := mustSchedule(t, b, api.ScheduleRequest{Queue: "past", RunAt: &runAt})
		if !s.RunAt.Equal(runAt) {
			t.Fatalf("runAt %v, want %v", s.RunAt, runAt)
		}
		q := b.waitStatus(t, s.ID, "queued")
		if q.Delivery == nil || q.Delivery.ID == "" {
			t.Fatalf("released task without a delivery: %+v", q)
		}
	})

	t.Run("ZeroDelayReleasesAtOnce", func(t *testing.T) {
		t.Parallel()
		delay := 0.0
		s := mustSchedule(t, b, api.ScheduleRequest{Queue: "now", DelaySeconds: &delay})
		b.waitStatus(t, s.ID, "queued")
	})
}

func TestRunTimesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	timeout := 1
	r := runningTask(t, b, api.ScheduleRequest{Queue: "slow", TimeoutSeconds: &timeout})
	if r.TimeoutSeconds != 1 || r.Deadline.IsZero() || !r.Deadline.After(r.StartedAt) {
		t.Fatalf("running task: %+v", r)
	}

	got := b.waitStatus(t, r.ID, "timed_out")
	if got.CompletedAt.IsZero() || got.Result != nil {
		t.Fatalf("timed out task: %+v", got)
	}
	types := historyTypes(t, b, r.ID)
	if len(types) == 0 || types[len(types)-1] != "TimedOut" {
		t.Fatalf("history %v does not end with TimedOut", types)
	}
	if n := countType(t, b, r.ID, "TimedOut"); n != 1 {
		t.Fatalf("%d TimedOut events, want 1", n)
	}

	// The executor's late result and a late cancel are refused.
	_, err := b.client.RecordResult(ctx, r.ID, api.ResultRequest{DeliveryID: r.Claim.DeliveryID, Success: true})
	apiError(t, err, http.StatusConflict, "terminal")
	_, err = b.client.Cancel(ctx, r.ID, "late")
	apiError(t, err, http.StatusConflict, "terminal")
	ch, err := b.client.Check(ctx, r.ID)
	if err != nil || !ch.ShouldStop || ch.Reason != "terminal" {
		t.Fatalf("check on a timed out task: %v %+v", err, ch)
	}
}
