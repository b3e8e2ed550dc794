package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
)

// Tenant isolation and bearer-token auth a customer token
// sees and touches only that customer's tasks, everything else answers
// 404 as if the task did not exist; no valid token is a 401 on every /v1
// route.

// tenantTokens are the auth file of the tests in this file.
var tenantTokens = map[string]string{"tok-a": "A", "tok-b": "B", "tok-op": "*"}

// authSetup starts a node that requires tenantTokens.
func authSetup(t *testing.T) *bundle {
	t.Helper()
	return setup(t, func(c *node.Config) { c.Tokens = tenantTokens })
}

// tokenClient is an API client of b that sends token.
func tokenClient(t *testing.T, b *bundle, token string) *api.Client {
	t.Helper()
	c := api.NewClient(b.url, token)
	t.Cleanup(c.HTTP.CloseIdleConnections)
	return c
}

// authDo sends body (as is, "" for none) with the Authorization header
// set to authorization ("" for none) and returns the answer unparsed.
func authDo(t *testing.T, b *bundle, authorization, method, path, body string) rawAnswer {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, b.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := b.client.HTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading answer: %v", method, path, err)
	}
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: data}
}

// tenantWait polls a task through c until it has status.
func tenantWait(t *testing.T, c *api.Client, id, status string) api.Task {
	t.Helper()
	var task api.Task
	eventually(t, "task "+id+" "+status, func() bool {
		var err error
		if task, err = c.Get(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		return task.Status == status
	})
	return task
}

// tenantQueued schedules req through c and waits until it is queued.
func tenantQueued(t *testing.T, c *api.Client, req api.ScheduleRequest) api.Task {
	t.Helper()
	task, created, err := c.Schedule(context.Background(), req)
	if err != nil || !created {
		t.Fatalf("schedule %+v: created=%v %v", req, created, err)
	}
	return tenantWait(t, c, task.ID, "queued")
}

// taskMark is what must not move when another customer pokes a task.
type taskMark struct {
	status  string
	version int
	count   int // mailbox messages
	cursor  int
}

func markOf(task api.Task) taskMark {
	return taskMark{task.Status, task.Version, task.Mailbox.Count, task.Mailbox.Cursor}
}

// TestAuthTenantIsolation checks the HTTP side of tenancy on a few
// representative routes: another customer's task answers the 404 JSON
// body without leaking it, lists and the event stream hold only the
// caller's own, and the rebuild route does not exist for a customer.
// (That every service call treats another customer's task as missing is
// internal/scheduler's TestTenancy.)
func TestAuthTenantIsolation(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	ca, cb, op := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b"), tokenClient(t, b, "tok-op")

	// Customer A's queued task with two unread mailbox messages.
	task := tenantQueued(t, ca, api.ScheduleRequest{Queue: "qa", RequestID: "a-root", Message: text("objective", "secret of A")})
	for _, m := range []string{"m1", "m2"} {
		if _, err := ca.AppendMail(ctx, task.ID, text(m, "private note "+m)); err != nil {
			t.Fatal(err)
		}
	}
	if task.CustomerID != "A" {
		t.Fatalf("A's task has customer %q", task.CustomerID)
	}
	// B's own task, so that B's lists are not trivially empty.
	own := tenantQueued(t, cb, api.ScheduleRequest{Queue: "qb"})
	if own.CustomerID != "B" {
		t.Fatalf("B's task has customer %q", own.CustomerID)
	}
	settled(t, b)
	stored, err := op.Get(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	mark := markOf(stored)
	if mark.count != 2 || mark.cursor != 0 {
		t.Fatalf("A's task: %+v, want 2 unread messages", mark)
	}
	before := lastSeq(t, b)
	bearerB := "Bearer tok-b"

	// Sequential on purpose: the log must not grow while B pokes.
	path := "/v1/tasks/" + task.ID
	for _, r := range []struct{ name, method, path, body string }{
		{"Get", http.MethodGet, path, ""},
		{"Claim", http.MethodPost, path + "/claim", `{"deliveryId":"` + task.Delivery.ID + `","executorId":"wb"}`},
		{"Cancel", http.MethodPost, path + "/cancel", `{"reason":"B was here"}`},
		{"Retry", http.MethodPost, path + "/retry", `{"requestId":"b-retry"}`},
		{"Effects", http.MethodPost, path + "/effects", `{"deliveryId":"` + task.Delivery.ID + `","effects":[{"kind":"comment"}]}`},
		{"MailboxGet", http.MethodGet, path + "/mailbox", ""},
		{"ScheduleChild", http.MethodPost, "/v1/tasks", `{"parentId":"` + task.ID + `","queue":"qb"}`},
	} {
		t.Run(r.name, func(t *testing.T) {
			a := authDo(t, b, bearerB, r.method, r.path, r.body)
			requireErrorBody(t, a, http.StatusNotFound, "not_found")
			requireNoLeak(t, a, task.ID, task.Delivery.ID, "secret of A", "private note")
		})
	}

	t.Run("List", func(t *testing.T) {
		for _, query := range []string{"customerId=A", "rootId=" + task.ID, "queue=qa"} {
			a := authDo(t, b, bearerB, http.MethodGet, "/v1/tasks?"+query, "")
			var l api.TaskList
			if a.status != http.StatusOK || json.Unmarshal(a.body, &l) != nil {
				t.Fatalf("B lists %s: %d %s", query, a.status, a.body)
			}
			if len(l.Tasks) != 0 || l.Next != "" {
				t.Fatalf("B lists %s: %d tasks (next %q), want none", query, len(l.Tasks), l.Next)
			}
		}
		for _, query := range []string{"", "customerId=B"} {
			l, err := cb.List(ctx, parseListQuery(t, query))
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Tasks) != 1 || l.Tasks[0].ID != own.ID {
				t.Fatalf("B lists %q: %v, want only its own task %s", query, taskIDs(l.Tasks), own.ID)
			}
		}
	})

	t.Run("CustomerEvents", func(t *testing.T) {
		a := authDo(t, b, bearerB, http.MethodGet, "/v1/events?customerId=A", "")
		requireErrorBody(t, a, http.StatusNotFound, "not_found")
		// Without a customerId B gets its own events, never A's.
		var n int
		err := cb.CustomerEvents(ctx, "B", time.Time{}, func(e api.Event) error {
			if e.TaskID != own.ID {
				t.Errorf("B's event stream holds task %s", e.TaskID)
			}
			n++
			return nil
		})
		if err != nil || n == 0 {
			t.Fatalf("B's own events: %v, %d events", err, n)
		}
		a = authDo(t, b, bearerB, http.MethodGet, "/v1/events", "")
		if a.status != http.StatusOK || bytes.Contains(a.body, []byte(task.ID)) {
			t.Fatalf("B's default event stream: %d %s", a.status, a.body)
		}
	})

	t.Run("Rebuild", func(t *testing.T) {
		for _, token := range []string{"tok-a", "tok-b"} {
			a := authDo(t, b, "Bearer "+token, http.MethodPost, "/v1/admin/projections/rebuild", "")
			requireErrorBody(t, a, http.StatusNotFound, "not_found")
		}
	})

	if after := lastSeq(t, b); after != before {
		t.Fatalf("B's requests appended to the log: last sequence %d, want %d", after, before)
	}
	got, err := op.Get(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if markOf(got) != mark {
		t.Fatalf("A's task after B's requests: %+v, want %+v", markOf(got), mark)
	}
}

// parseListQuery turns a raw list query into client options.
func parseListQuery(t *testing.T, query string) api.ListOptions {
	t.Helper()
	q, err := url.ParseQuery(query)
	if err != nil {
		t.Fatal(err)
	}
	return api.ListOptions{Status: q.Get("status"), Queue: q.Get("queue"), CustomerID: q.Get("customerId"), RootID: q.Get("rootId"), After: q.Get("after")}
}

// requireNoLeak fails if an answer mentions any of secrets, except a task
// id echoed in the error message of a 404 (the caller named it).
func requireNoLeak(t *testing.T, a rawAnswer, id string, secrets ...string) {
	t.Helper()
	body := a.body
	if a.status == http.StatusNotFound {
		body = bytes.ReplaceAll(body, []byte(id), nil)
	}
	for _, s := range secrets {
		if s != "" && bytes.Contains(body, []byte(s)) {
			t.Fatalf("answer %d leaks %q: %s", a.status, s, a.body)
		}
	}
}

// TestAuthSharedQueue checks that customers sharing a queue name claim
// only their own tasks through claims/next, and that another customer's
// unclaimed task does not block theirs.
func TestAuthSharedQueue(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	ca, cb := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b")
	// A's tasks are ahead of B's in the queue, and no executor of A's
	// runs.
	var mine []string
	for range 3 {
		mine = append(mine, tenantQueued(t, ca, api.ScheduleRequest{Queue: "shared"}).ID)
	}
	second := tenantQueued(t, cb, api.ScheduleRequest{Queue: "shared"})

	start := time.Now()
	got, ok, err := cb.ClaimNext(ctx, "shared", "wb", 5*time.Second)
	if err != nil || !ok || got.ID != second.ID {
		t.Fatalf("B claims/next behind A's queued tasks: ok=%v %v task %q after %v, want its own %s", ok, err, got.ID, time.Since(start), second.ID)
	}
	if _, ok, err := cb.ClaimNext(ctx, "shared", "wb", time.Second); err != nil || ok {
		t.Fatalf("B claims/next with only A's tasks left: ok=%v %v, want 204", ok, err)
	}
	// B's poll waited: it did not take A's notifications again and again
	// for its whole second (it used to, some 20,000 times).
	if n := readyDeliveries(t, b, "shared"); n > 200 {
		t.Fatalf("the queue's notifications were delivered %d times during B's poll", n)
	}
	claimed := map[string]bool{}
	for range mine {
		got, ok, err = ca.ClaimNext(ctx, "shared", "wa", 5*time.Second)
		if err != nil || !ok || got.CustomerID != "A" {
			t.Fatalf("A claims/next its tasks: ok=%v %v %+v", ok, err, got)
		}
		claimed[got.ID] = true
	}
	for _, id := range mine {
		if !claimed[id] {
			t.Fatalf("A claimed %v, not its task %s", claimed, id)
		}
	}
}

// readyDeliveries returns how many notifications the ready consumer of
// queue has delivered, counting redeliveries.
func readyDeliveries(t *testing.T, b *bundle, queue string) uint64 {
	t.Helper()
	ctx := context.Background()
	js := b.node.Store.JetStream()
	prefix := strings.NewReplacer("/", "_", "-", "_").Replace(t.Name()) + "_"
	var names []string
	lister := js.StreamNames(ctx)
	for name := range lister.Name() { // read to the end: the lister stops then
		names = append(names, name)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, "_READY") {
			continue
		}
		c, err := js.Consumer(ctx, name, "ready_"+queue)
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Delivered.Consumer
	}
	t.Fatalf("no ready stream of %s", t.Name())
	return 0
}

// TestAuthRequired checks that every /v1 route answers 401 with a JSON
// body without a known bearer token, that every malformed Authorization
// header is refused alike, and that health checks need none.
func TestAuthRequired(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ca := tokenClient(t, b, "tok-a")
	task := tenantQueued(t, ca, api.ScheduleRequest{Queue: "auth"})
	settled(t, b)
	before := lastSeq(t, b)

	tp := "/v1/tasks/" + task.ID
	routes := []struct{ method, path, body string }{
		{http.MethodPost, "/v1/tasks", `{"queue":"auth"}`},
		{http.MethodGet, "/v1/tasks", ""},
		{http.MethodGet, "/v1/tasks?customerId=A", ""},
		{http.MethodGet, tp, ""},
		{http.MethodPost, tp + "/claim", `{"deliveryId":"` + task.Delivery.ID + `","executorId":"w1"}`},
		{http.MethodPost, "/v1/claims/next", `{"queue":"auth","executorId":"w1","waitSeconds":0}`},
		{http.MethodPost, tp + "/check", ""},
		{http.MethodPost, tp + "/result", `{"success":true}`},
		{http.MethodPost, tp + "/cancel", `{}`},
		{http.MethodPost, tp + "/retry", `{}`},
		{http.MethodPost, tp + "/mailbox", `{"message":{"content":[]}}`},
		{http.MethodGet, tp + "/mailbox", ""},
		{http.MethodGet, tp + "/history", ""},
		{http.MethodGet, tp + "/history?tree=1", ""},
		{http.MethodGet, tp + "/tree", ""},
		{http.MethodGet, "/v1/events?customerId=A", ""},
		{http.MethodPost, "/v1/admin/projections/rebuild", ""},
		// Malformed input behind a missing token is still a 401 first.
		{http.MethodGet, "/v1/tasks/bad.id", ""},
		{http.MethodPost, "/v1/tasks", `{"queue":`},
	}
	for _, h := range []struct{ name, value string }{{"None", ""}, {"UnknownToken", "Bearer tok-x"}} {
		for _, r := range routes {
			t.Run(h.name+r.method+strings.NewReplacer(task.ID, "ID", "/", "_", "?", "_").Replace(r.path), func(t *testing.T) {
				a := authDo(t, b, h.value, r.method, r.path, r.body)
				requireErrorBody(t, a, http.StatusUnauthorized, "unauthenticated")
			})
		}
	}
	// Every route resolves the header alike: the malformed ones on a
	// read and on a write.
	headers := []struct{ name, value string }{
		{"EmptyBearer", "Bearer"},
		{"EmptyBearerSpace", "Bearer  "},
		{"TokenWithoutScheme", "tok-a"},
		{"BasicScheme", "Basic dG9rLWE6"},
		{"LowercaseScheme", "bearer tok-a"},
		{"DoubleSpace", "Bearer  tok-a"},
		{"TrailingWord", "Bearer tok-a extra"},
		{"PrefixOfToken", "Bearer tok-"},
		{"OperatorStar", "Bearer *"},
		{"CustomerIDAsToken", "Bearer A"},
		{"TwoTokens", "Bearer tok-a, Bearer tok-op"},
	}
	for _, h := range headers {
		for _, r := range []struct{ method, path, body string }{routes[0], routes[3]} {
			t.Run(h.name+r.method+strings.NewReplacer(task.ID, "ID", "/", "_", "?", "_").Replace(r.path), func(t *testing.T) {
				a := authDo(t, b, h.value, r.method, r.path, r.body)
				requireErrorBody(t, a, http.StatusUnauthorized, "unauthenticated")
			})
		}
	}
	if after := lastSeq(t, b); after != before {
		t.Fatalf("unauthenticated requests appended to the log: last sequence %d, want %d", after, before)
	}
	if got, err := ca.Get(context.Background(), task.ID); err != nil || markOf(got) != markOf(task) {
		t.Fatalf("task after unauthenticated requests: %v %+v, want %+v", err, got, task)
	}

	t.Run("HealthWithoutToken", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz"} {
			if a := authDo(t, b, "", http.MethodGet, path, ""); a.status != http.StatusOK {
				t.Fatalf("GET %s without a token: %d %s", path, a.status, a.body)
			}
		}
		if a := authDo(t, b, "Bearer tok-x", http.MethodGet, "/healthz", ""); a.status != http.StatusOK {
			t.Fatalf("GET /healthz with an unknown token: %d %s", a.status, a.body)
		}
	})
}

// TestAuthOperator checks that a "*" token acts as the operator: it sees
// every customer's tasks and may rebuild. (What the operator may do in the
// service is internal/scheduler's TestTenancy/OperatorSeesAll.)
func TestAuthOperator(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	ca, cb, op := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b"), tokenClient(t, b, "tok-op")
	ta := tenantQueued(t, ca, api.ScheduleRequest{Queue: "op"})
	tb := tenantQueued(t, cb, api.ScheduleRequest{Queue: "op"})

	t.Run("SeesEveryCustomer", func(t *testing.T) {
		l, err := op.List(ctx, api.ListOptions{})
		if err != nil || strings.Join(taskIDs(l.Tasks), ",") != strings.Join(sorted(ta.ID, tb.ID), ",") {
			t.Fatalf("operator list: %v %v", err, taskIDs(l.Tasks))
		}
	})

	t.Run("RebuildIsOperatorOnly", func(t *testing.T) {
		a := authDo(t, b, "Bearer tok-op", http.MethodPost, "/v1/admin/projections/rebuild", "")
		if a.status != http.StatusOK {
			t.Fatalf("operator rebuild: %d %s", a.status, a.body)
		}
	})
}
