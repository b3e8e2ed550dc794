package httpapi_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/docs"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
)

// The tests of docs/openapi.yaml: it is a valid OpenAPI document, it
// documents exactly the routes the server registers, and every request
// the other tests of this package make, and its answer, agree with it
// (setup serves the API through validated).

const (
	ndjson      = "application/x-ndjson"
	eventStream = "text/event-stream"
)

func init() {
	// GET /v1/events answers one JSON value per line; validated checks
	// each line on its own against the documented schema.
	openapi3filter.RegisterBodyDecoder(ndjson, openapi3filter.JSONBodyDecoder)
	// The console's assets (GET /ui/...) are text.
	for _, ct := range []string{"text/html", "text/javascript", "text/css"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
}

// spec is the loaded and validated document and its router, made once
// for the package.
var spec = sync.OnceValues(func() (*openapiSpec, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(docs.OpenAPIYAML)
	if err != nil {
		return nil, fmt.Errorf("load docs/openapi.yaml: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("docs/openapi.yaml is not valid OpenAPI: %w", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("route docs/openapi.yaml: %w", err)
	}
	return &openapiSpec{doc: doc, router: router}, nil
})

type openapiSpec struct {
	doc    *openapi3.T
	router routers.Router
}

func mustSpec(t testing.TB) *openapiSpec {
	t.Helper()
	s, err := spec()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	s := mustSpec(t)
	if !s.doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %q, want 3.1", s.doc.OpenAPI)
	}
}

// TestOpenAPIDocumentsEveryRoute compares the server's routes table with
// the document's paths and methods, both ways.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	s := mustSpec(t)
	var documented []string
	for path, item := range s.doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	served := httpapi.RoutePatterns()
	slices.Sort(documented)
	slices.Sort(served)
	for _, p := range served {
		if !slices.Contains(documented, p) {
			t.Errorf("route %s is not in docs/openapi.yaml", p)
		}
	}
	for _, p := range documented {
		if !slices.Contains(served, p) {
			t.Errorf("docs/openapi.yaml documents %s, which the server does not serve", p)
		}
	}
}

// TestOpenAPIServed checks that GET /v1/openapi.json answers the
// document, without a token even when auth is on.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Tokens = map[string]string{"secret": "acme"} })
	a := rawDo(t, b, http.MethodGet, "/v1/openapi.json", "")
	if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/openapi.json: %d %q", a.status, a.header.Get("Content-Type"))
	}
	want, err := docs.OpenAPIJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.body, want) {
		t.Fatalf("served document differs from docs/openapi.yaml")
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(a.body)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("served document: %v", err)
	}
}

// validated serves next and holds every exchange against the document:
// a request the document refuses must be refused (4xx or 5xx), and every
// answer must match the documented answer of its route and status (an
// undocumented status is a mismatch). A mismatch fails t.
func validated(t testing.TB, next http.Handler) http.Handler {
	return mustSpec(t).middleware(next, func(err error) { t.Error(err) })
}

// middleware serves next and reports each exchange that does not agree
// with the document (see validated).
func (s *openapiSpec) middleware(next http.Handler, report func(error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := &recordedBody{ReadCloser: r.Body}
		r.Body = body
		rec := &recordedAnswer{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if err := s.check(r, body, rec); err != nil {
			report(fmt.Errorf("%s %.200s answered %d %.300s: %w", r.Method, r.URL.RequestURI(), rec.status(), rec.body.Bytes(), err))
		}
	})
}

