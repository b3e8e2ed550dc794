package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// refOf returns a pointer to a copy of v.
func refOf[T any](v T) *T { return &v }

// outcomes lists a task's attempts as "number outcome executor error".
func outcomes(task api.Task) []string {
	out := make([]string, len(task.Attempts))
	for i, a := range task.Attempts {
		out[i] = fmt.Sprintf("%d %s %s %s", a.Attempt, a.Outcome, a.ExecutorID, a.Error)
		if a.StartedAt.IsZero() || (a.Outcome != "running") == a.EndedAt.IsZero() {
			out[i] += " (bad times)"
		}
	}
	return out
}

// claimAttempt waits until task id is queued for attempt n and claims it
// as executor.
func claimAttempt(t *testing.T, b *bundle, id string, n int, executor string) api.Task {
	t.Helper()
	q := b.waitStatus(t, id, "queued")
	if q.Attempt != n || q.Delivery == nil {
		t.Fatalf("queued for attempt %d (delivery %+v), want %d", q.Attempt, q.Delivery, n)
	}
	task, err := b.client.Claim(context.Background(), id, q.Delivery.ID, executor)
	if err != nil {
		t.Fatalf("claim attempt %d: %v", n, err)
	}
	return task
}

// TestRetry: a task with three attempts fails twice and then succeeds;
// each attempt is listed, every attempt's effects stay, the history shows
// the retries, and the Run state carries across attempts.
func TestRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("FailsTwiceThenSucceeds", func(t *testing.T) {
		t.Parallel()
		task := mustSchedule(t, b, api.ScheduleRequest{Queue: "retry-e2e", Retry: &api.RetryRequest{MaxAttempts: refOf(3), BackoffSeconds: refOf(0)}})
		want := &events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: 0, MaxBackoffSeconds: events.DefaultMaxBackoffSeconds, On: []string{events.RetryOnFailed}}
		if !reflect.DeepEqual(task.Retry, want) || task.Attempt != 1 || task.MaxAttempts != 3 || len(task.Attempts) != 0 {
			t.Fatalf("scheduled: retry %+v attempt %d of %d, attempts %+v", task.Retry, task.Attempt, task.MaxAttempts, task.Attempts)
		}
		var rev uint64
		for n := 1; n <= 3; n++ {
			run := claimAttempt(t, b, task.ID, n, fmt.Sprintf("w%d", n))
			if run.Attempt != n || len(run.Attempts) != n || run.Attempts[n-1].Outcome != "running" {
				t.Fatalf("claimed attempt %d: %+v", n, outcomes(run))
			}
			// The Run state is the task's: each attempt's claim saves over
			// the revision the one before saved.
			if n > 1 {
				doc, err := b.client.GetRun(ctx, task.ID)
				if err != nil || doc.Revision != rev || doc.Run.Turn != n-1 {
					t.Fatalf("attempt %d reads run %+v, %v; want revision %d, turn %d", n, doc, err, rev, n-1)
				}
			}
			doc, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: run.Claim.DeliveryID, Revision: rev, Run: api.RunState{ExecutorID: run.Claim.ExecutorID, Turn: n}})
			if err != nil {
				t.Fatalf("attempt %d saves its run: %v", n, err)
			}
			rev = doc.Revision
			effect := events.Effect{Kind: "comment", Ref: fmt.Sprintf("c-%d", n)}
			if _, err := b.client.ReportEffects(ctx, task.ID, run.Claim.DeliveryID, []events.Effect{effect}); err != nil {
				t.Fatal(err)
			}
			res := api.ResultRequest{DeliveryID: run.Claim.DeliveryID, Error: fmt.Sprintf("flaky %d", n)}
			if n == 3 {
				res = api.ResultRequest{DeliveryID: run.Claim.DeliveryID, Success: true, Summary: "done"}
			}
			got, err := b.client.RecordResult(ctx, task.ID, res)
			if err != nil {
				t.Fatalf("attempt %d result: %v", n, err)
			}
			if n < 3 && (got.Status != "scheduled" && got.Status != "queued" || got.Result != nil || got.Claim != nil || got.Attempt != n+1) {
				t.Fatalf("after failed attempt %d: status %s result %+v claim %+v attempt %d", n, got.Status, got.Result, got.Claim, got.Attempt)
			}
			// The old claim is gone: its token can neither report nor save.
			if n < 3 {
				_, err = b.client.ReportEffects(ctx, task.ID, run.Claim.DeliveryID, []events.Effect{effect})
				apiError(t, err, http.StatusConflict, api.ErrTokenMismatch.Reason)
			}
		}
		done := b.waitStatus(t, task.ID, "succeeded")
		if got, want := outcomes(done), []string{"1 failed w1 flaky 1", "2 failed w2 flaky 2", "3 succeeded w3 "}; !reflect.DeepEqual(got, want) {
			t.Fatalf("attempts %q, want %q", got, want)
		}
		requireEffects(t, "every attempt's effects", done, events.Effect{Kind: "comment", Ref: "c-1"}, events.Effect{Kind: "comment", Ref: "c-2"}, events.Effect{Kind: "comment", Ref: "c-3"})
		list, err := b.client.List(ctx, api.ListOptions{Queue: "retry-e2e"})
		if err != nil || len(list.Tasks) != 1 || !reflect.DeepEqual(outcomes(list.Tasks[0]), outcomes(done)) || !reflect.DeepEqual(list.Tasks[0].Retry, want) {
			t.Fatalf("list: %+v, %v", list, err)
		}
		h, err := b.client.History(ctx, task.ID)
		if err != nil {
			t.Fatal(err)
		}
		var retries []string
		for _, ev := range h.Events {
			if ev.Type == string(events.TypeRetryScheduled) {
				retries = append(retries, ev.Status+": "+ev.Detail)
			}
		}
		if len(retries) != 2 || !strings.HasPrefix(retries[0], "scheduled: attempt 1 failed: flaky 1; attempt 2 at ") ||
			!strings.HasPrefix(retries[1], "scheduled: attempt 2 failed: flaky 2; attempt 3 at ") {
			t.Fatalf("history retries %q", retries)
		}
	})

	t.Run("NotRetryable", func(t *testing.T) {
		t.Parallel()
		run := runningTask(t, b, api.ScheduleRequest{Queue: "retry-final", Retry: &api.RetryRequest{MaxAttempts: refOf(3)}})
		got, err := b.client.RecordResult(ctx, run.ID, api.ResultRequest{DeliveryID: run.Claim.DeliveryID, Error: "bad input", Retryable: refOf(false)})
		if err != nil || got.Status != "failed" || got.Attempt != 1 || got.Result == nil || got.Result.Retryable == nil || *got.Result.Retryable {
			t.Fatalf("a failure that is not retryable: %+v, %v", got, err)
		}
		if !reflect.DeepEqual(outcomes(got), []string{"1 failed w1 bad input"}) {
			t.Fatalf("attempts %q", outcomes(got))
		}
	})

	t.Run("TimedOutOnlyWhenListed", func(t *testing.T) {
		t.Parallel()
		one := events.MinTimeoutSeconds
		onFailed := runningTask(t, b, api.ScheduleRequest{Queue: "retry-timeout", TimeoutSeconds: &one, Retry: &api.RetryRequest{MaxAttempts: refOf(3)}})
		onTimedOut := runningTask(t, b, api.ScheduleRequest{Queue: "retry-timeout", TimeoutSeconds: &one,
			Retry: &api.RetryRequest{MaxAttempts: refOf(2), BackoffSeconds: refOf(0), On: []string{events.RetryOnTimedOut}}})
		if got := b.waitStatus(t, onFailed.ID, "timed_out"); got.Attempt != 1 || !reflect.DeepEqual(outcomes(got), []string{"1 timed_out w1 "}) {
			t.Fatalf("retry on failed only, timed out: attempt %d, %q", got.Attempt, outcomes(got))
		}
		// Abandoned twice: the first timeout is retried, the second is final.
		second := claimAttempt(t, b, onTimedOut.ID, 2, "w2")
		if second.Attempts[0].Outcome != "timed_out" {
			t.Fatalf("first attempt %+v", second.Attempts[0])
		}
		done := b.waitStatus(t, onTimedOut.ID, "timed_out")
		if !reflect.DeepEqual(outcomes(done), []string{"1 timed_out w1 ", "2 timed_out w2 "}) {
			t.Fatalf("attempts %q", outcomes(done))
		}
		if got := countType(t, b, onTimedOut.ID, string(events.TypeRetryScheduled)); got != 1 {
			t.Fatalf("%d RetryScheduled events, want 1", got)
		}
	})

	// A failure racing the timeout of the same attempt: whichever lands
	// first ends the attempt, the other is refused or stale, and there is
	// exactly one retry.
	t.Run("ResultRacesTimeout", func(t *testing.T) {
		t.Parallel()
		one := events.MinTimeoutSeconds
		run := runningTask(t, b, api.ScheduleRequest{Queue: "retry-race", TimeoutSeconds: &one,
			Retry: &api.RetryRequest{MaxAttempts: refOf(2), BackoffSeconds: refOf(3600), On: []string{events.RetryOnFailed, events.RetryOnTimedOut}}})
		eventually(t, "the deadline is near", func() bool { return time.Until(run.Deadline) < 20*time.Millisecond })
		_, err := b.client.RecordResult(ctx, run.ID, api.ResultRequest{DeliveryID: run.Claim.DeliveryID, Error: "raced"})
		var e *api.Error
		if err != nil && !(errors.As(err, &e) && e.Reason == api.ErrTokenMismatch.Reason) {
			t.Fatalf("result racing the timeout: %v", err)
		}
		got := b.waitStatus(t, run.ID, "scheduled")
		wantOutcome := "1 failed w1 raced"
		if err != nil {
			wantOutcome = "1 timed_out w1 "
		}
		if got.Attempt != 2 || !reflect.DeepEqual(outcomes(got), []string{wantOutcome}) {
			t.Fatalf("after the race (result error %v): attempt %d, %q", err, got.Attempt, outcomes(got))
		}
		if n := countType(t, b, run.ID, string(events.TypeRetryScheduled)); n != 1 {
			t.Fatalf("%d RetryScheduled events, want 1", n)
		}
		// Not released before its nextAt, an hour on.
		if got.Delivery != nil || !got.RunAt.After(time.Now().Add(47*time.Minute)) {
			t.Fatalf("retry due at %v with delivery %+v, want about an hour on and no delivery", got.RunAt, got.Delivery)
		}
	})
}

