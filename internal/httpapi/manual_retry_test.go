package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// TestManualRetry: POST /v1/tasks/{id}/retry makes a new root task with the
// terminal task's spec (queue, message, repo, labels, signal, timeout,
// retry policy, concurrency), related to it, from attempt 1; a requestId makes it idempotent,
// a live task is 409 not_terminal, and bad input is 400 with nothing
// written.
func TestManualRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	timeout := 90
	sig := events.Signal{ID: "sig-1", URI: "https://example.com/hook"}
	old := runningTask(t, b, api.ScheduleRequest{
		Queue: "retry", Message: text("m", "flaky job"), Repo: "https://example.com/repo", Signal: sig,
		Labels: map[string]string{"repo": "example/storefront"}, TimeoutSeconds: &timeout, RequestID: "first",
		Retry:       &api.RetryRequest{MaxAttempts: refOf(3), BackoffSeconds: refOf(5), On: []string{"failed", "timed_out"}},
		Concurrency: &events.Concurrency{Key: "repo:example/storefront", Limit: 1000},
	})
	// Not retryable: the policy's attempts are not used, the task fails.
	if done, err := b.client.RecordResult(ctx, old.ID, api.ResultRequest{DeliveryID: old.Claim.DeliveryID, Error: "tool flaked", Retryable: refOf(false)}); err != nil || done.Status != "failed" {
		t.Fatalf("result: %v %+v", err, done)
	}
	// The failed task's concurrency slot is released by the alarm after
	// the answer: wait for that write, so the subtests that count the
	// log's events count only their own.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		k, err := b.client.Concurrency(ctx, old.Concurrency.Key, old.CustomerID)
		if err == nil && len(k.Holders) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the failed task's slot was not released: %v %+v", err, k)
		}
	}
	settled(t, b)

	t.Run("SameSpec", func(t *testing.T) {
		t.Parallel()
		task, created, err := b.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{})
		if err != nil || !created {
			t.Fatalf("retry: created=%v %v", created, err)
		}
		wantRetry := events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: 5, MaxBackoffSeconds: events.DefaultMaxBackoffSeconds, On: []string{"failed", "timed_out"}}
		for _, c := range []struct {
			field string
			ok    bool
		}{
			{"id", task.ID != old.ID},
			{"rootId", task.RootID == task.ID && task.ParentID == ""},
			{"relatedTaskId", task.RelatedTaskID == old.ID},
			{"retryOf", task.RetryOf == old.ID},
			{"requestId", task.RequestID == ""},
			{"queue", task.Queue == "retry"},
			{"message", len(task.Message.Content) == 1 && task.Message.Content[0].Text == "flaky job"},
			{"repo", task.Repo == old.Repo},
			{"labels", equalLabels(task.Labels, old.Labels)},
			{"signal", task.Signal != nil && *task.Signal == sig},
			{"timeoutSeconds", task.TimeoutSeconds == 90},
			{"retry", task.Retry != nil && reflect.DeepEqual(*task.Retry, wantRetry) && task.MaxAttempts == 3},
			{"attempt", task.Attempt == 1 && len(task.Attempts) == 0},
			{"concurrency", task.Concurrency != nil && *task.Concurrency == *old.Concurrency},
		} {
			if !c.ok {
				t.Errorf("the retry's %s: retry task %+v\nof %+v", c.field, task, old)
			}
		}
		b.waitStatus(t, task.ID, "queued") // a new run
		h, err := b.client.History(ctx, task.ID)
		if err != nil || !strings.Contains(h.Events[0].Detail, "retry of "+old.ID) {
			t.Fatalf("history of the retry: %v %+v", err, h)
		}
	})

	t.Run("WithoutRequestIDEachCallIsANewTask", func(t *testing.T) {
		t.Parallel()
		a, _, err1 := b.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{})
		c, _, err2 := b.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{})
		if err1 != nil || err2 != nil || a.ID == c.ID {
			t.Fatalf("two retries: %s %v, %s %v", a.ID, err1, c.ID, err2)
		}
	})

	t.Run("RequestIDIsIdempotentUnderRaces", func(t *testing.T) {
		t.Parallel()
		var wg sync.WaitGroup
		ids, created := make([]string, 8), make([]bool, 8)
		errs := make([]error, 8)
		for i := range ids {
			wg.Go(func() {
				var task api.Task
				task, created[i], errs[i] = b.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{RequestID: "retry-once"})
				ids[i] = task.ID
			})
		}
		wg.Wait()
		n := 0
		for i := range ids {
			if errs[i] != nil || ids[i] != ids[0] {
				t.Fatalf("racing retries: %v %v", ids, errs)
			}
			if created[i] {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d of the racing retries answered 201, want 1", n)
		}
		a := rawDo(t, b, http.MethodPost, "/v1/tasks/"+old.ID+"/retry", `{"requestId": "retry-once"}`)
		if a.status != http.StatusOK {
			t.Fatalf("repeat: %d %s, want 200", a.status, a.body)
		}
		a = rawDo(t, b, http.MethodPost, "/v1/tasks/"+old.ID+"/retry", `{"requestId": "retry-once", "message": {"content": [{"type": "text", "text": ""}]}}`)
		if a.status != http.StatusBadRequest {
			t.Fatalf("repeat with an invalid message: %d %s, want 400", a.status, a.body)
		}
		l, err := b.client.List(ctx, api.ListOptions{RequestID: "retry-once"})
		if err != nil || len(l.Tasks) != 1 || l.Tasks[0].ID != ids[0] || l.Tasks[0].RequestID != "retry-once" {
			t.Fatalf("list by the retry's request id: %v %+v", err, l)
		}
	})

	t.Run("GivenMessageAndRunAt", func(t *testing.T) {
		t.Parallel()
		runAt := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
		msg := text("m2", "try the other mirror")
		task, created, err := b.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{Message: &msg, RunAt: &runAt})
		if err != nil || !created || task.Message.Content[0].Text != "try the other mirror" || task.Message.ID != "m2" ||
			!task.RunAt.Equal(runAt) || task.Status != "scheduled" {
			t.Fatalf("retry with a message: %v %+v", err, task)
		}
	})

	t.Run("RetryOfARetry", func(t *testing.T) {
		t.Parallel()
		first, _, err := b.client.RetryTask(ctx, old.ID, api.RetryTaskRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.Cancel(ctx, first.ID, "again"); err != nil {
			t.Fatal(err)
		}
		second, _, err := b.client.RetryTask(ctx, first.ID, api.RetryTaskRequest{})
		if err != nil || second.RelatedTaskID != first.ID || second.RetryOf != first.ID || !equalLabels(second.Labels, old.Labels) {
			t.Fatalf("retry of a retry: %v %+v", err, second)
		}
	})

	t.Run("LiveTaskIsNotTerminal", func(t *testing.T) { // not parallel: it counts the log's events
		live := mustSchedule(t, b, api.ScheduleRequest{Queue: "retry", DelaySeconds: refOf(3600.0)})
		before := lastSeq(t, b)
		_, _, err := b.client.RetryTask(ctx, live.ID, api.RetryTaskRequest{})
		apiError(t, err, http.StatusConflict, "not_terminal")
		if !errors.Is(err, api.ErrNotTerminal) {
			t.Fatalf("errors.Is(%v, api.ErrNotTerminal) is false", err)
		}
		if after := lastSeq(t, b); after != before {
			t.Fatalf("a refused retry wrote to the log: %d → %d", before, after)
		}
	})

	t.Run("BadInput", func(t *testing.T) { // not parallel: it counts the log's events
		before := lastSeq(t, b)
		path := "/v1/tasks/" + old.ID + "/retry"
		for _, body := range []string{
			`{"requestId": "a b"}`,
			`{"requestId": "` + strings.Repeat("r", 65) + `"}`,
			`{"message": {"content": [{"type": "text", "text": ""}]}}`,
			`{"message": {"content": [{"type": "text", "text": "` + strings.Repeat("x", 64<<10+1) + `"}]}}`,
			`{"runAt": "1969-12-31T00:00:00Z"}`,
			`{"runAt": "2999-01-01T00:00:00Z"}`,
			`{"runAt": "tomorrow"}`,
			`{"requestId": 7}`,
			`[]`,
		} {
			requireErrorBody(t, rawDo(t, b, http.MethodPost, path, body), http.StatusBadRequest, "invalid_argument")
		}
		requireErrorBody(t, rawDo(t, b, http.MethodPost, "/v1/tasks/bad.id/retry", ""), http.StatusBadRequest, "invalid_argument")
		requireErrorBody(t, rawDo(t, b, http.MethodPost, "/v1/tasks/"+events.NewID()+"/retry", ""), http.StatusNotFound, "not_found")
		if after := lastSeq(t, b); after != before {
			t.Fatalf("refused retries wrote to the log: %d → %d", before, after)
		}
	})
}