// TestOpenAPIValidationCatchesMismatches proves the middleware the other
// tests run behind: it passes a documented exchange and reports each
// kind of disagreement.
func TestOpenAPIValidationCatchesMismatches(t *testing.T) {
	t.Parallel()
	s := mustSpec(t)
	now := time.Now().UTC()
	task, err := json.Marshal(api.Task{
		ID: "t1", RootID: "t1", CustomerID: "default", Queue: "default", Status: api.StatusScheduled,
		Message:   events.Message{CreatedAt: now, Content: []events.ContentPart{}},
		CreatedAt: now, RunAt: now, TimeoutSeconds: 3600, Attempt: 1, MaxAttempts: 1, Attempts: []api.Attempt{}, Version: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	event, err := json.Marshal(api.Event{Seq: 1, ID: "e1", TaskID: "t1", Type: "TaskScheduled", At: now, Status: api.StatusScheduled, Detail: "scheduled", Data: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	notFound := `{"error":"not_found","message":"not found"}`
	for _, tc := range []struct {
		name, method, target, body string
		status                     int
		header                     map[string]string
		answer                     string
		mismatch                   bool
	}{
		{"Documented", http.MethodPost, "/v1/tasks", `{"queue":"q"}`, http.StatusCreated, nil, string(task), false},
		{"DocumentedError", http.MethodGet, "/v1/tasks/t1", "", http.StatusNotFound, nil, notFound, false},
		{"DocumentedConflict", http.MethodPost, "/v1/tasks/t1/cancel", "", http.StatusConflict, nil, `{"error":"conflict","reason":"terminal","message":"x"}`, false},
		{"ConflictWithoutReason", http.MethodPost, "/v1/tasks/t1/cancel", "", http.StatusConflict, nil, `{"error":"conflict","message":"x"}`, true},
		{"ReasonTheRouteCannotGive", http.MethodPost, "/v1/tasks/t1/cancel", "", http.StatusConflict, nil, `{"error":"conflict","reason":"token_mismatch","message":"x"}`, true},
		{"ReasonWithoutConflict", http.MethodGet, "/v1/tasks/t1", "", http.StatusNotFound, nil, `{"error":"not_found","reason":"terminal","message":"x"}`, true},
		{"TaskWithoutRequiredFields", http.MethodGet, "/v1/tasks/t1", "", http.StatusOK, nil, `{"id":"t1"}`, true},
		{"UndocumentedStatus", http.MethodGet, "/v1/tasks/t1", "", http.StatusTeapot, nil, notFound, true},
		{"ErrorWithoutMessage", http.MethodGet, "/v1/tasks/t1", "", http.StatusNotFound, nil, `{"error":"not_found"}`, true},
		{"UnknownErrorCode", http.MethodGet, "/v1/tasks/t1", "", http.StatusNotFound, nil, `{"error":"gone","message":"x"}`, true},
		{"RefusedRequestAccepted", http.MethodPost, "/v1/tasks", `{"queue":"a.b"}`, http.StatusCreated, nil, string(task), true},
		{"BadPathIDAccepted", http.MethodGet, "/v1/tasks/a.b", "", http.StatusOK, nil, string(task), true},
		{"UnavailableWithoutRetryAfter", http.MethodGet, "/v1/tasks/t1", "", http.StatusServiceUnavailable, nil, `{"error":"unavailable","message":"x"}`, true},
		{"UnknownRouteAccepted", http.MethodGet, "/v1/nothing", "", http.StatusOK, nil, `{}`, true},
		{"UncleanPathServed", http.MethodGet, "/v1/tasks//t1", "", http.StatusOK, nil, string(task), true},
		{"UncleanPathRefused", http.MethodGet, "/v1/tasks//t1", "", http.StatusBadRequest, nil, `{"error":"invalid_argument","message":"x"}`, false},
		{"DocumentedEvents", http.MethodGet, "/v1/events?customerId=c", "", http.StatusOK,
			map[string]string{"Content-Type": ndjson}, string(event) + "\n" + string(event) + "\n", false},
		{"EventLineMismatch", http.MethodGet, "/v1/events?customerId=c", "", http.StatusOK,
			map[string]string{"Content-Type": ndjson}, string(event) + "\n" + `{"seq":1}` + "\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "application/json")
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.answer)
			})
			var reported []error
			h := s.middleware(answer, func(err error) { reported = append(reported, err) })
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body)))
			if tc.mismatch != (len(reported) > 0) {
				t.Fatalf("mismatch %v, reported %v", tc.mismatch, reported)
			}
		})
	}
}

