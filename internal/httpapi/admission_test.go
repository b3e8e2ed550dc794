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

// admHistory returns the event types of a task's history.
func admHistory(t *testing.T, b *bundle, id string) []string {
	t.Helper()
	h, err := b.client.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	types := make([]string, len(h.Events))
	for i, ev := range h.Events {
		types[i] = ev.Type
	}
	return types
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

func TestAdmissionQuotaActiveRoots(t *testing.T) {
	t.Parallel()
	b := setup(t, withAdmission(scheduler.Admission{
		PerCustomer: map[string]scheduler.Quota{"acme": {MaxActiveRoots: 3}, "globex": {MaxActiveRoots: 3}},
	}))
	ctx := context.Background()

	var roots []api.Task
	for i := range 3 {
		roots = append(roots, admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "root-" + strconv.Itoa(i)}))
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

	t.Run("Persisted", func(t *testing.T) {
		got, err := b.client.Get(ctx, rejected.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != "canceled" || got.Reason != rejected.Reason || got.CompletedAt.IsZero() {
			t.Fatalf("GET rejected task: %+v", got)
		}
		if h := admHistory(t, b, rejected.ID); len(h) != 1 || h[0] != "AdmissionRejected" {
			t.Fatalf("history of the rejected task: %v, want [AdmissionRejected]", h)
		}
	})

	t.Run("RetryRepeatsRejection", func(t *testing.T) {
		again := admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "root-4"}, "quota")
		if again.ID != rejected.ID || again.Version != rejected.Version {
			t.Fatalf("retry answered task %s v%d, want %s v%d", again.ID, again.Version, rejected.ID, rejected.Version)
		}
		if h := admHistory(t, b, rejected.ID); len(h) != 1 {
			t.Fatalf("retry appended events: %v", h)
		}
		// A fresh request (no request id) is refused too, as a new task.
		other := admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm"}, "quota")
		if other.ID == rejected.ID {
			t.Fatal("a request without request id reused the rejected task")
		}
	})

	t.Run("ChildrenAdmitted", func(t *testing.T) {
		for i := range 4 {
			child := admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", ParentID: roots[i%3].ID})
			if child.RootID != roots[i%3].ID {
				t.Fatalf("child root %s, want %s", child.RootID, roots[i%3].ID)
			}
		}
		// A child of the rejected candidate: its parent is terminal.
		_, _, err := b.client.Schedule(ctx, api.ScheduleRequest{CustomerID: "acme", ParentID: rejected.ID})
		apiError(t, err, http.StatusConflict, "parent_terminal")
	})

	t.Run("OtherCustomerUnaffected", func(t *testing.T) {
		for range 3 {
			admAdmitted(t, b, api.ScheduleRequest{CustomerID: "globex", Queue: "adm"})
		}
		admRejected(t, b, api.ScheduleRequest{CustomerID: "globex", Queue: "adm"}, "quota")
		// No quota configured for this one (zero default: unlimited).
		for range 5 {
			admAdmitted(t, b, api.ScheduleRequest{CustomerID: "initech", Queue: "adm"})
		}
	})

	t.Run("CancelFreesSlot", func(t *testing.T) {
		if _, err := b.client.Cancel(ctx, roots[0].ID, "make room"); err != nil {
			t.Fatal(err)
		}
		admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "root-5"})
		admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "root-6"}, "quota")
	})

	if got := admMetric(t, b, "taskledger_admission_rejections_total"); got != 4 {
		t.Fatalf("taskledger_admission_rejections_total = %v, want 4 (retries are not counted)", got)
	}
}

func TestAdmissionQuotaRootsPerMinute(t *testing.T) {
	t.Parallel()
	b := setup(t, withAdmission(scheduler.Admission{Default: scheduler.Quota{MaxRootsPerMinute: 2}}))
	ctx := context.Background()

	first := admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm"})
	second := admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm"})
	admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm"}, "minute")

	// Finishing a root frees no per-minute budget, but children are free.
	if _, err := b.client.Cancel(ctx, first.ID, "done early"); err != nil {
		t.Fatal(err)
	}
	admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm"}, "minute")
	for range 3 {
		admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", ParentID: second.ID})
	}
	// Rejections are not admissions: another customer has its own budget.
	admAdmitted(t, b, api.ScheduleRequest{CustomerID: "globex", Queue: "adm"})
	admAdmitted(t, b, api.ScheduleRequest{CustomerID: "globex", Queue: "adm"})
	admRejected(t, b, api.ScheduleRequest{CustomerID: "globex", Queue: "adm"}, "minute")
}

// admChecker is a fake external usage checker whose answer is switched by
// mode. It is safe for concurrent use.
type admChecker struct {
	srv   *httptest.Server
	mode  atomic.Value // string
	calls atomic.Int64
	mu    sync.Mutex
	last  scheduler.UsageQuery
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
		c.mu.Lock()
		c.last = q
		c.mu.Unlock()
		switch c.mode.Load().(string) {
		case "deny":
			io.WriteString(w, `{"allow": false, "reason": "over budget"}`)
		case "allow":
			io.WriteString(w, `{"allow": true}`)
		case "error":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "garbage":
			io.WriteString(w, `<html>not json</html>`)
		case "slow":
			// Far past the checker timeout; a deny that must never count.
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			io.WriteString(w, `{"allow": false, "reason": "too late"}`)
		}
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *admChecker) lastQuery() scheduler.UsageQuery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

