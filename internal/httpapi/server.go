// Package httpapi serves the HTTP API (docs/API.md) over a Service (the
// service layer, internal/scheduler, through the interface declared in
// service.go), and calls the same service in process (Local) with the
// same answers. It links neither the log nor the projections, the
// reactors or replay: what it shows of them comes from the service.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
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
	"github.com/taskledger/taskledger/internal/console"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/internal/service"
)

// Readiness reports whether the projections have caught up, and rebuilds
// them on an operator's request.
type Readiness interface {
	CaughtUp() bool
	Applied() uint64
	Digest() string
	Rebuild(ctx context.Context, progress func(seq, last uint64)) error
}

// LogHealth reports the condition of the log for /readyz.
type LogHealth interface {
	// WriteError is non-nil while the log does not take writes: /readyz
	// then answers 503 with the reason.
	WriteError() error
	// LogWarning is non-empty when the log ends before (or differs from)
	// its saved chain head, or holds quarantined messages: /readyz shows
	// it, and stays 200.
	LogWarning() string
	// Quarantine is the log's quarantined messages: messages that do not
	// decode, which every read skips (operators' /readyz?digest=1 and
	// GET /v1/stats).
	Quarantine() api.QuarantineStats
	// StreamsError is non-nil when a stream of the log is missing or lost
	// the events already read from it (deleted or purged while the
	// process runs): /readyz answers 503 with it. Each /readyz calls it;
	// ctx is the request's.
	StreamsError(ctx context.Context) error
}

// TimerPartitions reports the timer partitions this process holds a lease
// on (internal/lease.Leases), for /readyz and GET /v1/stats.
type TimerPartitions interface {
	Partitions() int
	Owned() []int
	Instance() string
	TTL() time.Duration
}

// ServerConfig configures the HTTP handler.
type ServerConfig struct {
	Service Service
	Ready   Readiness
	Health  LogHealth // optional
	// Lateness, if set, returns how late the alarm acted on its timers
	// lately (internal/scheduler's AlarmStats) for GET /v1/stats (nil: no samples).
	Lateness func() api.AlarmStats
	// Partitions is the timer partitions this process holds; optional
	// (nil: /readyz and GET /v1/stats show none, the alarm acts on all).
	Partitions TimerPartitions
	// Epochs, if set, returns the log's epoch slots for GET /v1/stats
	// (nil for a log without epochs).
	Epochs func() *api.EpochStats
	// Tokens maps bearer tokens to customer ids ("*" for an operator).
	// Nil means no auth: every request acts as an operator, and only
	// requests for a loopback Host are served (DNS rebinding).
	Tokens map[string]string
	// TokenNames names the caller of a token (the auth file's optional
	// third field): the actor of the events its requests append
	// (service.Principal.Actor). A token without a name is named by its
	// customer id.
	TokenNames map[string]string
	// Gatherer is served on GET /metrics (to an operator when Tokens are
	// set); nil serves no metrics route.
	Gatherer prometheus.Gatherer
	// Registerer gets the handler's own metrics (request body bytes
	// held); nil registers none.
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
	// ErrorLog rate-limits the log lines of failed requests; default one
	// on Logger with ratelog.DefaultInterval.
	ErrorLog *ratelog.Limiter
	// MaxInFlight bounds the requests served at once (long polls of
	// claims/next aside); past it a request is answered 503 with
	// Retry-After at once instead of queueing. A request holds its slot
	// only once its body is in. Default 1024; -1: no limit.
	MaxInFlight int
	// BodyTimeout is how long a client has to send a request's whole
	// body; one not in by then is answered 408 and its connection
	// closed. Default DefaultBodyTimeout; -1: no limit.
	BodyTimeout time.Duration
	// MaxBodyMemory bounds the bytes of request bodies held at once,
	// being received or served; past it a request is answered 503. It
	// must be at least api.MaxBatchBodyBytes. Default
	// DefaultMaxBodyMemory; -1: no limit.
	MaxBodyMemory int64
	// Streams bounds the event streams of GET /v1/events/stream.
	Streams StreamLimits
	// CursorKey (32 bytes, eventlog.CursorKey) seals the event stream's
	// resume tokens for customer tokens (cursorSeal); every process of a
	// log must share it. Nil: a random key, whose tokens only this
	// handler opens.
	CursorKey []byte
	// Durable, if set, returns once every write acknowledged before the
	// call is on stable storage (broker.Embedded.Sync). The answer to
	// every request that may write (any method but GET, HEAD and OPTIONS)
	// waits for it, and becomes 503 if it fails. Nil: answers do not
	// wait (the log's own durability).
	Durable func(context.Context) error
}