// check holds one exchange against the document.
func (s *openapiSpec) check(r *http.Request, body *recordedBody, rec *recordedAnswer) error {
	ctx := context.Background()
	if p := r.URL.EscapedPath(); cleanPath(p) != p {
		// Refused before any route runs, never redirected.
		if rec.status() != http.StatusBadRequest {
			return fmt.Errorf("path %q is not clean: want 400", p)
		}
		return s.validateSchema("Error", rec.body.Bytes())
	}
	req := conventional(r, body.data.Bytes())
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		return s.checkUnrouted(rec, err)
	}
	in := &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			// What the server did not read to the end (a body past the
			// limit, one refused before it was read) is not judged.
			ExcludeRequestBody: !body.eof,
		},
	}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && rec.status() < 400 {
		return fmt.Errorf("the document refuses the request, the server accepted it: %w", err)
	}
	header, answer, err := rec.decoded()
	if err != nil {
		return err
	}
	validate := func(b []byte, skipBody bool) error {
		out := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: rec.status(), Header: header,
			Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: skipBody},
		}
		out.SetBodyBytes(b)
		return openapi3filter.ValidateResponse(ctx, out)
	}
	if strings.HasPrefix(header.Get("Content-Type"), eventStream) {
		if err := validate(nil, true); err != nil {
			return err
		}
		if strings.HasSuffix(route.Path, "/run/stream") {
			return s.checkRunStream(answer)
		}
		return s.checkEventStream(answer)
	}
	if !strings.HasPrefix(header.Get("Content-Type"), ndjson) {
		return validate(answer, r.Method == http.MethodHead)
	}
	if len(answer) == 0 {
		return validate(nil, true)
	}
	for i, line := range bytes.Split(bytes.TrimSuffix(answer, []byte("\n")), []byte("\n")) {
		if err := validate(line, false); err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
	}
	return nil
}

// sseMessage is one whole message of a Server-Sent Events answer: its
// id, event name and data ("" for a field it lacks).
type sseMessage struct{ id, name, data string }

// sseMessages splits answer into its whole messages; the last part, cut
// off or empty, is left out.
func sseMessages(answer []byte) []sseMessage {
	parts := strings.Split(string(answer), "\n\n")
	out := make([]sseMessage, 0, len(parts)-1)
	for _, msg := range parts[:len(parts)-1] {
		var m sseMessage
		for line := range strings.SplitSeq(msg, "\n") {
			switch k, v, _ := strings.Cut(line, ": "); k {
			case "id":
				m.id = v
			case "event":
				m.name = v
			case "data":
				m.data = v
			}
		}
		out = append(out, m)
	}
	return out
}

// checkEventStream holds each whole message of a Server-Sent Events
// answer against the document: an event's data is an Event whose seq and
// type its id and event name repeat, an overflow's a StreamOverflow.
func (s *openapiSpec) checkEventStream(answer []byte) error {
	for i, m := range sseMessages(answer) {
		id, name, data := m.id, m.name, m.data
		switch {
		case data == "" && name == "" && id == "":
			continue // a comment
		case name == api.StreamOverflowEvent:
			if err := s.validateSchema("StreamOverflow", []byte(data)); err != nil || id != "" {
				return fmt.Errorf("message %d, overflow with id %q: %v", i+1, id, err)
			}
		default:
			var e api.Event
			if err := s.validateSchema("Event", []byte(data)); err != nil {
				return fmt.Errorf("message %d: %w", i+1, err)
			}
			if err := json.Unmarshal([]byte(data), &e); err != nil {
				return fmt.Errorf("message %d: %w", i+1, err)
			}
			// The id is the resume token: the seq, or on a sharded log
			// the cursor.
			token := fmt.Sprint(e.Seq)
			if e.Cursor != "" {
				token = e.Cursor
			}
			if token != id || e.Type != name {
				return fmt.Errorf("message %d: id %q and event %q do not repeat the data's seq (or cursor) and type: %s", i+1, id, name, data)
			}
		}
	}
	return nil
}

// checkRunStream holds each whole message of a run stream against the
// document: saved is a RunChange whose revision its id repeats,
// progress a RunProgress, end a RunEnd, error an Error, overflow a
// StreamOverflow, none of them with an id.
func (s *openapiSpec) checkRunStream(answer []byte) error {
	for i, m := range sseMessages(answer) {
		id, name, data := m.id, m.name, m.data
		schema := map[string]string{
			api.RunSavedEvent: "RunChange", api.RunProgressEvent: "RunProgress", api.RunEndEvent: "RunEnd",
			"error": "Error", api.StreamOverflowEvent: "StreamOverflow",
		}[name]
		switch {
		case data == "" && name == "" && id == "":
			continue // a comment
		case schema == "":
			return fmt.Errorf("message %d: undocumented event %q", i+1, name)
		}
		if err := s.validateSchema(schema, []byte(data)); err != nil {
			return fmt.Errorf("message %d: %w", i+1, err)
		}
		var c api.RunChange
		if name == api.RunSavedEvent && (json.Unmarshal([]byte(data), &c) != nil || fmt.Sprint(c.Revision) != id) ||
			name != api.RunSavedEvent && id != "" {
			return fmt.Errorf("message %d: id %q does not repeat the revision: %s", i+1, id, data)
		}
	}
	return nil
}

