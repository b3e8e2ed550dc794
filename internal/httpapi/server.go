// Package httpapi serves the HTTP API (docs/API.md) over a
// scheduler.Service, and calls the same service in process (Local) with the
// same answers.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/docs"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/replay"
)

// Readiness reports whether the projections have caught up, and rebuilds
// them on an operator's request.
type Readiness interface {
	CaughtUp() bool
	Applied() uint64
	Digest() string
	Rebuild(ctx context.Context, progress func(seq, last uint64)) error
}

// ServerConfig configures the HTTP handler.
type ServerConfig struct {
	Service *scheduler.Service
	Ready   Readiness
	// Tokens maps bearer tokens to customer ids ("*" for an operator).
	// Nil means no auth: every request acts as an operator.
	Tokens   map[string]string
	Gatherer prometheus.Gatherer
	Logger   zerolog.Logger
	// MaxInFlight bounds the requests served at once (long polls of
	// claims/next aside); past it a request is answered 503 with
	// Retry-After at once instead of queueing. Default 1024; -1: no limit.
	MaxInFlight int
}

// NewHandler returns the API's http.Handler. It is safe for concurrent
// use. cfg.Service and cfg.Ready are required.
func NewHandler(cfg ServerConfig) (http.Handler, error) {
	if cfg.Service == nil {
		return nil, errors.New("httpapi: ServerConfig.Service is required")
	}
	if cfg.Ready == nil {
		return nil, errors.New("httpapi: ServerConfig.Ready is required")
	}
	openapi, err := docs.OpenAPIJSON()
	if err != nil {
		return nil, err
	}
	h := &handler{ServerConfig: cfg, openapi: openapi}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 1024
	}
	if cfg.MaxInFlight > 0 {
		h.slots = make(chan struct{}, cfg.MaxInFlight)
	}
	mux := http.NewServeMux()
	for _, rt := range routes {
		if serve := rt.serve(h); serve != nil {
			mux.Handle(rt.pattern, serve)
		}
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, noRoute(r))
	})
	// A browser on another site may POST here without a preflight (a
	// form, or fetch with a text/plain body): without an auth file the
	// server trusts every request, so such a page could schedule or
	// cancel tasks. Refuse non-safe cross-origin browser requests.
	csrf := http.NewCrossOriginProtection()
	csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.ErrForbidden)
	}))
	return recoverer(cfg.Logger, csrf.Handler(mux)), nil
}

type handler struct {
	ServerConfig
	slots   chan struct{} // in-flight requests; nil: no limit
	openapi []byte        // docs/openapi.yaml as JSON
}

// route is one route of the API: its http.ServeMux pattern and the
// handler that serves it (nil: not served by this configuration).
type route struct {
	pattern string
	serve   func(*handler) http.Handler
}

// routes is every route the API serves, the one list NewHandler registers
// and the tests hold docs/openapi.yaml against.
var routes = []route{
	{"POST /v1/tasks", limited((*handler).schedule)},
	{"GET /v1/tasks", limited((*handler).list)},
	{"GET /v1/tasks/{id}", limited((*handler).get)},
	{"POST /v1/tasks/{id}/claim", limited((*handler).claim)},
	{"POST /v1/claims/next", unlimited((*handler).claimNext)},
	{"POST /v1/tasks/batch", limited((*handler).scheduleBatch)},
	{"POST /v1/claims", unlimited((*handler).claimBatch)},
	{"POST /v1/results", limited((*handler).recordResults)},
	{"POST /v1/tasks/{id}/check", limited((*handler).check)},
	{"POST /v1/tasks/{id}/result", limited((*handler).result)},
	{"POST /v1/tasks/{id}/cancel", limited((*handler).cancel)},
	{"POST /v1/tasks/{id}/mailbox", limited((*handler).appendMail)},
	{"GET /v1/tasks/{id}/mailbox", limited((*handler).mailbox)},
	{"GET /v1/tasks/{id}/history", limited((*handler).history)},
	{"GET /v1/tasks/{id}/tree", limited((*handler).tree)},
	{"GET /v1/events", limited((*handler).customerEvents)},
	{"POST /v1/admin/projections/rebuild", limited((*handler).rebuild)},
	{"GET /v1/openapi.json", public((*handler).openAPI)},
	{"GET /healthz", public((*handler).healthz)},
	{"GET /readyz", public((*handler).readyz)},
	{"GET /metrics", metrics},
}

// metrics serves the Gatherer's metrics, when there is one.
func metrics(h *handler) http.Handler {
	if h.Gatherer == nil {
		return nil
	}
	return promhttp.HandlerFor(h.Gatherer, promhttp.HandlerOpts{})
}

// principalFunc is a handler method of a route that needs a principal.
type principalFunc func(*handler, http.ResponseWriter, *http.Request, scheduler.Principal)