func TestAdmissionChecker(t *testing.T) {
	t.Parallel()
	checker := newAdmChecker(t)
	b := setup(t, withAdmission(scheduler.Admission{CheckerURL: checker.srv.URL, CheckerTimeout: 100 * time.Millisecond}))
	const failures = "taskledger_usage_checker_failures_total"
	var root api.Task

	t.Run("Deny", func(t *testing.T) {
		checker.mode.Store("deny")
		task := admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "chk", RequestID: "denied"}, "over budget")
		if checker.calls.Load() != 1 {
			t.Fatalf("checker called %d times, want 1", checker.calls.Load())
		}
		q := checker.lastQuery()
		if q.CustomerID != "acme" || q.Queue != "chk" || q.RequestID != "denied" || q.ActiveRoots != 0 || q.RecentRoots != 0 {
			t.Fatalf("checker query %+v", q)
		}
		// A retry answers the stored rejection without asking again.
		checker.mode.Store("allow")
		again := admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "chk", RequestID: "denied"}, "over budget")
		if again.ID != task.ID || checker.calls.Load() != 1 {
			t.Fatalf("retry: task %s (want %s), checker calls %d (want 1)", again.ID, task.ID, checker.calls.Load())
		}
	})

	t.Run("Allow", func(t *testing.T) {
		checker.mode.Store("allow")
		before := checker.calls.Load()
		root = admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "chk"})
		if checker.calls.Load() != before+1 {
			t.Fatalf("checker called %d times, want 1", checker.calls.Load()-before)
		}
		if q := checker.lastQuery(); q.ActiveRoots != 0 || q.RecentRoots != 0 {
			t.Fatalf("checker query %+v: the denied task counted as usage", q)
		}
		admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "chk"})
		if q := checker.lastQuery(); q.ActiveRoots != 1 || q.RecentRoots != 1 {
			t.Fatalf("checker query %+v, want 1 active and 1 recent root", q)
		}
	})

	t.Run("ChildrenNotChecked", func(t *testing.T) {
		if root.ID == "" {
			t.Fatal("the previous subtest admitted no root")
		}
		checker.mode.Store("deny")
		before := checker.calls.Load()
		for range 3 {
			admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", ParentID: root.ID})
		}
		if n := checker.calls.Load() - before; n != 0 {
			t.Fatalf("children called the checker %d times", n)
		}
	})

	if got := admMetric(t, b, failures); got != 0 {
		t.Fatalf("%s = %v before any failure", failures, got)
	}
	for i, mode := range []string{"error", "garbage", "slow"} {
		t.Run("FailOpen_"+mode, func(t *testing.T) {
			checker.mode.Store(mode)
			before := checker.calls.Load()
			admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "chk"})
			if checker.calls.Load() != before+1 {
				t.Fatalf("checker called %d times, want 1", checker.calls.Load()-before)
			}
			if got := admMetric(t, b, failures); got != float64(i+1) {
				t.Fatalf("%s = %v, want %d", failures, got, i+1)
			}
		})
	}
}

func TestAdmissionCheckerDown(t *testing.T) {
	t.Parallel()
	gone := httptest.NewServer(http.NotFoundHandler())
	url := gone.URL
	gone.Close()
	b := setup(t, withAdmission(scheduler.Admission{CheckerURL: url, CheckerTimeout: 100 * time.Millisecond}))

	admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme"})
	admAdmitted(t, b, api.ScheduleRequest{CustomerID: "acme"})
	if got := admMetric(t, b, "taskledger_usage_checker_failures_total"); got != 2 {
		t.Fatalf("taskledger_usage_checker_failures_total = %v, want 2", got)
	}
	if got := admMetric(t, b, "taskledger_admission_rejections_total"); got != 0 {
		t.Fatalf("taskledger_admission_rejections_total = %v, want 0", got)
	}
}

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
	scheduled := 0
	for _, typ := range admHistory(t, b, first.ID) {
		if typ == "TaskScheduled" {
			scheduled++
		}
	}
	if scheduled != 1 {
		t.Fatalf("history of the replayed task has %d TaskScheduled events, want 1", scheduled)
	}
	// The quota is full, so a new root is refused by the quota, before
	// the checker is asked.
	admRejected(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "adm", RequestID: "twice"}, "quota")
	if n := checker.calls.Load(); n != 1 {
		t.Fatalf("checker called %d times, want 1 (a full quota answers first)", n)
	}
}

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
	if h := admHistory(t, b, rejectedID); len(h) != 1 || h[0] != "AdmissionRejected" {
		t.Fatalf("history of the rejected task: %v", h)
	}
}