// conventional returns a copy of r with body, as the conventions of the
// document's description have it (JSON Schema cannot say them): the body
// is JSON whatever the Content-Type; a body of only white space is empty;
// a null or an empty string is the zero value (a null field as if left out, a null body or
// array item as {}); an empty query parameter is as if left out. A HEAD
// request is served by the GET route. A path parameter is read
// percent-decoded, as the server reads it (/v1/tasks/%2d is task "-"),
// unless decoding makes a new path segment.
func conventional(r *http.Request, body []byte) *http.Request {
	req := r.Clone(context.Background())
	if req.URL.RawPath != "" && strings.Count(req.URL.Path, "/") == strings.Count(req.URL.RawPath, "/") {
		req.URL.RawPath = ""
	}
	body = bytes.TrimSpace(body)
	if len(body) > 0 {
		req.Header.Set("Content-Type", "application/json")
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) == nil && !dec.More() {
			if v == nil {
				v = map[string]any{}
			}
			if b, err := json.Marshal(withoutNulls(v)); err == nil {
				body = b
			}
		}
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	q := req.URL.Query()
	for k, vs := range q {
		if len(vs) == 1 && vs[0] == "" {
			q.Del(k)
		}
	}
	req.URL.RawQuery = q.Encode()
	if req.Method == http.MethodHead {
		req.Method = http.MethodGet
	}
	return req
}

// withoutNulls drops the null and empty-string members of objects and
// reads null array items as {}, at every depth.
func withoutNulls(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, m := range v {
			if m == nil || m == "" {
				delete(v, k)
				continue
			}
			v[k] = withoutNulls(m)
		}
	case []any:
		for i, m := range v {
			if m == nil {
				m = map[string]any{}
			}
			v[i] = withoutNulls(m)
		}
	}
	return v
}

// checkUnrouted holds the answer to a request of no documented route and
// method: a 4xx with the error body.
func (s *openapiSpec) checkUnrouted(rec *recordedAnswer, routeErr error) error {
	if rec.status() < 400 || rec.status() >= 500 {
		return fmt.Errorf("not a documented route (%v), but answered %d", routeErr, rec.status())
	}
	return s.validateSchema("Error", rec.body.Bytes())
}

// validateSchema checks JSON text against the component schema name.
func (s *openapiSpec) validateSchema(name string, text []byte) error {
	var v any
	if err := json.Unmarshal(text, &v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.doc.Components.Schemas[name].Value.VisitJSON(v, openapi3.EnableJSONSchema2020())
}

// requireSchema fails t unless text is JSON of the document's component
// schema name (for JSON inside a field, as a child's report).
func requireSchema(t *testing.T, name string, text []byte) {
	t.Helper()
	if err := mustSpec(t).validateSchema(name, text); err != nil {
		t.Fatalf("%s %s: %v", name, text, err)
	}
}

// cleanPath is a path as http.ServeMux cleans it.
func cleanPath(p string) string {
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// recordedBody keeps what the handler read of a request body.
type recordedBody struct {
	io.ReadCloser
	data bytes.Buffer
	eof  bool
}

func (b *recordedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.data.Write(p[:n])
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// recordedAnswer passes an answer through and keeps a copy of it.
type recordedAnswer struct {
	http.ResponseWriter
	code   int
	header http.Header // as sent with the status line
	body   bytes.Buffer
}

func (a *recordedAnswer) WriteHeader(code int) {
	if a.code == 0 {
		a.code, a.header = code, a.Header().Clone()
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *recordedAnswer) Write(p []byte) (int, error) {
	if a.code == 0 {
		a.WriteHeader(http.StatusOK)
	}
	a.body.Write(p)
	return a.ResponseWriter.Write(p)
}

// Unwrap gives http.ResponseController the server's writer.
func (a *recordedAnswer) Unwrap() http.ResponseWriter { return a.ResponseWriter }

func (a *recordedAnswer) status() int {
	if a.code == 0 {
		return http.StatusOK
	}
	return a.code
}

// decoded returns the answer's header and its body without a
// Content-Encoding (/metrics gzips for clients that accept it).
func (a *recordedAnswer) decoded() (http.Header, []byte, error) {
	header := a.header
	if header == nil {
		header = a.Header().Clone()
	}
	if header.Get("Content-Encoding") != "gzip" {
		return header, a.body.Bytes(), nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(a.body.Bytes()))
	if err != nil {
		return nil, nil, err
	}
	plain, err := io.ReadAll(zr)
	return header, plain, err
}
