package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// TestScheduleBatch: every item of a batch is its own task with its own
// outcome, in request order, and a failing item leaves the others alone.
func TestScheduleBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) {
		c.Admission = scheduler.Admission{PerCustomer: map[string]scheduler.Quota{"capped": {MaxActiveRoots: 1}}}
	})
	ctx := context.Background()
	done := runningTask(t, b, api.ScheduleRequest{})
	if _, err := b.client.RecordResult(ctx, done.ID, api.ResultRequest{DeliveryID: done.Claim.DeliveryID, Success: true}); err != nil {
		t.Fatal(err)
	}
	later := new(3600.0)
	// capped's one active root: racing items could overshoot the quota.
	mustSchedule(t, b, api.ScheduleRequest{CustomerID: "capped", DelaySeconds: later})
	items, err := b.client.ScheduleBatch(ctx, []api.ScheduleRequest{
		{Queue: "batch", DelaySeconds: later, Message: text("", "first")},
		{Queue: "bad.queue"},
		{ParentID: done.ID},
		{CustomerID: "capped", DelaySeconds: later, RequestID: "second-root"},
		{Queue: "batch", DelaySeconds: later, Message: text("", "last")},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		status int
		err    *api.Error
	}{{201, nil}, {400, api.ErrInvalid}, {409, api.ErrParentTerminal}, {429, api.ErrAdmissionRejected}, {201, nil}}
	if len(items) != len(want) {
		t.Fatalf("%d results for %d items", len(items), len(want))
	}
	for i, w := range want {
		it := items[i]
		if it.Status != w.status || (w.err == nil) != (it.Err() == nil) || (w.err != nil && !errors.Is(it.Err(), w.err)) {
			t.Fatalf("item %d = %+v (err %v), want status %d, error %v", i, it, it.Err(), w.status, w.err)
		}
		if w.err == nil && (it.Task == nil || it.Task.Status != api.StatusScheduled) {
			t.Fatalf("item %d has no scheduled task: %+v", i, it)
		}
	}
	if items[3].Task == nil || items[3].Task.Status != api.StatusCanceled {
		t.Fatalf("a rejected item carries the task as recorded: %+v", items[3])
	}
	if got := items[0].Task.Message.Content[0].Text + " " + items[4].Task.Message.Content[0].Text; got != "first last" {
		t.Fatalf("results out of request order: %q", got)
	}
	list, err := b.client.List(ctx, api.ListOptions{Queue: "batch"})
	if err != nil || len(list.Tasks) != 2 {
		t.Fatalf("queue batch has %d tasks (%v), want the 2 scheduled", len(list.Tasks), err)
	}
}

// TestScheduleBatchRetried: a batch retried after a lost answer (same
// requestIds) finds the tasks of the first try, creating none.
func TestScheduleBatchRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	reqs := make([]api.ScheduleRequest, 200)
	for i := range reqs {
		reqs[i] = api.ScheduleRequest{Queue: "retried", RequestID: fmt.Sprintf("req-%03d", i), DelaySeconds: new(3600.0)}
	}
	first, err := b.client.ScheduleBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.client.ScheduleBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if first[i].Status != http.StatusCreated || again[i].Status != http.StatusOK || again[i].Task.ID != first[i].Task.ID {
			t.Fatalf("item %d: first %d %s, retry %d %v", i, first[i].Status, first[i].Task.ID, again[i].Status, again[i].Task)
		}
	}
	list, err := b.client.List(ctx, api.ListOptions{Queue: "retried", Limit: api.MaxListLimit})
	if err != nil || len(list.Tasks) != len(reqs) {
		t.Fatalf("%d tasks after the retry (%v), want %d", len(list.Tasks), err, len(reqs))
	}
}

// TestBatchLimits: an empty batch, one over the item limit, a malformed
// body and a body over the batch size are refused whole.
func TestBatchLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tooMany := make([]api.ScheduleRequest, api.MaxBatchItems+1)
	for _, reqs := range [][]api.ScheduleRequest{nil, tooMany} {
		if _, err := b.client.ScheduleBatch(ctx, reqs); !errors.Is(err, api.ErrInvalid) {
			t.Fatalf("batch of %d: %v, want ErrInvalid", len(reqs), err)
		}
	}
	if _, err := b.client.RecordResults(ctx, nil); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("empty results: %v, want ErrInvalid", err)
	}
	for _, max := range []int{-1, api.MaxBatchItems + 1} {
		if _, err := b.client.ClaimBatch(ctx, "q", "w1", max, 0); !errors.Is(err, api.ErrInvalid) {
			t.Fatalf("claim max %d: %v, want ErrInvalid", max, err)
		}
	}
	requireErrorBody(t, rawDo(t, b, "POST", "/v1/tasks/batch", `{"tasks": [{"queue": "q"}`), 400, "invalid_argument")
	requireErrorBody(t, rawDo(t, b, "POST", "/v1/results", `{"results": [{"taskId": "no.such"}]}`), 400, "invalid_argument")
	big := `{"tasks": [{"repo": "` + strings.Repeat("r", api.MaxBatchBodyBytes) + `"}]}`
	requireErrorBody(t, rawDo(t, b, "POST", "/v1/tasks/batch", big), 413, "payload_too_large")
	list, err := b.client.List(ctx, api.ListOptions{})
	if err != nil || len(list.Tasks) != 0 {
		t.Fatalf("refused batches left %d tasks (%v)", len(list.Tasks), err)
	}
}