// TestRetryValidation: every bound of a retry policy answers 400 with a
// reason, on a single schedule and per item of a batch.
func TestRetryValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, retry := range map[string]string{
		"MaxAttemptsZero":     `{"maxAttempts":0}`,
		"MaxAttemptsOver":     `{"maxAttempts":101}`,
		"MaxAttemptsNegative": `{"maxAttempts":-1}`,
		"MaxAttemptsString":   `{"maxAttempts":"3"}`,
		"MaxAttemptsFraction": `{"maxAttempts":1.5}`,
		"MaxAttemptsHuge":     `{"maxAttempts":1e30}`,
		"BackoffNegative":     `{"maxAttempts":2,"backoffSeconds":-1}`,
		"BackoffOver":         `{"maxAttempts":2,"backoffSeconds":86401}`,
		"MaxBackoffOver":      `{"maxAttempts":2,"maxBackoffSeconds":604801}`,
		"OnEmpty":             `{"maxAttempts":2,"on":[]}`,
		"OnUnknown":           `{"maxAttempts":2,"on":["canceled"]}`,
		"OnTwice":             `{"maxAttempts":2,"on":["failed","failed"]}`,
		"OnNotAList":          `{"maxAttempts":2,"on":"failed"}`,
		"NotAnObject":         `"always"`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := rawDo(t, b, http.MethodPost, "/v1/tasks", `{"queue":"retry-bad","retry":`+retry+`}`)
			requireErrorBody(t, a, http.StatusBadRequest, "invalid_argument")
			if !strings.Contains(string(a.body), "retry") && !strings.Contains(string(a.body), "maxAttempts") && !strings.Contains(string(a.body), "json") {
				t.Fatalf("reason does not name the field: %s", a.body)
			}
		})
	}
	items, err := b.client.ScheduleBatch(context.Background(), []api.ScheduleRequest{
		{Queue: "retry-batch", Retry: &api.RetryRequest{MaxAttempts: refOf(101)}},
		{Queue: "retry-batch", Retry: &api.RetryRequest{MaxAttempts: refOf(100), BackoffSeconds: refOf(86400), MaxBackoffSeconds: refOf(604800), On: []string{"timed_out", "failed"}}},
	})
	if err != nil || len(items) != 2 || items[0].Status != http.StatusBadRequest || !strings.Contains(items[0].Message, "retry.maxAttempts") ||
		items[1].Status != http.StatusCreated || items[1].Task.MaxAttempts != 100 {
		t.Fatalf("batch: %+v, %v", items, err)
	}
	list, err := b.client.List(context.Background(), api.ListOptions{Queue: "retry-bad"})
	if err != nil || len(list.Tasks) != 0 {
		t.Fatalf("refused schedules left tasks: %+v, %v", list, err)
	}
}
