package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
)

// Fuzz targets for the decoding of HTTP requests: each sends the fuzzed
// bytes through the API handler of a real node (one per target, started
// once) with an httptest.ResponseRecorder, and asserts the contract of
// The contract: no panic, and either a 2xx with a JSON body or a 4xx with the
// JSON error body. A 503 "unavailable" is allowed too (a write that met a
// concurrent one of the alarm's); a 500 never is.

// fuzzNode is a node whose handler is called without a network.
type fuzzNode struct {
	*node.Node
}

// startFuzzNode starts a node on a fresh namespace, stopped when tb ends.
func startFuzzNode(tb testing.TB) *fuzzNode {
	tb.Helper()
	n := testnode.Start(tb, func(c *node.Config) {
		c.Logger = zerolog.New(zerolog.NewTestWriter(tb)).Level(zerolog.ErrorLevel)
	})
	return &fuzzNode{Node: n.Node}
}

// queued schedules a task on queue as the operator and waits until its
// ready notification is out.
func (n *fuzzNode) queued(tb testing.TB, queue string) aggregate.State {
	tb.Helper()
	ctx := context.Background()
	st, _, err := n.Service.Schedule(ctx, scheduler.Operator, scheduler.ScheduleRequest{Queue: queue})
	if err != nil {
		tb.Fatal(err)
	}
	testnode.Eventually(tb, "task "+st.TaskID+" queued", func() bool {
		if st, err = n.Service.Get(ctx, scheduler.Operator, st.TaskID); err != nil {
			tb.Fatal(err)
		}
		return st.Status == aggregate.StatusQueued
	})
	return st
}

// running schedules a task and claims it as executor "w1".
func (n *fuzzNode) running(tb testing.TB, queue string) aggregate.State {
	tb.Helper()
	q := n.queued(tb, queue)
	st, err := n.Service.Claim(context.Background(), scheduler.Operator, q.TaskID, q.Delivery.ID, "w1")
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// serve sends one request as a client would put it on the wire; ok is
// false when net/http would have refused the request line or headers
// before any handler ran (a target with a space, a control byte...). The
// exchange is held against docs/openapi.yaml (validated), failing t.
func (n *fuzzNode) serve(t *testing.T, method, target string, body []byte) (rec *httptest.ResponseRecorder, ok bool) {
	raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", method, target, len(body))
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw + string(body))))
	if err != nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec = httptest.NewRecorder()
	validated(t, n.Handler).ServeHTTP(rec, req.WithContext(ctx))
	return rec, true
}