// TestClaimBatchAndResults: batch claims take every ready task exactly
// once, and batch results settle each item on its own.
func TestClaimBatchAndResults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 50
	reqs := make([]api.ScheduleRequest, n)
	for i := range reqs {
		reqs[i] = api.ScheduleRequest{Queue: "drain"}
	}
	if _, err := b.client.ScheduleBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	claimed := map[string]api.Task{}
	deadline := time.Now().Add(30 * time.Second)
	for len(claimed) < n && time.Now().Before(deadline) {
		tasks, err := b.client.ClaimBatch(ctx, "drain", "w1", 20, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) > 20 {
			t.Fatalf("claimed %d tasks with max 20", len(tasks))
		}
		for _, task := range tasks {
			if _, dup := claimed[task.ID]; dup || task.Status != api.StatusRunning || task.Claim == nil {
				t.Fatalf("task %s claimed twice or not running: %+v", task.ID, task)
			}
			claimed[task.ID] = task
		}
	}
	if len(claimed) != n {
		t.Fatalf("claimed %d of %d tasks", len(claimed), n)
	}
	if tasks, err := b.client.ClaimBatch(ctx, "drain", "w1", 5, 50*time.Millisecond); err != nil || len(tasks) != 0 {
		t.Fatalf("an empty queue answered %v, %v; want no tasks", tasks, err)
	}

	var items []api.ResultItem
	for _, task := range claimed {
		items = append(items, api.ResultItem{TaskID: task.ID, ResultRequest: api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}})
	}
	some := items[0]
	items = append(items,
		api.ResultItem{TaskID: some.TaskID, ResultRequest: api.ResultRequest{DeliveryID: "stale", Success: true}},
		api.ResultItem{TaskID: "no-such-task", ResultRequest: api.ResultRequest{Success: true}})
	res, err := b.client.RecordResults(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range res[:n] {
		if it.Status != http.StatusOK || it.Task.ID != items[i].TaskID || it.Task.Status != api.StatusSucceeded {
			t.Fatalf("result %d = %+v", i, it)
		}
	}
	if !errors.Is(res[n].Err(), api.ErrTokenMismatch) && !errors.Is(res[n].Err(), api.ErrTerminal) {
		t.Fatalf("a stale token's result = %+v", res[n])
	}
	if !errors.Is(res[n+1].Err(), api.ErrNotFound) {
		t.Fatalf("an unknown task's result = %+v", res[n+1])
	}
	// The batch answered once the projections had applied every result
	// (an ending event waits for their tail): a listing shows them all.
	list, err := b.client.List(ctx, api.ListOptions{Queue: "drain", Status: api.StatusSucceeded, Limit: api.MaxListLimit})
	if err != nil || len(list.Tasks) != n {
		t.Fatalf("%d succeeded tasks listed right after the batch (%v), want %d", len(list.Tasks), err, n)
	}
}

// TestScheduleBatchQuota: the items of a batch that admission counts run
// at most 64 at once, each in the projections before the next looks, so
// a batch overshoots a quota by no more than racing single requests do
// (all of a batch's items at once would all be admitted).
func TestScheduleBatchQuota(t *testing.T) {
	t.Parallel()
	const quota, limitedParallelism = 5, 64 // the latter scheduler's
	b := setup(t, withAdmission(scheduler.Admission{PerCustomer: map[string]scheduler.Quota{"capped": {MaxActiveRoots: quota}}}))
	reqs := make([]api.ScheduleRequest, 300)
	for i := range reqs {
		reqs[i] = api.ScheduleRequest{CustomerID: "capped", Queue: "quota", DelaySeconds: new(3600.0)}
	}
	items, err := b.client.ScheduleBatch(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for i, it := range items {
		switch {
		case it.Status == http.StatusCreated:
			admitted++
		case !errors.Is(it.Err(), api.ErrAdmissionRejected):
			t.Fatalf("item %d = %+v (%v), want 201 or 429", i, it, it.Err())
		}
	}
	if admitted < quota || admitted >= quota+limitedParallelism {
		t.Fatalf("%d of %d items admitted at a quota of %d active roots, want %d to %d", admitted, len(reqs), quota, quota, quota+limitedParallelism-1)
	}
}
