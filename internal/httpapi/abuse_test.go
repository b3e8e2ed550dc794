package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// Malicious and malformed requests over real HTTP, beyond the table of
// validation_test.go: each is refused with a 4xx JSON error, appends
// nothing to the log, and leaves the server healthy.
//
// Decisions these tests pin down:
//   - A body that is not valid UTF-8 is a 400 (JSON text is UTF-8,
//     RFC 8259 §8.1); it is never stored with its bytes replaced. An
//     escaped lone surrogate ("\ud800") is valid JSON text: encoding/json
//     turns it into U+FFFD, which is stored and returned as valid JSON.
//   - A request with a body must say it is JSON (Content-Type:
//     application/json, charset utf-8 if any): anything else, or none, is
//     a 415, so an HTML form (which always sends its own type) or a
//     fetch with a text/plain body cannot post. A request with neither a
//     body nor a Content-Type is served (curl -XPOST). And a non-safe
//     cross-origin browser request (Sec-Fetch-Site or an Origin that is
//     not the Host) is a 403: a web page must not be able to drive a
//     server that runs without an auth file.
//   - A NUL byte sent raw in the request line never reaches the API:
//     net/http refuses it with a 400, rewritten to the JSON error shape
//     (listen.go).

// abuseDo sends body (nil for none) with header and returns the answer.
// Content-Type is application/json unless header sets it ("" removes it).
func abuseDo(t *testing.T, b *bundle, method, path string, body []byte, header map[string]string) rawAnswer {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, b.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
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

// requireClientError asserts a 4xx answer whose status is one of statuses
// (any 4xx if none) with the JSON error body.
func requireClientError(t *testing.T, a rawAnswer, statuses ...int) {
	t.Helper()
	ok := a.status >= 400 && a.status < 500 && len(statuses) == 0
	for _, s := range statuses {
		ok = ok || a.status == s
	}
	if !ok {
		t.Fatalf("status %d, want 4xx %v; body %.300s", a.status, statuses, a.body)
	}
	var e struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q, want application/json; body %.300s", ct, a.body)
	}
	if err := json.Unmarshal(a.body, &e); err != nil || e.Error == "" || e.Message == "" {
		t.Fatalf("error body %.300q: %v, want error and message", a.body, err)
	}
	if !utf8.Valid(a.body) {
		t.Fatalf("error body is not valid UTF-8: %q", a.body)
	}
}

// requireHealthy asserts that GET /healthz answers 200.
func requireHealthy(t *testing.T, b *bundle) {
	t.Helper()
	if a := abuseDo(t, b, http.MethodGet, "/healthz", nil, nil); a.status != http.StatusOK {
		t.Fatalf("GET /healthz: %d %s", a.status, a.body)
	}
}

type abuseCase struct {
	name         string
	method, path string
	body         []byte
	header       map[string]string
	statuses     []int // accepted statuses; none: any 4xx
	code         string
}

func TestAbuseRefusedChangeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := queuedTask(t, b, api.ScheduleRequest{Queue: "abuse", Message: text("m0", "objective")})
	r := runningTask(t, b, api.ScheduleRequest{Queue: "abuse"})
	settled(t, b)

	var cases []abuseCase
	add := func(c abuseCase) { cases = append(cases, c) }
	bad := []int{http.StatusBadRequest}
	invalid := func(name, method, path, body string) {
		var raw []byte
		if body != "" || method == http.MethodPost {
			raw = []byte(body)
		}
		add(abuseCase{name: name, method: method, path: path, body: raw, statuses: bad, code: "invalid_argument"})
	}
	tasks, next := "/v1/tasks", "/v1/claims/next"
	qp, rp := "/v1/tasks/"+q.ID, "/v1/tasks/"+r.ID

	// Ids that NATS or a shell would read as more than a name, where the
	// HTTP layer reads them: the path and the queries. (Ids in bodies are
	// the service's to check: internal/scheduler's validation tests.)
	ids := []struct{ name, id string }{
		{"SubjectEscape", "x.evt.>"},
		{"StarToken", "a.*.b"},
		{"LeadingDot", ".a"},
		{"TrailingDot", "a."},
		{"Tab", "a\tb"},
		{"NUL", "a\x00b"},
		{"CRLF", "a\r\nX-Injected: 1"},
		{"Slash", "a/b"},
		{"DotDot", ".."},
		{"PathTraversal", "../../v1/admin"},
		{"Unicode", "é"},
		{"FullwidthDot", "a．b"},
		{"Percent", "a%2Eb"},
	}
	for _, id := range ids {
		p := "/v1/tasks/" + url.PathEscape(id.id)
		if id.id == ".." {
			// A ".." segment is a path to clean: net/http redirects it
			// to the clean path before any route sees it.
			p = ""
		}
		for _, route := range []struct{ method, suffix string }{
			{http.MethodGet, ""}, {http.MethodPost, "/claim"}, {http.MethodPost, "/check"},
			{http.MethodPost, "/result"}, {http.MethodPost, "/effects"}, {http.MethodPost, "/cancel"}, {http.MethodPost, "/mailbox"},
			{http.MethodPost, "/retry"}, {http.MethodGet, "/mailbox"}, {http.MethodGet, "/history"}, {http.MethodGet, "/history?tree=1"}, {http.MethodGet, "/tree"},
		} {
			if p == "" {
				break
			}
			body := ""
			if route.method == http.MethodPost {
				body = `{}`
			}
			invalid("Path"+id.name+route.method+strings.NewReplacer("/", "", "?", "", "=", "").Replace(route.suffix), route.method, p+route.suffix, body)
		}
		for _, param := range []string{"queue", "customerId", "rootId", "after"} {
			invalid("List"+param+id.name, http.MethodGet, tasks+"?"+param+"="+url.QueryEscape(id.id), "")
		}
		invalid("EventsCustomerID"+id.name, http.MethodGet, "/v1/events?customerId="+url.QueryEscape(id.id), "")
	}
	for _, id := range []string{"*", ">", "a.b", "", "tl.evt.>"} {
		invalid("EventsCustomerID"+jsonString(id), http.MethodGet, "/v1/events?customerId="+url.QueryEscape(id), "")
	}
	invalid("EventsSinceMalformed", http.MethodGet, "/v1/events?since=yesterday", "")

	// Sizes: well past the limit, and one byte past it.
	tooLarge := func(name, path string, body []byte) {
		add(abuseCase{name: name, method: http.MethodPost, path: path, body: body, statuses: []int{http.StatusRequestEntityTooLarge}, code: "payload_too_large"})
	}
	twoMiB := []byte(`{"message":{"content":[{"type":"text","text":"` + strings.Repeat("x", 2<<20) + `"}]}}`)
	for _, path := range []string{tasks, qp + "/claim", rp + "/result", qp + "/cancel", qp + "/mailbox", next} {
		tooLarge("TwoMiB"+strings.NewReplacer(q.ID, "", r.ID, "", "/", "").Replace(path), path, twoMiB)
	}
	tooLarge("OneByteOverLimit", tasks, padded(`{"queue":"abuse"}`, api.MaxBodyBytes+1))
	tooLarge("OneByteOverLimitAllWhitespace", tasks, bytes.Repeat([]byte(" "), api.MaxBodyBytes+1))

	// Deep nesting: encoding/json stops at depth 10,000.
	deep := 100000
	invalid("DeepArrays", http.MethodPost, tasks, strings.Repeat("[", deep))
	invalid("DeepArraysClosed", http.MethodPost, tasks, strings.Repeat("[", deep)+strings.Repeat("]", deep))
	invalid("DeepObjects", http.MethodPost, tasks, strings.Repeat(`{"a":`, deep))
	invalid("DeepInMessage", http.MethodPost, tasks, `{"message":{"content":`+strings.Repeat("[", deep)+`}}`)
	invalid("DeepInMailbox", http.MethodPost, qp+"/mailbox", `{"message":{"content":[`+strings.Repeat(`{"t":`, deep)+`}`)
	invalid("DeepInEffects", http.MethodPost, rp+"/result", `{"success":true,"effects":`+strings.Repeat("[", deep)+`}`)
	invalid("DeepInClaimNext", http.MethodPost, next, strings.Repeat(`{"queue":`, deep))

	// Invalid UTF-8 anywhere in a body.
	for _, seq := range []struct{ name, bytes string }{
		{"Byte", "\xff\xfe"}, {"Overlong", "\xc0\xaf"}, {"Surrogate", "\xed\xa0\x80"}, {"Truncated", "\xe2\x82"},
	} {
		s := "bad" + seq.bytes + "text"
		invalid("UTF8ScheduleText"+seq.name, http.MethodPost, tasks, `{"message":{"content":[{"type":"text","text":"`+s+`"}]}}`)
		invalid("UTF8Repo"+seq.name, http.MethodPost, tasks, `{"repo":"`+s+`"}`)
		invalid("UTF8Signal"+seq.name, http.MethodPost, tasks, `{"signal":{"uri":"`+s+`"}}`)
		invalid("UTF8Key"+seq.name, http.MethodPost, tasks, `{"`+s+`":1}`)
		invalid("UTF8MailboxText"+seq.name, http.MethodPost, qp+"/mailbox", `{"message":{"id":"u1","content":[{"type":"text","text":"`+s+`"}]}}`)
		invalid("UTF8Summary"+seq.name, http.MethodPost, rp+"/result", `{"success":true,"summary":"`+s+`"}`)
		invalid("UTF8CancelReason"+seq.name, http.MethodPost, qp+"/cancel", `{"reason":"`+s+`"}`)
	}

	// Numbers out of range or of the wrong kind.
	for _, n := range []string{"1e30", "9223372036854775808", "-9223372036854775809", "1.5", "1e3", "604801.0", "null1"} {
		invalid("Timeout"+n, http.MethodPost, tasks, `{"timeoutSeconds":`+n+`}`)
	}
	// (A delay that decodes is the service's to bound.)
	for _, n := range []string{"1e400", "\"5\""} {
		invalid("Delay"+n, http.MethodPost, tasks, `{"delaySeconds":`+n+`}`)
	}
	for _, n := range []string{"-5", "-1e300", "1e400", "\"1\"", "true"} {
		invalid("Wait"+n, http.MethodPost, next, `{"queue":"abuse","executorId":"w1","waitSeconds":`+n+`}`)
	}
	for _, n := range []string{"99999999999999999999", "-99999999999999999999", "1e3", "0x10", "%205", "5%00"} {
		invalid("Limit"+n, http.MethodGet, tasks+"?limit="+n, "")
	}
	for _, n := range []string{"99999999999999999999", "1e3", "0x1"} {
		invalid("MailboxAfter"+n, http.MethodGet, qp+"/mailbox?after="+n, "")
	}
	invalid("SuccessNotBool", http.MethodPost, rp+"/result", `{"success":"yes"}`)
	invalid("ContentNotArray", http.MethodPost, tasks, `{"message":{"content":"text"}}`)
	invalid("RunAtNumber", http.MethodPost, tasks, `{"runAt":1700000000}`)
	invalid("RunAtYear10000", http.MethodPost, tasks, `{"runAt":"10000-01-01T00:00:00Z"}`)

	// Content types: a body that is not declared JSON is a 415, however
	// JSON it looks; and a browser on another origin is refused whatever
	// it sends.
	multipart := "--XyZ\r\nContent-Disposition: form-data; name=\"queue\"\r\n\r\nabuse\r\n--XyZ--\r\n"
	unsupported := []int{http.StatusUnsupportedMediaType}
	add(abuseCase{name: "MultipartBody", method: http.MethodPost, path: tasks, body: []byte(multipart),
		header: map[string]string{"Content-Type": "multipart/form-data; boundary=XyZ"}, statuses: unsupported, code: "unsupported_media_type"})
	add(abuseCase{name: "FormBody", method: http.MethodPost, path: tasks, body: []byte("queue=abuse&repo=x"),
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, statuses: unsupported, code: "unsupported_media_type"})
	for name, ct := range map[string]string{
		"TextPlainJSON": "text/plain;charset=UTF-8", "NoContentType": "", "Latin1JSON": "application/json; charset=iso-8859-1",
		"JSONWithParameter": "application/json; boundary=x", "MalformedType": "application/json; charset", "JSONSuffix": "application/jsonx",
		"ProblemJSON": "application/problem+json",
	} {
		add(abuseCase{name: "ContentType" + name, method: http.MethodPost, path: tasks, body: []byte(`{"queue":"abuse"}`),
			header: map[string]string{"Content-Type": ct}, statuses: unsupported, code: "unsupported_media_type"})
	}
	add(abuseCase{name: "ContentTypeFormWithoutBody", method: http.MethodPost, path: qp + "/cancel",
		header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, statuses: unsupported, code: "unsupported_media_type"})
	jsonish := []byte(`{"queue":"abuse","message":{"content":[{"type":"text","text":"from evil.example"}]}}`)
	forbidden := []int{http.StatusForbidden}
	for _, route := range []struct{ name, path string }{
		{"Schedule", tasks}, {"Cancel", qp + "/cancel"}, {"ClaimNext", next}, {"Mailbox", qp + "/mailbox"}, {"Rebuild", "/v1/admin/projections/rebuild"},
	} {
		for _, h := range []struct {
			name   string
			header map[string]string
		}{
			{"TextPlainOrigin", map[string]string{"Content-Type": "text/plain", "Origin": "http://evil.example"}},
			{"MultipartSecFetchSite", map[string]string{"Content-Type": "multipart/form-data; boundary=XyZ", "Sec-Fetch-Site": "cross-site"}},
			{"FormSameSite", map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "same-site"}},
			{"NoTypeNullOrigin", map[string]string{"Content-Type": "", "Origin": "null"}},
		} {
			add(abuseCase{name: "CrossOrigin" + route.name + h.name, method: http.MethodPost, path: route.path, body: jsonish,
				header: h.header, statuses: forbidden, code: "forbidden"})
		}
	}

	// Methods the routes do not have.
	noRoute := []int{http.StatusNotFound, http.StatusMethodNotAllowed}
	for _, m := range []struct{ method, path string }{
		{http.MethodDelete, "/v1/tasks/x"}, {http.MethodDelete, qp}, {http.MethodPut, tasks}, {http.MethodPatch, qp},
		{http.MethodGet, next}, {http.MethodGet, qp + "/check"}, {http.MethodGet, qp + "/cancel"}, {http.MethodGet, qp + "/claim"},
		{http.MethodPost, qp}, {http.MethodPost, qp + "/tree"}, {http.MethodPost, qp + "/history"}, {http.MethodPut, qp + "/mailbox"},
		{http.MethodOptions, tasks}, {http.MethodTrace, tasks}, {http.MethodGet, "/v1/admin/projections/rebuild"},
		{http.MethodPost, "/healthz"}, {http.MethodDelete, "/v1/events"}, {"PROPFIND", tasks},
	} {
		add(abuseCase{name: "Method" + m.method + strings.NewReplacer(q.ID, "ID", "/", "_").Replace(m.path), method: m.method, path: m.path,
			body: []byte(`{}`), statuses: noRoute})
	}

	// NUL bytes, escaped in the path and the query, and raw in JSON.
	invalid("NULPathOnly", http.MethodGet, "/v1/tasks/%00", "")
	invalid("NULPathTail", http.MethodPost, "/v1/tasks/"+q.ID+"%00/cancel", `{}`)
	invalid("NULQuery", http.MethodGet, tasks+"?queue=abuse%00", "")
	invalid("NULStatus", http.MethodGet, tasks+"?status=queued%00", "")
	invalid("NULRawInBody", http.MethodPost, tasks, "{\"queue\":\"abuse\x00\"}")

	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.name] {
			t.Fatalf("duplicate case name %s", c.name)
		}
		seen[c.name] = true
	}
	// Sequential on purpose: the log must not grow while a case runs.
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := lastSeq(t, b)
			a := abuseDo(t, b, c.method, c.path, c.body, c.header)
			requireClientError(t, a, c.statuses...)
			if c.code != "" {
				requireErrorBody(t, a, a.status, c.code)
			}
			if after := lastSeq(t, b); after != before {
				t.Fatalf("%s %s appended to the log: last sequence %d, want %d", c.method, c.path, after, before)
			}
			requireHealthy(t, b)
		})
	}

	t.Run("RawNULInRequestLine", func(t *testing.T) {
		before := lastSeq(t, b)
		for _, line := range []string{"GET /v1/tasks/a\x00b HTTP/1.1", "POST /v1/tasks\x00 HTTP/1.1", "GET /v1/tasks?queue=a\x00 HTTP/1.1"} {
			requireErrorBody(t, rawRequestLine(t, b, line), http.StatusBadRequest, "invalid_argument")
		}
		if after := lastSeq(t, b); after != before {
			t.Fatalf("raw NUL requests appended to the log: %d, want %d", after, before)
		}
		requireHealthy(t, b)
	})

	ctx := context.Background()
	for _, want := range []api.Task{q, r} {
		got, err := b.client.Get(ctx, want.ID)
		if err != nil || got.Status != want.Status || got.Version != want.Version {
			t.Fatalf("task %s after the abuse: %v %+v, want status %s version %d", want.ID, err, got, want.Status, want.Version)
		}
	}
	if l, err := b.client.List(ctx, api.ListOptions{}); err != nil || len(l.Tasks) != 2 {
		t.Fatalf("list after the abuse: %v %d tasks, want 2", err, len(l.Tasks))
	}
	// And it still works.
	requireHealthy(t, b)
	task := queuedTask(t, b, api.ScheduleRequest{Queue: "abuse-after", Message: text("m", "still fine")})
	if _, err := b.client.Claim(ctx, task.ID, task.Delivery.ID, "w1"); err != nil {
		t.Fatalf("claim after the abuse: %v", err)
	}
}