// The defaults of ServerConfig.
const (
	DefaultBodyTimeout   = 30 * time.Second
	DefaultMaxBodyMemory = 1 << 30
)

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
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 1024
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.MaxBodyMemory == 0 {
		cfg.MaxBodyMemory = DefaultMaxBodyMemory
	}
	if cfg.MaxBodyMemory > 0 && cfg.MaxBodyMemory < api.MaxBatchBodyBytes {
		return nil, fmt.Errorf("httpapi: MaxBodyMemory %d is below the largest body, %d bytes", cfg.MaxBodyMemory, api.MaxBatchBodyBytes)
	}
	if cfg.ErrorLog == nil {
		cfg.ErrorLog = ratelog.New(cfg.Logger, 0)
	}
	if err := cfg.Streams.withDefaults(); err != nil {
		return nil, err
	}
	cursors, err := newCursorSeal(cfg.CursorKey)
	if err != nil {
		return nil, err
	}
	h := &handler{ServerConfig: cfg, bodies: &bodyBudget{limit: cfg.MaxBodyMemory}, openapi: openapi, cursors: cursors,
		streams: &streams{perCustomer: make(map[string]int), max: cfg.Streams.Max, maxCustomer: cfg.Streams.MaxPerCustomer}}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "taskledger_http_body_bytes",
			Help: "Bytes of request bodies held in memory now, being received or served (at most --max-body-memory).",
		}, func() float64 { return float64(h.bodies.used.Load()) })); err != nil {
			return nil, err
		}
		if err := h.streams.register(cfg.Registerer); err != nil {
			return nil, err
		}
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
	return h.recoverer(h.guard(csrf.Handler(mux))), nil
}

// metricsRoute serves g in Prometheus' text format.
func metricsRoute(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// MetricsHandler serves only GET /metrics of g, to anyone who reaches it:
// for a listener of its own on a private address, apart from the API.
// Every other path is a JSON 404. Against DNS rebinding it serves only a
// Host that is an IP address, localhost, or one of hosts (names without
// a port); any other is 403.
func MetricsHandler(g prometheus.Gatherer, hosts []string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsRoute(g))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { writeError(w, noRoute(r)) })
	policy := metricsHosts(hosts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secureHeaders(w.Header())
		if !policy.refuse(w, r) {
			mux.ServeHTTP(w, r)
		}
	})
}

type handler struct {
	ServerConfig
	slots   chan struct{} // in-flight requests; nil: no limit
	bodies  *bodyBudget
	openapi []byte // docs/openapi.yaml as JSON
	streams *streams
	cursors *cursorSeal
}

