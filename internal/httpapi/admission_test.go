package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// withAdmission configures the node's admission control.
func withAdmission(a scheduler.Admission) func(*node.Config) {
	return func(c *node.Config) { c.Admission = a }
}

// admTry schedules req and returns the task and the HTTP status: 201 or
// 200 on success, the error's status (with the error) otherwise.
func admTry(t *testing.T, b *bundle, req api.ScheduleRequest) (api.Task, int, *api.Error) {
	t.Helper()
	task, created, err := b.client.Schedule(context.Background(), req)
	if err == nil {
		if created {
			return task, http.StatusCreated, nil
		}
		return task, http.StatusOK, nil
	}
	var e *api.Error
	if !errors.As(err, &e) {
		t.Fatalf("schedule %+v: %v", req, err)
	}
	return task, e.Status, e
}

// admAdmitted schedules req and requires a 201.
func admAdmitted(t *testing.T, b *bundle, req api.ScheduleRequest) api.Task {
	t.Helper()
	task, code, e := admTry(t, b, req)
	if code != http.StatusCreated {
		t.Fatalf("schedule %+v: got %d (%v), want 201", req, code, e)
	}
	if task.Status == "canceled" || task.ID == "" {
		t.Fatalf("admitted task looks rejected: %+v", task)
	}
	return task
}

// admRejected schedules req, requires a 429 admission_rejected whose task
// is canceled with a reason containing want, and returns that task.
func admRejected(t *testing.T, b *bundle, req api.ScheduleRequest, want string) api.Task {
	t.Helper()
	_, code, e := admTry(t, b, req)
	if code != http.StatusTooManyRequests {
		t.Fatalf("schedule %+v: got %d (%v), want 429", req, code, e)
	}
	if e.Code != "admission_rejected" || e.Task == nil {
		t.Fatalf("429 answer: code %q task %v, want admission_rejected with the task", e.Code, e.Task)
	}
	task := *e.Task
	if task.ID == "" || task.Status != "canceled" || !strings.Contains(task.Reason, want) {
		t.Fatalf("rejected task: id %q status %q reason %q, want a canceled task with a reason containing %q", task.ID, task.Status, task.Reason, want)
	}
	if !strings.Contains(e.Message, want) {
		t.Fatalf("429 message %q does not contain %q", e.Message, want)
	}
	return task
}

// admMetric reads an unlabelled counter or gauge from GET /metrics.
func admMetric(t *testing.T, b *bundle, name string) float64 {
	t.Helper()
	resp, err := b.client.HTTP.Get(b.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", sc.Text(), err)
			}
			return v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("metric %s not in /metrics", name)
	return 0
}

// TestAdmissionQuotaActiveRoots checks the HTTP answer of a rejection: a
// 429 with Retry-After and the JSON error body carrying the rejected
// task, counted on /metrics. (What admission decides is
// internal/scheduler's TestAdmission*.)
func TestAdmissionQuotaActiveRoots(t *testing.T) {
	t.Parallel()
	b := setup(t, withAdmission(scheduler.Admission{
		PerCustomer: map[string]scheduler.Quota{"acme": {MaxActiveRoots: 3}},
	}))

	for i := range 3 {
		admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "root-" + strconv.Itoa(i)})
	}

	// The fourth root, over raw HTTP to see the whole answer.
	body := `{"customerId": "acme", "queue": "adm", "requestId": "root-4"}`
	resp, err := b.client.HTTP.Post(b.url+"/v1/tasks", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("fourth root: %s %s, want 429", resp.Status, raw)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("429 Content-Type %q", ct)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Fatalf("429 without Retry-After: %v", resp.Header)
	}
	var rej struct {
		Error   string   `json:"error"`
		Message string   `json:"message"`
		Task    api.Task `json:"task"`
	}
	if err := json.Unmarshal(raw, &rej); err != nil {
		t.Fatalf("429 body %s: %v", raw, err)
	}
	if rej.Error != "admission_rejected" || rej.Message == "" {
		t.Fatalf("429 body %s: want error admission_rejected and a message", raw)
	}
	rejected := rej.Task
	if rejected.ID == "" || rejected.Status != "canceled" || !strings.Contains(rejected.Reason, "quota") ||
		rejected.CustomerID != "acme" || rejected.RequestID != "root-4" {
		t.Fatalf("rejected task %+v: want canceled by the quota", rejected)
	}

	if got := admMetric(t, b, "taskledger_admission_rejections_total"); got != 1 {
		t.Fatalf("taskledger_admission_rejections_total = %v, want 1", got)
	}
}