// padded returns body followed by spaces up to exactly n bytes.
func padded(body string, n int) []byte {
	return append([]byte(body), bytes.Repeat([]byte(" "), n-len(body))...)
}

// rawRequestLine sends one request with requestLine as is over a new
// connection and returns the answer.
func rawRequestLine(t *testing.T, b *bundle, requestLine string) rawAnswer {
	t.Helper()
	return rawExchange(t, b, []byte(requestLine+"\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
}

// TestAbuseAcceptedEdgeCases pins the odd inputs that are accepted, and
// what becomes of them.
func TestAbuseAcceptedEdgeCases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("BodyOfExactlyTheLimit", func(t *testing.T) {
		body := padded(`{"queue":"edge","requestId":"exact-limit"}`, api.MaxBodyBytes)
		a := abuseDo(t, b, http.MethodPost, "/v1/tasks", body, nil)
		if a.status != http.StatusCreated {
			t.Fatalf("a body of exactly %d bytes: %d %.300s, want 201", api.MaxBodyBytes, a.status, a.body)
		}
	})

	t.Run("EscapedLoneSurrogateBecomesReplacementCharacter", func(t *testing.T) {
		a := abuseDo(t, b, http.MethodPost, "/v1/tasks", []byte(`{"queue":"edge","message":{"content":[{"type":"text","text":"a\ud800b"}]}}`), nil)
		if a.status != http.StatusCreated {
			t.Fatalf("escaped lone surrogate: %d %s", a.status, a.body)
		}
		var task api.Task
		if err := json.Unmarshal(a.body, &task); err != nil {
			t.Fatal(err)
		}
		got, err := b.client.Get(ctx, task.ID)
		if err != nil {
			t.Fatal(err)
		}
		if text := got.Message.Content[0].Text; text != "a\uFFFDb" {
			t.Fatalf("stored text %q, want %q", text, "a\uFFFDb")
		}
		raw := abuseDo(t, b, http.MethodGet, "/v1/tasks/"+task.ID, nil, nil)
		if !utf8.Valid(raw.body) || !json.Valid(raw.body) {
			t.Fatalf("task answer is not valid UTF-8 JSON: %q", raw.body)
		}
	})

	t.Run("EscapedNULInTextRoundTrips", func(t *testing.T) {
		task := mustSchedule(t, b, api.ScheduleRequest{Queue: "edge", Message: text("nul", "a\x00b")})
		got, err := b.client.Get(ctx, task.ID)
		if err != nil || got.Message.Content[0].Text != "a\x00b" {
			t.Fatalf("text with NUL: %v %q", err, got.Message.Content)
		}
	})

	t.Run("JSONContentTypes", func(t *testing.T) {
		// JSON in any spelling net/http's mime parser takes, with a
		// charset of utf-8 or none.
		for i, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON;Charset=UTF-8", "application/json ; charset=\"utf-8\""} {
			body := fmt.Sprintf(`{"queue":"edge","requestId":"ct-%d"}`, i)
			a := abuseDo(t, b, http.MethodPost, "/v1/tasks", []byte(body), map[string]string{"Content-Type": ct})
			if a.status != http.StatusCreated {
				t.Fatalf("content type %q: %d %s, want 201", ct, a.status, a.body)
			}
		}
		// A request without a body needs no Content-Type.
		task := mustSchedule(t, b, api.ScheduleRequest{Queue: "edge"})
		if a := abuseDo(t, b, http.MethodPost, "/v1/tasks/"+task.ID+"/cancel", nil, map[string]string{"Content-Type": ""}); a.status != http.StatusOK {
			t.Fatalf("a body-less cancel without Content-Type: %d %s, want 200", a.status, a.body)
		}
		// A browser on the server's own origin is not refused.
		for i, h := range []map[string]string{
			{"Sec-Fetch-Site": "same-origin"},
			{"Origin": b.url},
			{"Sec-Fetch-Site": "none"},
		} {
			body := fmt.Sprintf(`{"queue":"edge","requestId":"same-origin-%d"}`, i)
			if a := abuseDo(t, b, http.MethodPost, "/v1/tasks", []byte(body), h); a.status != http.StatusCreated {
				t.Fatalf("same-origin request %v: %d %s, want 201", h, a.status, a.body)
			}
		}
		// Cross-origin reads are safe methods: allowed (browsers keep the
		// answer from the page: no CORS headers are sent).
		a := abuseDo(t, b, http.MethodGet, "/v1/tasks", nil, map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
		if a.status != http.StatusOK || a.header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("cross-origin GET: %d %v", a.status, a.header)
		}
	})

	t.Run("ListAfterIsAnOpaqueCursor", func(t *testing.T) {
		for _, after := range []string{"-1", "0", "zzzz", strings.Repeat("z", 64)} {
			a := abuseDo(t, b, http.MethodGet, "/v1/tasks?after="+after, nil, nil)
			var l api.TaskList
			if a.status != http.StatusOK || json.Unmarshal(a.body, &l) != nil {
				t.Fatalf("after=%s: %d %s", after, a.status, a.body)
			}
		}
	})

	t.Run("HugeWaitIsCappedNotRefused", func(t *testing.T) {
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "edge-wait"})
		a := abuseDo(t, b, http.MethodPost, "/v1/claims/next", []byte(`{"queue":"edge-wait","executorId":"w1","waitSeconds":1e9}`), nil)
		var task api.Task
		if a.status != http.StatusOK || json.Unmarshal(a.body, &task) != nil || task.ID != q.ID {
			t.Fatalf("claims/next with waitSeconds 1e9: %d %s", a.status, a.body)
		}
	})

	t.Run("HugeLimitIsCapped", func(t *testing.T) {
		if a := abuseDo(t, b, http.MethodGet, "/v1/tasks?limit=9223372036854775807", nil, nil); a.status != http.StatusOK {
			t.Fatalf("limit=MaxInt64: %d %s", a.status, a.body)
		}
	})
}