// checkAnswer asserts the contract of every answer.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder, method, target string) {
	t.Helper()
	status, body := rec.Code, rec.Body.Bytes()
	where := fmt.Sprintf("%s %.200q", method, target)
	switch {
	case status == http.StatusInternalServerError:
		t.Fatalf("%s: 500 (a panic or an unmapped error): %s", where, body)
	case status == http.StatusNoContent:
		if len(body) != 0 {
			t.Fatalf("%s: 204 with a body %q", where, body)
		}
		return
	case status >= 200 && status < 300:
		if !json.Valid(body) || !utf8.Valid(body) {
			t.Fatalf("%s: %d with a body that is not JSON: %.300q", where, status, body)
		}
		return
	case status >= 400 && status < 500, status == http.StatusServiceUnavailable:
	default:
		t.Fatalf("%s: status %d: %.300q", where, status, body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: %d with content type %q: %.300q", where, status, ct, body)
	}
	var e struct {
		Error   *string `json:"error"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || *e.Error == "" || e.Message == nil || *e.Message == "" {
		t.Fatalf("%s: %d error body %.300q (%v), want error and message", where, status, body, err)
	}
	if status == http.StatusServiceUnavailable && *e.Error != "unavailable" {
		t.Fatalf("%s: 503 with error %q", where, *e.Error)
	}
	if !utf8.Valid(body) {
		t.Fatalf("%s: error body is not valid UTF-8: %q", where, body)
	}
}

// maliciousBodies seed every body target: malformed JSON, wrong shapes,
// wildcards, sizes, invalid UTF-8, deep nesting and absurd numbers.
var maliciousBodies = []string{
	"", " ", "null", "[]", `"x"`, "0", "{", "}", "{}}", "{}]", "{} {}", "{} x", "queue=a",
	`{"queue":"a.>"}`, `{"queue":"*"}`, `{"queue":"a b"}`, `{"queue":"a\u0000"}`, `{"customerId":"*"}`,
	`{"parentId":"tl.evt.>"}`, `{"requestId":"` + strings.Repeat("r", 65) + `"}`,
	`{"timeoutSeconds":1e30}`, `{"timeoutSeconds":9223372036854775808}`, `{"timeoutSeconds":-1}`, `{"timeoutSeconds":"60"}`,
	`{"delaySeconds":1e300}`, `{"delaySeconds":-1}`, `{"delaySeconds":1e400}`,
	`{"runAt":"10000-01-01T00:00:00Z"}`, `{"runAt":"9999-12-31T23:59:59Z"}`, `{"runAt":"0001-01-01T00:00:00Z"}`, `{"runAt":1}`,
	`{"waitSeconds":-5}`, `{"waitSeconds":1e400}`, `{"success":"yes"}`,
	`{"message":{"content":[{"type":"text","text":"a\ud800b"}]}}`,
	"{\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"\xff\xfe\"}]}}",
	"{\"reason\":\"\xc0\xaf\"}",
	strings.Repeat("[", 20000), strings.Repeat(`{"a":`, 20000),
	`{"message":{"content":` + strings.Repeat("[", 20000) + `}}`,
	`{"effects":[` + strings.TrimSuffix(strings.Repeat(`{"kind":"c"},`, 40), ",") + `]}`,
	`{"QUEUE":"x","Queue":"y.z"}`, `{"queue":"a","queue":"b.c"}`,
}

func addBodySeeds(f *testing.F, valid ...string) {
	for _, s := range append(valid, maliciousBodies...) {
		f.Add([]byte(s))
	}
}

func FuzzScheduleBody(f *testing.F) {
	n := startFuzzNode(f)
	parent := n.queued(f, "fz-parent")
	addBodySeeds(f,
		`{}`, `{"queue":"fz"}`,
		`{"queue":"fz","requestId":"req-1","repo":"example/storefront","signal":{"id":"s1","uri":"https://example.com/x","eventType":"push"},`+
			`"message":{"id":"m1","content":[{"type":"text","text":"do it"}]},"timeoutSeconds":60}`,
		// CI found it: a repeat of req-1 with a timeout the document
		// refuses was answered 200 with the task.
		`{"queue":"fz","requestId":"req-1","timeoutSeconds":0}`, `{"queue":" 0","requestId":"req-1"}`,
		`{"queue":"fz","delaySeconds":0.5}`, `{"queue":"fz","runAt":"2020-01-01T00:00:00Z"}`,
		`{"queue":"fz","parentId":"`+parent.TaskID+`"}`, `{"parentId":"no-such-task"}`,
		`{"queue":"fz","runAt":"2030-01-01T00:00:00Z","delaySeconds":5}`,
	)
	f.Fuzz(n.postBody("/v1/tasks"))
}

func FuzzClaimBody(f *testing.F) {
	n := startFuzzNode(f)
	q := n.queued(f, "fz-claim")
	target := "/v1/tasks/" + q.TaskID + "/claim"
	addBodySeeds(f,
		`{"deliveryId":"`+q.Delivery.ID+`","executorId":"w1"}`,
		`{"deliveryId":"d-nope","executorId":"w1"}`, `{"deliveryId":"`+q.Delivery.ID+`"}`, `{"executorId":"w1"}`,
		`{"deliveryId":"`+q.Delivery.ID+`","executorId":"w.1"}`, `{"deliveryId":1,"executorId":true}`,
	)
	f.Fuzz(n.postBody(target))
}

func FuzzResultBody(f *testing.F) {
	n := startFuzzNode(f)
	r := n.running(f, "fz-result")
	target := "/v1/tasks/" + r.TaskID + "/result"
	addBodySeeds(f,
		`{"deliveryId":"d-nope","success":true}`,
		`{"deliveryId":"`+r.Claim.DeliveryID+`","success":false,"error":"boom","summary":"tried",`+
			`"effects":[{"kind":"pull_request","ref":"42","url":"https://example.com/pr/42"}]}`,
		`{"success":true,"summary":"`+strings.Repeat("s", 16<<10+1)+`"}`,
		`{"success":true,"effects":[{"ref":"1"}]}`, `{"success":true,"effects":null}`,
	)
	f.Fuzz(n.postBody(target))
}

func FuzzEffectsBody(f *testing.F) {
	n := startFuzzNode(f)
	r := n.running(f, "fz-effects")
	target := "/v1/tasks/" + r.TaskID + "/effects"
	addBodySeeds(f,
		`{"deliveryId":"`+r.Claim.DeliveryID+`","effects":[{"kind":"pull_request","ref":"42","uncertain":true}]}`,
		`{"deliveryId":"`+r.Claim.DeliveryID+`","effects":[{"kind":"comment","at":"2020-01-01T00:00:00Z"}]}`,
		`{"deliveryId":"d-nope","effects":[{"kind":"comment"}]}`, `{"deliveryId":"`+r.Claim.DeliveryID+`","effects":[]}`,
		`{"deliveryId":"`+r.Claim.DeliveryID+`","effects":null}`, `{"deliveryId":"`+r.Claim.DeliveryID+`","effects":[{"ref":"1"}]}`,
		`{"deliveryId":"`+r.Claim.DeliveryID+`","effects":[{"kind":"c","at":"yesterday"}]}`, `{"effects":[{"kind":"comment"}]}`,
	)
	f.Fuzz(n.postBody(target))
}

func FuzzMailboxBody(f *testing.F) {
	n := startFuzzNode(f)
	q := n.queued(f, "fz-mail")
	target := "/v1/tasks/" + q.TaskID + "/mailbox"
	addBodySeeds(f,
		`{"message":{"id":"m1","content":[{"type":"text","text":"hello"}]}}`,
		`{"message":{"content":[]}}`, `{"message":{"id":"m.1","content":[]}}`, `{"message":null}`,
		`{"message":{"id":"m2","createdAt":"2020-01-01T00:00:00Z","content":[{"type":"image"}]}}`,
		`{"message":{"id":"big","content":[{"type":"text","text":"`+strings.Repeat("x", 64<<10)+`"}]}}`,
	)
	f.Fuzz(n.postBody(target))
}

func FuzzListQuery(f *testing.F) {
	n := startFuzzNode(f)
	q := n.queued(f, "fz-list")
	for _, s := range []string{
		"", "status=queued", "queue=fz-list", "customerId=default", "rootId=" + q.TaskID, "limit=1", "limit=1&after=" + q.TaskID,
		"status=bogus", "status=RUNNING", "status=", "limit=0", "limit=-1", "limit=1.5", "limit=1e3", "limit=99999999999999999999",
		"limit=9223372036854775807", "after=-1", "after=a.b", "queue=a.>", "customerId=*", "rootId=%3E", "queue=%00",
		"a=%zz", ";;&&==", "queue=a&queue=b.c", "status=queued&status=bogus", "%", "&", "=", "limit=%2B5", "customerId=" + strings.Repeat("c", 65),
		"idPrefix=" + q.TaskID[:4], "idPrefix=" + q.TaskID + "&status=queued", "idPrefix=" + q.TaskID[:2] + "&after=" + q.TaskID, "idPrefix=a.b",
		"idPrefix=%00", "idPrefix=" + strings.Repeat("0", 65),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, query string) {
		target := "/v1/tasks?" + query
		rec, ok := n.serve(t, http.MethodGet, target, nil)
		if !ok {
			return // net/http refuses such a request line itself
		}
		checkAnswer(t, rec, http.MethodGet, target)
	})
}

// taskRoutes are the routes with a task id in the path.
var taskRoutes = []struct{ method, suffix, body string }{
	{http.MethodGet, "", ""}, {http.MethodPost, "/claim", `{"deliveryId":"d1","executorId":"w1"}`},
	{http.MethodPost, "/check", ""}, {http.MethodPost, "/result", `{"success":true}`},
	{http.MethodPost, "/effects", `{"deliveryId":"d1","effects":[{"kind":"comment"}]}`},
	{http.MethodPost, "/cancel", `{}`}, {http.MethodPost, "/mailbox", `{"message":{"id":"m1","content":[]}}`},
	{http.MethodGet, "/mailbox", ""}, {http.MethodGet, "/mailbox?after=0", ""}, {http.MethodGet, "/history", ""},
	{http.MethodGet, "/history?tree=1", ""}, {http.MethodGet, "/tree", ""},
	{http.MethodGet, "/run", ""}, {http.MethodPut, "/run", `{"deliveryId":"d1","run":{}}`},
	{http.MethodPost, "/retry", `{}`},
}

func FuzzTaskPath(f *testing.F) {
	n := startFuzzNode(f)
	q := n.queued(f, "fz-path")
	for i, id := range []string{
		q.TaskID, "no-such-task", "a.b", "a*", "a>", "%2A", "%3E", "tl.evt.%3E", ".", "..", "%2E%2E", "a%2Fb", "a/b", "%00", "a%00b",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "é", "%C3%A9", "%FF", "a%", "a%zz", "?x=1", "#frag", "", "//", "a//b",
		"..%2F..%2Fadmin", "%20", "a+b", "a;b", "a,b",
	} {
		f.Add(id, uint8(i))
	}
	f.Fuzz(func(t *testing.T, id string, route uint8) {
		r := taskRoutes[int(route)%len(taskRoutes)]
		target := "/v1/tasks/" + id + r.suffix
		rec, ok := n.serve(t, r.method, target, []byte(r.body))
		if !ok {
			return // net/http refuses such a request line itself
		}
		if rec.Code >= 300 && rec.Code < 400 {
			// ServeMux redirects a path that is not clean ("..", "//")
			// to its clean form before any route runs.
			req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(r.method + " " + target + " HTTP/1.1\r\nHost: localhost\r\n\r\n")))
			if err != nil {
				t.Fatal(err)
			}
			if p := req.URL.Path; p != "" && path.Clean(p) == p {
				t.Fatalf("%s %q: redirect %d for a clean path", r.method, target, rec.Code)
			}
			if rec.Header().Get("Location") == "" {
				t.Fatalf("%s %q: redirect %d without a Location", r.method, target, rec.Code)
			}
			return
		}
		checkAnswer(t, rec, r.method, target)
	})
}

func FuzzCancelBody(f *testing.F) {
	n := startFuzzNode(f)
	q := n.queued(f, "fz-cancel")
	target := "/v1/tasks/" + q.TaskID + "/cancel"
	addBodySeeds(f, `{}`, `{"reason":"no longer needed"}`, `{"reason":1}`, `{"reason":"`+strings.Repeat("r", 70000)+`"}`)
	f.Fuzz(n.postBody(target))
}

func FuzzRunBody(f *testing.F) {
	n := startFuzzNode(f)
	r := n.running(f, "fz-run")
	target := "/v1/tasks/" + r.TaskID + "/run"
	d := r.Claim.DeliveryID
	addBodySeeds(f,
		`{"deliveryId":"`+d+`","run":{}}`, `{"deliveryId":"`+d+`","revision":0,"run":{"phase":"p","turn":1,"x":[1]}}`,
		`{"deliveryId":"`+d+`","revision":1,"run":{}}`, `{"deliveryId":"`+d+`","revision":-1,"run":{}}`,
		`{"deliveryId":"`+d+`","revision":18446744073709551616,"run":{}}`, `{"deliveryId":"d-nope","run":{}}`,
		`{"deliveryId":"`+d+`","run":null}`, `{"deliveryId":"`+d+`","run":"x"}`, `{"deliveryId":"`+d+`"}`,
		`{"deliveryId":"`+d+`","run":{"phase":null,"transcript":[null,{"content":[null,{"type":null}]}],"effects":{"k":null}}}`,
		`{"deliveryId":"`+d+`","run":{"turn":"1"}}`, `{"deliveryId":"`+d+`","run":{"turn":1e3}}`,
		`{"deliveryId":"`+d+`","run":{"transcript":[{"at":"yesterday"}]}}`, `{"deliveryId":"`+d+`","run":{"contexts":{"c":{"value":`+strings.Repeat("[", 20000)+`}}}}`,
		`{"deliveryId":"`+d+`","run":{"pendingTools":[{"input":{"a":1},"output":"\ud800"}]}}`,
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec, ok := n.serve(t, http.MethodPut, target, body)
		if !ok {
			t.Fatal("a well-formed request line was refused")
		}
		checkAnswer(t, rec, http.MethodPut, target)
	})
}

// postBody is a fuzz function that POSTs the fuzzed body to target and
// checks the answer.
func (n *fuzzNode) postBody(target string) func(*testing.T, []byte) {
	return func(t *testing.T, body []byte) {
		rec, ok := n.serve(t, http.MethodPost, target, body)
		if !ok {
			t.Fatal("a well-formed request line was refused")
		}
		checkAnswer(t, rec, http.MethodPost, target)
	}
}