// admChecker is a fake external usage checker whose answer is switched by
// mode ("allow" or "deny"). It is safe for concurrent use.
type admChecker struct {
	srv   *httptest.Server
	mode  atomic.Value // string
	calls atomic.Int64
}

func newAdmChecker(t *testing.T) *admChecker {
	c := &admChecker{}
	c.mode.Store("allow")
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.calls.Add(1)
		var q scheduler.UsageQuery
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch c.mode.Load().(string) {
		case "deny":
			io.WriteString(w, `{"allow": false, "reason": "over budget"}`)
		case "allow":
			io.WriteString(w, `{"allow": true}`)
		}
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// TestAdmissionReplayNotCharged: a replay of an admitted root is answered
// 200 without asking the usage checker, and a full quota refuses before
// the checker is asked. (Not in internal/scheduler's tests.)
func TestAdmissionReplayNotCharged(t *testing.T) {
	t.Parallel()
	checker := newAdmChecker(t)
	b := setup(t, withAdmission(scheduler.Admission{
		Default:    scheduler.Quota{MaxActiveRoots: 1},
		CheckerURL: checker.srv.URL, CheckerTimeout: 100 * time.Millisecond,
	}))
	req := api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "once"}

	first := admAdmitted(t, b, req)
	checker.mode.Store("deny") // a replay must not ask either
	for range 3 {
		again, code, e := admTry(t, b, req)
		if code != http.StatusOK || again.ID != first.ID {
			t.Fatalf("replay: %d (%v) task %s, want 200 with %s", code, e, again.ID, first.ID)
		}
	}
	if n := checker.calls.Load(); n != 1 {
		t.Fatalf("checker called %d times, want 1 (replays are not checked)", n)
	}
	if scheduled := countType(t, b, first.ID, "TaskScheduled"); scheduled != 1 {
		t.Fatalf("history of the replayed task has %d TaskScheduled events, want 1", scheduled)
	}
	// The quota is full, so a new root is refused by the quota, before
	// the checker is asked.
	admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "twice"}, "quota")
	if n := checker.calls.Load(); n != 1 {
		t.Fatalf("checker called %d times, want 1 (a full quota answers first)", n)
	}
}

// TestAdmissionConcurrentReplays: racing first requests at a quota of one
// answer one 201 and 200s, and racing retries of a rejection answer the
// same 429. (Not in internal/scheduler's tests.)
func TestAdmissionConcurrentReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, withAdmission(scheduler.Admission{Default: scheduler.Quota{MaxActiveRoots: 1}}))
	ctx := context.Background()

	// Racing first requests with one request id: one creates the task,
	// the others answer it; the quota it fills does not refuse them.
	const n = 8
	tasks := make([]api.Task, n)
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			tasks[i], created[i], errs[i] = b.client.Schedule(ctx, api.ScheduleRequest{CustomerID: "acme", RequestID: "racy"})
		})
	}
	wg.Wait()
	creators := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v, want 201 or 200", i, errs[i])
		}
		if tasks[i].ID != tasks[0].ID {
			t.Fatalf("request %d answered task %s, request 0 %s", i, tasks[i].ID, tasks[0].ID)
		}
		if created[i] {
			creators++
		}
	}
	if creators != 1 {
		t.Fatalf("%d requests answered 201, want 1", creators)
	}

	// Racing retries of a rejected request all answer the same rejection.
	for i := range n {
		wg.Go(func() {
			tasks[i], created[i], errs[i] = b.client.Schedule(ctx, api.ScheduleRequest{CustomerID: "acme", RequestID: "refused"})
		})
	}
	wg.Wait()
	var rejectedID string
	for i := range n {
		var e *api.Error
		if !errors.As(errs[i], &e) || e.Status != http.StatusTooManyRequests || e.Task == nil {
			t.Fatalf("retry %d: %v, want 429 with the task", i, errs[i])
		}
		if rejectedID == "" {
			rejectedID = e.Task.ID
		}
		if e.Task.ID != rejectedID {
			t.Fatalf("retry %d answered task %s, others %s", i, e.Task.ID, rejectedID)
		}
	}
	if h := historyTypes(t, b, rejectedID); len(h) != 1 || h[0] != "AdmissionRejected" {
		t.Fatalf("history of the rejected task: %v", h)
	}
}