// orDefault sets *v to def when it is zero.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
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
	{"POST /v1/tasks", inFlight((*handler).schedule)},
	{"GET /v1/tasks", inFlight((*handler).list)},
	{"GET /v1/tasks/{id}", inFlight((*handler).get)},
	{"POST /v1/tasks/{id}/claim", inFlight((*handler).claim)},
	{"POST /v1/claims/next", heldOpen((*handler).claimNext)},
	{"POST /v1/tasks/batch", inFlightBatch((*handler).scheduleBatch)},
	{"POST /v1/claims", heldOpen((*handler).claimBatch)},
	{"POST /v1/results", inFlightBatch((*handler).recordResults)},
	{"POST /v1/tasks/{id}/check", inFlight((*handler).check)},
	{"POST /v1/tasks/{id}/result", inFlight((*handler).result)},
	{"POST /v1/tasks/{id}/effects", inFlight((*handler).effects)},
	{"POST /v1/tasks/{id}/heartbeat", inFlight((*handler).heartbeat)},
	{"POST /v1/tasks/{id}/release", inFlight((*handler).release)},
	{"POST /v1/tasks/{id}/cancel", inFlight((*handler).cancel)},
	{"POST /v1/tasks/{id}/retry", inFlight((*handler).retryTask)},
	{"POST /v1/tasks/{id}/mailbox", inFlight((*handler).appendMail)},
	{"GET /v1/tasks/{id}/mailbox", inFlight((*handler).mailbox)},
	{"GET /v1/tasks/{id}/history", inFlight((*handler).history)},
	{"GET /v1/tasks/{id}/tree", inFlight((*handler).tree)},
	{"PUT /v1/tasks/{id}/run", inFlightUpTo(api.MaxRunBytes, (*handler).saveRun)},
	{"GET /v1/tasks/{id}/run", inFlight((*handler).getRun)},
	{"GET /v1/tasks/{id}/run/stream", heldOpen((*handler).runStream)},
	{"POST /v1/tasks/{id}/progress", inFlight((*handler).progress)},
	{"GET /v1/events", inFlight((*handler).customerEvents)},
	{"GET /v1/concurrency", inFlight((*handler).concurrency)},
	// Schedules (schedules.go).
	{"POST /v1/schedules", inFlight((*handler).createSchedule)},
	{"GET /v1/schedules", inFlight((*handler).listSchedules)},
	{"GET /v1/schedules/{id}", inFlight((*handler).getSchedule)},
	{"DELETE /v1/schedules/{id}", inFlight(scheduleAction(aggregate.DeleteSchedule{}))},
	{"POST /v1/schedules/{id}/pause", inFlight(scheduleAction(aggregate.PauseSchedule{}))},
	{"POST /v1/schedules/{id}/resume", inFlight(scheduleAction(aggregate.ResumeSchedule{}))},
	{"POST /v1/schedules/{id}/trigger", inFlight((*handler).triggerSchedule)},
	{"GET /v1/schedules/{id}/history", inFlight((*handler).scheduleHistory)},
	{"GET /v1/events/stream", heldOpen((*handler).stream)},
	{"GET /v1/stats", inFlight((*handler).stats)},
	{"POST /v1/admin/projections/rebuild", inFlight((*handler).rebuild)},
	{"GET /v1/openapi.json", public((*handler).openAPI)},
	{"GET /healthz", public((*handler).healthz)},
	{"GET /readyz", public((*handler).readyz)},
	{"GET /metrics", metrics},
	{"GET /ui", func(*handler) http.Handler { return console.Redirect() }},
	{"GET /ui/{$}", ui},
	{"GET /ui/{asset}", ui},
}

// ui serves the web console's assets to anyone: they hold no data, and
// every API call the console makes carries the user's token.
func ui(*handler) http.Handler {
	return console.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeError(w, noRoute(r)) }))
}

// metrics serves the Gatherer's metrics, when there is one, to the
// operator.
func metrics(h *handler) http.Handler {
	if h.Gatherer == nil {
		return nil
	}
	m := metricsRoute(h.Gatherer)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.operatorOnly(r); err != nil {
			h.fail(w, r, err)
			return
		}
		m.ServeHTTP(w, r)
	})
}

// principalFunc is a handler method of a route that needs a principal.
type principalFunc func(*handler, http.ResponseWriter, *http.Request, service.Principal)

// inFlight serves f to the caller route resolves, for a body of at most
// api.MaxBodyBytes, holding one of the MaxInFlight slots while f runs.
func inFlight(f principalFunc) func(*handler) http.Handler {
	return authenticated(api.MaxBodyBytes, true, f)
}

// inFlightUpTo is inFlight for a body of at most limit bytes.
func inFlightUpTo(limit int64, f principalFunc) func(*handler) http.Handler {
	return authenticated(limit, true, f)
}

// inFlightBatch is inFlight for a batch body, of at most
// api.MaxBatchBodyBytes.
func inFlightBatch(f principalFunc) func(*handler) http.Handler {
	return authenticated(api.MaxBatchBodyBytes, true, f)
}

// heldOpen serves f to the caller route resolves, for a body of at most
// api.MaxBodyBytes, without an in-flight slot: for a request held open
// (a long poll, an event stream), which MaxInFlight does not count.
func heldOpen(f principalFunc) func(*handler) http.Handler {
	return authenticated(api.MaxBodyBytes, false, f)
}

// authenticated serves f through route with limit and slot.
func authenticated(limit int64, slot bool, f principalFunc) func(*handler) http.Handler {
	return func(h *handler) http.Handler {
		return h.route(limit, slot, func(w http.ResponseWriter, r *http.Request, p service.Principal) { f(h, w, r, p) })
	}
}