// TestAbuseInFlightLimit fills the in-flight slots with schedules that
// wait on a slow usage checker, and checks that the rest are refused at
// once with a 503, Retry-After and a JSON body; that health checks and
// long polls are not counted; and that afterwards everything works and
// nothing accepted was lost. (A slow body holds no slot: route reads the
// body before it takes one; see edge_test.go.)
func TestAbuseInFlightLimit(t *testing.T) {
	t.Parallel()
	// The checker holds the schedules of "held-" request ids until
	// released, and admits every other one at once.
	started := make(chan struct{}, 2)
	releaseCh := make(chan struct{})
	checker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q scheduler.UsageQuery
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if strings.HasPrefix(q.RequestID, "held-") {
			started <- struct{}{}
			<-releaseCh
		}
		io.WriteString(w, `{"allow": true}`)
	}))
	t.Cleanup(checker.Close)
	released := false
	release := func() {
		if !released {
			released = true
			close(releaseCh)
		}
	}
	t.Cleanup(release) // before checker.Close, which waits for its handlers
	b := setup(t, func(c *node.Config) {
		c.MaxInFlight = 2
		c.Admission = scheduler.Admission{CheckerURL: checker.URL, CheckerTimeout: time.Minute}
	})
	ctx := context.Background()
	task := queuedTask(t, b, api.ScheduleRequest{Queue: "slots"})

	const holders = 2
	held := make(chan error, holders)
	for i := range holders {
		go func() {
			_, _, err := b.client.Schedule(ctx, api.ScheduleRequest{Queue: "slots", RequestID: fmt.Sprintf("held-%d", i)})
			held <- err
		}()
	}
	for range holders {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the held schedules never reached the usage checker")
		}
	}

	before := lastSeq(t, b)
	t.Run("BurstIsRefused", func(t *testing.T) {
		answers := make(chan rawAnswer, 20)
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				path := "/v1/tasks/" + task.ID + "/history"
				method, body := http.MethodGet, ""
				if i%2 == 1 {
					method, body = http.MethodPost, fmt.Sprintf(`{"queue":"slots","requestId":"burst-%d"}`, i)
					path = "/v1/tasks"
				}
				req, _ := http.NewRequestWithContext(ctx, method, b.url+path, strings.NewReader(body))
				if body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				resp, err := b.client.HTTP.Do(req)
				if err != nil {
					answers <- rawAnswer{status: -1, body: []byte(err.Error())}
					return
				}
				defer resp.Body.Close()
				data, _ := io.ReadAll(resp.Body)
				answers <- rawAnswer{status: resp.StatusCode, header: resp.Header, body: data}
			})
		}
		wg.Wait()
		close(answers)
		for a := range answers {
			requireErrorBody(t, a, http.StatusServiceUnavailable, "unavailable")
			if a.header.Get("Retry-After") == "" {
				t.Fatalf("503 without Retry-After: %v", a.header)
			}
		}
		if after := lastSeq(t, b); after != before {
			t.Fatalf("refused requests appended to the log: %d, want %d", after, before)
		}
	})

	t.Run("HealthAndLongPollsAreNotCounted", func(t *testing.T) {
		requireHealthy(t, b)
		a := abuseDo(t, b, http.MethodPost, "/v1/claims/next", []byte(`{"queue":"slots-empty","executorId":"w1","waitSeconds":0}`), nil)
		if a.status != http.StatusNoContent {
			t.Fatalf("claims/next while the slots are full: %d %s, want 204", a.status, a.body)
		}
	})

	// Let the held requests finish: both are accepted and kept.
	release()
	for range holders {
		if err := <-held; err != nil {
			t.Fatalf("a held schedule: %v", err)
		}
	}

	t.Run("ConcurrentBurstLosesNothing", func(t *testing.T) {
		// No holders now: some of a burst may still find the slots busy.
		// Each answer is a 201 or a 503; a 503 left no task behind, and
		// a retry is accepted.
		const n = 20
		accepted := make(chan string, n)
		refused := make(chan string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				requestID := fmt.Sprintf("burst2-%d", i)
				got, _, err := b.client.Schedule(ctx, api.ScheduleRequest{Queue: "slots", RequestID: requestID})
				var apiErr *api.Error
				switch {
				case err == nil:
					accepted <- got.ID
				case errors.As(err, &apiErr) && apiErr.Status == http.StatusServiceUnavailable && apiErr.Code == "unavailable":
					refused <- requestID
				default:
					t.Errorf("schedule %s: %v", requestID, err)
				}
			})
		}
		wg.Wait()
		close(accepted)
		close(refused)
		ids := map[string]bool{}
		for id := range accepted {
			ids[id] = true
		}
		for requestID := range refused {
			var got api.Task
			eventually(t, "retry of "+requestID, func() bool {
				var err error
				var created bool
				got, created, err = b.client.Schedule(ctx, api.ScheduleRequest{Queue: "slots", RequestID: requestID})
				if err == nil && !created {
					t.Fatalf("a refused schedule %s had left task %s behind", requestID, got.ID)
				}
				return err == nil
			})
			ids[got.ID] = true
		}
		if len(ids) != n {
			t.Fatalf("%d distinct tasks for %d schedules", len(ids), n)
		}
		for id := range ids {
			if _, err := b.client.Get(ctx, id); err != nil {
				t.Fatalf("accepted task %s: %v", id, err)
			}
		}
	})

	// Everything accepted is there: the fixture, the two slow schedules
	// and the burst; the refused first burst left nothing.
	l, err := b.client.List(ctx, api.ListOptions{Queue: "slots", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Tasks) != 1+holders+20 {
		t.Fatalf("%d tasks on the queue, want %d", len(l.Tasks), 1+holders+20)
	}
	for _, t2 := range l.Tasks {
		if strings.HasPrefix(t2.RequestID, "burst-") {
			t.Fatalf("a refused request left task %+v", t2)
		}
	}
	requireHealthy(t, b)
	if _, err := b.client.Claim(ctx, task.ID, task.Delivery.ID, "w1"); err != nil {
		t.Fatalf("claim after the burst: %v", err)
	}
}