// limited serves f behind auth, holding an in-flight slot.
func limited(f principalFunc) func(*handler) http.Handler {
	return func(h *handler) http.Handler {
		return h.auth(func(w http.ResponseWriter, r *http.Request, p scheduler.Principal) { f(h, w, r, p) })
	}
}

// unlimited serves f behind auth without an in-flight slot (long polls).
func unlimited(f principalFunc) func(*handler) http.Handler {
	return func(h *handler) http.Handler {
		return h.authUnlimited(func(w http.ResponseWriter, r *http.Request, p scheduler.Principal) { f(h, w, r, p) })
	}
}

// public serves f to anyone, without a token or a slot.
func public(f func(*handler, http.ResponseWriter, *http.Request)) func(*handler) http.Handler {
	return func(h *handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(h, w, r) })
	}
}

// auth resolves the bearer token to a principal (see authUnlimited) and
// holds one of the in-flight slots while next runs.
func (h *handler) auth(next func(http.ResponseWriter, *http.Request, scheduler.Principal)) http.HandlerFunc {
	limited := h.authUnlimited(next)
	if h.slots == nil {
		return limited
	}
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case h.slots <- struct{}{}:
			defer func() { <-h.slots }()
			limited(w, r)
		default:
			writeError(w, api.ErrUnavailable.WithMessage("too many requests in flight; retry later"))
		}
	}
}

// authUnlimited resolves the bearer token to a principal: 401 without a
// known token when tokens are configured, the operator when they are not.
func (h *handler) authUnlimited(next func(http.ResponseWriter, *http.Request, scheduler.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.Tokens == nil {
			next(w, r, scheduler.Operator)
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		customer, known := h.Tokens[token]
		if !ok || token == "" || !known {
			writeError(w, api.ErrUnauthenticated)
			return
		}
		next(w, r, scheduler.Principal{CustomerID: customer})
	}
}

// recoverer turns a panic in a handler into a 500 with a JSON body.
func recoverer(log zerolog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v)
				}
				log.Error().Interface("panic", v).Str("path", r.URL.Path).Msg("handler panicked")
				writeError(w, api.ErrInternal)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// openAPI answers docs/openapi.yaml as JSON.
func (h *handler) openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(h.openapi)
}

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	body := map[string]any{"applied": h.Ready.Applied(), "caughtUp": h.Ready.CaughtUp()}
	if r.URL.Query().Get("digest") == "1" {
		body["digest"] = h.Ready.Digest()
	}
	if !h.Ready.CaughtUp() {
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// decode reads a JSON body of at most api.MaxBodyBytes into v. An empty
// body leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeLimited(w, r, v, api.MaxBodyBytes)
}

// decodeLimited is decode for a body of at most limit bytes.
func decodeLimited(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return api.ErrPayloadTooLarge.WithMessage(fmt.Sprintf("body is larger than %d bytes", limit))
		}
		return invalidArg("reading body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	// JSON text is UTF-8 (RFC 8259 §8.1); encoding/json would silently
	// replace invalid bytes with U+FFFD and store text the client never
	// sent.
	if !utf8.Valid(body) {
		return invalidArg("malformed JSON body: not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return invalidArg("malformed JSON body: %v", err)
	}
	// dec.More would miss a stray '}' or ']': only the end may follow.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalidArg("malformed JSON body: data after the object")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, e *api.Error) {
	if e.Status == http.StatusServiceUnavailable || e.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.Status, e)
}

// fail answers err as its wire error, logging server-side failures.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := wireError(err)
	if e.Status >= 500 {
		h.Logger.Error().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("request failed")
	}
	writeError(w, e)
}

// pathID returns the {id} path value, or a 400 for a malformed id.
func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if err := events.ValidID(id); err != nil {
		return "", invalidArg("task id: %v", err)
	}
	return id, nil
}

func (h *handler) schedule(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	var b api.ScheduleRequest
	if err := decode(w, r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	st, created, err := h.Service.Schedule(r.Context(), p, scheduleRequest(b))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, NewTask(st))
}

func (h *handler) get(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, err := h.Service.Get(r.Context(), p, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NewTask(st))
}

func (h *handler) list(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	q := r.URL.Query()
	f := projections.Filter{Status: aggregate.Status(q.Get("status")), Queue: q.Get("queue"), CustomerID: q.Get("customerId"), RootID: q.Get("rootId")}
	switch f.Status {
	case "", aggregate.StatusScheduled, aggregate.StatusQueued, aggregate.StatusRunning, aggregate.StatusSucceeded,
		aggregate.StatusFailed, aggregate.StatusCanceled, aggregate.StatusTimedOut:
	default:
		h.fail(w, r, invalidArg("unknown status %q", f.Status))
		return
	}
	for name, v := range map[string]string{"queue": f.Queue, "customerId": f.CustomerID, "rootId": f.RootID, "after": q.Get("after")} {
		if v == "" {
			continue
		}
		if err := events.ValidID(v); err != nil {
			h.fail(w, r, invalidArg("%s: %v", name, err))
			return
		}
	}
	limit := api.DefaultListLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			h.fail(w, r, invalidArg("limit must be a whole number from 1 to %d", api.MaxListLimit))
			return
		}
		limit = min(n, api.MaxListLimit)
	}
	states, next, err := h.Service.List(r.Context(), p, f, q.Get("after"), limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := api.TaskList{Tasks: make([]api.Task, len(states)), Next: next}
	for i, st := range states {
		out.Tasks[i] = NewTask(st)
	}
	writeJSON(w, http.StatusOK, out)
}