// public serves f to anyone, without a token or a slot, reading no body.
func public(f func(*handler, http.ResponseWriter, *http.Request)) func(*handler) http.Handler {
	return func(h *handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f(h, w, r) })
	}
}

// principalHandler is a route's handler, called for the caller's
// principal.
type principalHandler func(http.ResponseWriter, *http.Request, service.Principal)

// route resolves the bearer token to a principal (401 without a known
// token when tokens are configured, the operator when they are not),
// reads the whole body (at most limit bytes, within BodyTimeout) and then,
// if slot, holds one of the in-flight slots while next runs. A slow
// client thus holds a connection, never a slot. The answer of a request
// that may write waits for Durable (durableWriter).
func (h *handler) route(limit int64, slot bool, next principalHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := h.principal(r)
		if err == nil {
			if err = checkContentType(r); err != nil {
				// The body is not read: net/http would wait for it to
				// discard it, with no deadline set yet.
				w.Header().Set("Connection", "close")
			}
		}
		if err == nil {
			var held int64
			held, err = h.readBody(w, r, limit)
			defer h.bodies.release(held)
		}
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if slot && h.slots != nil {
			select {
			case h.slots <- struct{}{}:
				defer func() { <-h.slots }()
			default:
				h.ErrorLog.Log(zerolog.WarnLevel, "max-inflight", "request refused: --max-inflight requests in flight", func(e *zerolog.Event) {
					e.Int("maxInFlight", cap(h.slots))
				})
				writeError(w, api.ErrUnavailable.WithMessage("too many requests in flight; retry later"))
				return
			}
		}
		if h.Durable != nil && writes(r.Method) {
			w = &durableWriter{ResponseWriter: w, h: h, r: r}
		}
		next(w, r, p)
	}
}

// principal is who r acts for: the operator without tokens, else the
// bearer token's customer (or operator), or 401.
func (h *handler) principal(r *http.Request) (service.Principal, error) {
	if h.Tokens == nil {
		return service.Operator, nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	customer, known := h.Tokens[token]
	if !ok || token == "" || !known {
		return service.Principal{}, api.ErrUnauthenticated
	}
	return service.Principal{CustomerID: customer, Name: h.TokenNames[token]}, nil
}

// operatorOnly admits the operator to an internal route (metrics, the
// projection digest): with tokens, 401 without a known one and 404 for a
// customer's, as for the admin routes.
func (h *handler) operatorOnly(r *http.Request) error {
	p, err := h.principal(r)
	if err == nil && !p.IsOperator() {
		err = noRoute(r)
	}
	return err
}

// guard sets the headers of every answer (secureHeaders) and refuses,
// before any route runs, a request for a Host that is not loopback when
// there are no tokens (a DNS-rebinding page would otherwise act as the
// operator), and a path that is not canonical (net/http's mux would
// redirect it, keeping method and body).
func (h *handler) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secureHeaders(w.Header())
		if h.Tokens == nil && apiHosts.refuse(w, r) {
			return
		}
		if p := r.URL.Path; p != canonicalPath(p) {
			writeError(w, invalidArg("path %q is not canonical (no empty, . or .. segments); use %q", p, canonicalPath(p)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// canonicalPath is p as net/http's mux cleans it: rooted, with no empty,
// "." or ".." segments, a trailing slash kept.
func canonicalPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// LoopbackHost reports whether host (no port) is localhost or a loopback
// address (127.0.0.0/8, ::1, with or without brackets).
func LoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// recoverer turns a panic in a handler into a 500 with a JSON body.
func (h *handler) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v)
				}
				h.ErrorLog.Log(zerolog.ErrorLevel, "panic "+r.Pattern, "handler panicked", func(e *zerolog.Event) {
					e.Interface("panic", v).Str("path", r.URL.Path)
				})
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
		if err := h.operatorOnly(r); err != nil {
			h.fail(w, r, err)
			return
		}
		body["digest"] = h.Ready.Digest()
		if h.Health != nil {
			body["quarantine"] = h.Health.Quarantine()
		}
	}
	if p := h.partitionStats(); p != nil {
		body["partitions"] = p
	}
	status := http.StatusOK
	if !h.Ready.CaughtUp() {
		status = http.StatusServiceUnavailable
	}
	if h.Health != nil {
		if warning := h.Health.LogWarning(); warning != "" {
			body["log"] = warning
		}
		if err := h.Health.WriteError(); err != nil {
			body["storage"], status = err.Error(), http.StatusServiceUnavailable
		}
		if err := h.Health.StreamsError(r.Context()); err != nil {
			body["streams"], status = err.Error(), http.StatusServiceUnavailable
		}
	}
	writeJSON(w, status, body)
}