// TestManualRetryTenancy: another customer's task is 404, for the retry and
// for the list by request id; the owner's retry is the owner's task.
func TestManualRetryTenancy(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	a, other := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b")
	task := tenantQueued(t, a, api.ScheduleRequest{Queue: "retry", RequestID: "mine"})
	if _, err := a.Cancel(ctx, task.ID, "done"); err != nil {
		t.Fatal(err)
	}
	_, _, err := other.RetryTask(ctx, task.ID, api.RetryTaskRequest{})
	apiError(t, err, http.StatusNotFound, "")
	if l, err := other.List(ctx, api.ListOptions{RequestID: "mine"}); err != nil || len(l.Tasks) != 0 {
		t.Fatalf("another customer's list by request id: %v %+v", err, l)
	}
	retry, created, err := a.RetryTask(ctx, task.ID, api.RetryTaskRequest{RequestID: "mine-again"})
	if err != nil || !created || retry.CustomerID != "A" {
		t.Fatalf("owner's retry: %v %+v", err, retry)
	}
	if l, err := a.List(ctx, api.ListOptions{RequestID: "mine"}); err != nil || len(l.Tasks) != 1 || l.Tasks[0].ID != task.ID {
		t.Fatalf("owner's list by request id: %v %+v", err, l)
	}
}

// TestManualRetryAdmission: a retry is a new root task, admitted (and
// rejected) by the customer's quotas as one.
func TestManualRetryAdmission(t *testing.T) {
	t.Parallel()
	b := setup(t, withAdmission(scheduler.Admission{
		PerCustomer: map[string]scheduler.Quota{"acme": {MaxActiveRoots: 1}},
	}))
	ctx := context.Background()
	first := admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm"})
	if _, err := b.client.Cancel(ctx, first.ID, "done"); err != nil {
		t.Fatal(err)
	}
	retry, created, err := b.client.RetryTask(ctx, first.ID, api.RetryTaskRequest{})
	if err != nil || !created {
		t.Fatalf("retry within the quota: %v", err)
	}
	_, _, err = b.client.RetryTask(ctx, first.ID, api.RetryTaskRequest{})
	var e *api.Error
	if !errors.As(err, &e) || e.Code != "admission_rejected" || e.Task == nil || e.Task.RetryOf != first.ID {
		t.Fatalf("retry over the quota (one active root: %s): %v", retry.ID, err)
	}
}