// taskAction decodes body into v and runs do on the path's task,
// answering the task it returns.
func (h *handler) taskAction(w http.ResponseWriter, r *http.Request, v any, do func(id string) (aggregate.State, error)) {
	id, err := pathID(r)
	if err == nil {
		err = decode(w, r, v)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, err := do(id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NewTask(st))
}

func (h *handler) claim(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	var b api.ClaimRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.Claim(r.Context(), p, id, b.DeliveryID, b.ExecutorID)
	})
}

func (h *handler) result(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	var b api.ResultRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.RecordResult(r.Context(), p, id, b.DeliveryID, result(b))
	})
}

func (h *handler) cancel(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	var b api.CancelRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.Cancel(r.Context(), p, id, b.Reason)
	})
}

func (h *handler) claimNext(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	var b api.ClaimNextRequest
	if err := decode(w, r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	queue, wait, err := pollArgs(b.Queue, b.WaitSeconds)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, ok, err := h.Service.ClaimNext(r.Context(), p, queue, b.ExecutorID, wait)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !ok {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusOK, NewTask(st))
}

func (h *handler) check(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := h.Service.Check(r.Context(), p, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Check{ShouldStop: res.ShouldStop, Reason: res.Reason, Messages: newMailItems(res.Messages), Cursor: res.Cursor})
}

func (h *handler) appendMail(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	id, err := pathID(r)
	var b api.MailRequest
	if err == nil {
		err = decode(w, r, &b)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	msgID, index, err := h.Service.AppendMail(r.Context(), p, id, b.Message)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, api.MailAccepted{MessageID: msgID, Index: index})
}

func (h *handler) mailbox(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	after := 0
	if s := r.URL.Query().Get("after"); s != "" {
		if after, err = strconv.Atoi(s); err != nil || after < 0 {
			h.fail(w, r, invalidArg("after must be a whole number ≥ 0"))
			return
		}
	}
	items, cursor, err := h.Service.Mailbox(r.Context(), p, id, after)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Mail{Messages: newMailItems(items), Cursor: cursor})
}

func (h *handler) history(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	history := h.Service.History
	if tree := r.URL.Query().Get("tree"); tree == "1" || tree == "true" {
		history = h.Service.LineageHistory
	}
	evs, err := history(r.Context(), p, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.History{Events: NewEvents(evs)})
}

func (h *handler) tree(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	n, err := h.Service.Tree(r.Context(), p, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newTree(n))
}

// customerEvents streams a customer's events since a time as NDJSON, one
// history entry per line (GET /v1/events?customerId=C&since=RFC3339).
func (h *handler) customerEvents(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	q := r.URL.Query()
	customerID := q.Get("customerId")
	if customerID == "" && !p.IsOperator() {
		customerID = p.CustomerID
	}
	if err := events.ValidID(customerID); err != nil {
		h.fail(w, r, invalidArg("customerId: %v", err))
		return
	}
	var since time.Time
	if s := q.Get("since"); s != "" {
		var err error
		if since, err = time.Parse(time.RFC3339Nano, s); err != nil {
			h.fail(w, r, invalidArg("since must be an RFC 3339 time: %v", err))
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	tracker := replay.NewStatusTracker()
	started := false
	err := h.Service.CustomerEvents(r.Context(), p, customerID, since, func(ev events.Event) error {
		started = true
		return enc.Encode(newEvent(ev, tracker.Entry(ev)))
	})
	if err != nil && !started {
		h.fail(w, r, err)
	}
}

// rebuild rebuilds the projections from the log side by side and swaps
// them in; the API keeps serving meanwhile. Operator only.
func (h *handler) rebuild(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	if !p.IsOperator() {
		h.fail(w, r, noRoute(r))
		return
	}
	start := time.Now()
	err := h.Ready.Rebuild(r.Context(), func(seq, last uint64) {
		h.Logger.Info().Uint64("seq", seq).Uint64("last", last).Msg("rebuilding projections")
	})
	if err != nil {
		h.fail(w, r, fmt.Errorf("%w: rebuild: %v", scheduler.ErrUnavailable, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"applied": h.Ready.Applied(), "digest": h.Ready.Digest(), "seconds": time.Since(start).Seconds()})
}