// partitionStats renders the timer partitions held; nil without.
func (h *handler) partitionStats() *api.PartitionStats {
	if h.Partitions == nil {
		return nil
	}
	return &api.PartitionStats{Count: h.Partitions.Partitions(), Owned: h.Partitions.Owned(),
		Instance: h.Partitions.Instance(), LeaseTTLSeconds: h.Partitions.TTL().Seconds()}
}

// epochStats renders the log's epoch slots; nil without.
func (h *handler) epochStats() *api.EpochStats {
	if h.Epochs == nil {
		return nil
	}
	return h.Epochs()
}

// decode reads the JSON body (which route has read and bounded) into v.
// An empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	body, err := bodyBytes(r)
	if err != nil {
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
	// Unmarshal, not a Decoder: it decodes the body in place (a Decoder
	// copies it into a buffer of its own first, a second copy of up to
	// 8 MiB for a batch), and refuses anything but white space after the
	// value, a stray '}' or ']' included.
	if err := json.Unmarshal(body, v); err != nil {
		return invalidArg("malformed JSON body: %v", err)
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

// fail answers err as its wire error, logging server-side failures (and
// slow bodies, at warn): the first of a route and code in full, repeats
// as a count (ErrorLog).
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := wireError(err)
	level := zerolog.Disabled
	switch {
	case e.Status >= 500:
		level = zerolog.ErrorLevel
	case e.Status == http.StatusRequestTimeout:
		level = zerolog.WarnLevel
	}
	if level != zerolog.Disabled {
		key := fmt.Sprintf("%d %s %s", e.Status, e.Code, r.Pattern)
		h.ErrorLog.Log(level, key, "request failed", func(ev *zerolog.Event) {
			ev.Err(err).Str("method", r.Method).Str("path", r.URL.Path)
		})
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

func (h *handler) schedule(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.ScheduleRequest
	if err := decode(r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	st, created, err := h.Service.Schedule(r.Context(), p, scheduleRequest(b))
	h.scheduled(w, r, st, created, err)
}

// scheduled answers a new task (201), the one a repeated requestId made
// (200), or err.
func (h *handler) scheduled(w http.ResponseWriter, r *http.Request, st aggregate.State, created bool, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, createdCode(created), NewTask(st))
}

func (h *handler) get(w http.ResponseWriter, r *http.Request, p service.Principal) {
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

func (h *handler) list(w http.ResponseWriter, r *http.Request, p service.Principal) {
	q := r.URL.Query()
	f := service.TaskFilter{Status: aggregate.Status(q.Get("status")), Queue: q.Get("queue"), CustomerID: q.Get("customerId"), RootID: q.Get("rootId"),
		IDPrefix: q.Get("idPrefix"), Kind: q.Get("kind")}
	switch f.Status {
	case "", aggregate.StatusScheduled, aggregate.StatusQueued, aggregate.StatusRunning, aggregate.StatusSucceeded,
		aggregate.StatusFailed, aggregate.StatusCanceled, aggregate.StatusTimedOut:
	default:
		h.fail(w, r, invalidArg("unknown status %q", f.Status))
		return
	}
	for name, v := range map[string]string{"queue": f.Queue, "customerId": f.CustomerID, "rootId": f.RootID, "after": q.Get("after"), "idPrefix": f.IDPrefix} {
		if v == "" {
			continue
		}
		if err := events.ValidID(v); err != nil {
			h.fail(w, r, invalidArg("%s: %v", name, err))
			return
		}
	}
	if err := aggregate.ValidateKind(f.Kind); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := h.searchFilter(p, q, &f); err != nil {
		h.fail(w, r, err)
		return
	}
	limit, err := listLimit(q.Get("limit"))
	if err != nil {
		h.fail(w, r, err)
		return
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

// listLimit reads a list's limit parameter: api.DefaultListLimit when
// empty, at most api.MaxListLimit.
func listLimit(s string) (int, error) {
	if s == "" {
		return api.DefaultListLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, invalidArg("limit must be a whole number from 1 to %d", api.MaxListLimit)
	}
	return min(n, api.MaxListLimit), nil
}

// taskAction decodes body into v and runs do on the path's task,
// answering the task it returns.
func (h *handler) taskAction(w http.ResponseWriter, r *http.Request, v any, do func(id string) (aggregate.State, error)) {
	id, err := pathID(r)
	if err == nil {
		err = decode(r, v)
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

func (h *handler) claim(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.ClaimRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.Claim(r.Context(), p, id, b.DeliveryID, b.ExecutorID, api.WithHeartbeat(b.HeartbeatSeconds))
	})
}

// heartbeat renews a claim's heartbeat (POST /v1/tasks/{id}/heartbeat).
func (h *handler) heartbeat(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var b api.HeartbeatRequest
	if err == nil {
		err = decode(r, &b)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rn, err := h.Service.Heartbeat(r.Context(), p, id, b.DeliveryID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Renewal{ExpiresAt: utc(rn.ExpiresAt), Deadline: utc(rn.Deadline)})
}

// release hands a claim back (POST /v1/tasks/{id}/release).
func (h *handler) release(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.ReleaseRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.Release(r.Context(), p, id, b.DeliveryID, b.Reason)
	})
}

func (h *handler) result(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.ResultRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.RecordResult(r.Context(), p, id, b.DeliveryID, result(b))
	})
}

func (h *handler) effects(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.EffectsRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.ReportEffects(r.Context(), p, id, b.DeliveryID, b.Effects)
	})
}

func (h *handler) cancel(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.CancelRequest
	h.taskAction(w, r, &b, func(id string) (aggregate.State, error) {
		return h.Service.Cancel(r.Context(), p, id, b.Reason)
	})
}

func (h *handler) claimNext(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.ClaimNextRequest
	if err := decode(r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	queue, wait, err := pollArgs(b.Queue, b.WaitSeconds)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, ok, err := h.Service.ClaimNext(r.Context(), p, queue, b.ExecutorID, wait, api.WithHeartbeat(b.HeartbeatSeconds))
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

func (h *handler) check(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var b api.CheckRequest
	if err == nil {
		err = decode(r, &b) // optional: an empty body peeks
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := h.Service.Check(r.Context(), p, id, b.DeliveryID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Check{ShouldStop: res.ShouldStop, Reason: res.Reason, Messages: newMailItems(res.Messages), Cursor: res.Cursor})
}

func (h *handler) appendMail(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var b api.MailRequest
	if err == nil {
		err = decode(r, &b)
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

func (h *handler) mailbox(w http.ResponseWriter, r *http.Request, p service.Principal) {
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

func (h *handler) history(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	timeline := h.Service.Timeline
	if tree := r.URL.Query().Get("tree"); tree == "1" || tree == "true" {
		timeline = h.Service.LineageTimeline
	}
	entries, err := timeline(r.Context(), p, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.History{Events: forCaller(p, entries)})
}

func (h *handler) tree(w http.ResponseWriter, r *http.Request, p service.Principal) {
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
func (h *handler) customerEvents(w http.ResponseWriter, r *http.Request, p service.Principal) {
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
	started := false
	err := h.Service.CustomerTimeline(r.Context(), p, customerID, since, func(e api.Event) error {
		started = true
		return enc.Encode(forCaller(p, []api.Event{e})[0])
	})
	if err != nil && !started {
		h.fail(w, r, err)
	}
}

// rebuild rebuilds the projections from the log side by side and swaps
// them in; the API keeps serving meanwhile. Operator only.
func (h *handler) rebuild(w http.ResponseWriter, r *http.Request, p service.Principal) {
	if !p.IsOperator() {
		h.fail(w, r, noRoute(r))
		return
	}
	start := time.Now()
	err := h.Ready.Rebuild(r.Context(), func(seq, last uint64) {
		h.Logger.Info().Uint64("seq", seq).Uint64("last", last).Msg("rebuilding projections")
	})
	if err != nil {
		h.fail(w, r, fmt.Errorf("%w: rebuild: %v", service.ErrUnavailable, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"applied": h.Ready.Applied(), "digest": h.Ready.Digest(), "seconds": time.Since(start).Seconds()})
}
