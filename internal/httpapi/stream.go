package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// StreamLimits bound the event streams of GET /v1/events/stream. The
// zero value of each field means its default.
type StreamLimits struct {
	// Max bounds the streams open at once, MaxPerCustomer those of one
	// customer token (the operator's count only toward Max); past either
	// a stream is answered 503. Defaults DefaultMaxStreams and
	// DefaultMaxStreamsPerCustomer; -1: no limit.
	Max, MaxPerCustomer int
	// Buffer and BufferBytes bound the events one stream holds that its
	// client has not taken; past either the client is sent them and an
	// overflow message, and dropped. Defaults DefaultStreamBuffer and
	// DefaultStreamBufferBytes.
	Buffer, BufferBytes int
	// Heartbeat is how often a stream sends a comment; default
	// DefaultStreamHeartbeat.
	Heartbeat time.Duration
	// Drain is how long a stream that ends (an overflow, a shutdown) has
	// to write out what it holds before its connection is cut; default
	// DefaultStreamDrain.
	Drain time.Duration
}

// withDefaults fills in the defaults and checks the result.
func (l *StreamLimits) withDefaults() error {
	orDefault(&l.Max, DefaultMaxStreams)
	orDefault(&l.MaxPerCustomer, DefaultMaxStreamsPerCustomer)
	orDefault(&l.Buffer, DefaultStreamBuffer)
	orDefault(&l.BufferBytes, DefaultStreamBufferBytes)
	orDefault(&l.Heartbeat, DefaultStreamHeartbeat)
	orDefault(&l.Drain, DefaultStreamDrain)
	if l.Buffer < 1 || l.BufferBytes < 1 || l.Heartbeat < 0 || l.Drain < 0 {
		return errors.New("httpapi: a stream's buffer, heartbeat and drain must be positive")
	}
	return nil
}

// The defaults of StreamLimits.
const (
	DefaultMaxStreams            = 256
	DefaultMaxStreamsPerCustomer = 64
	DefaultStreamBuffer          = 1000
	DefaultStreamBufferBytes     = 1 << 20
	DefaultStreamHeartbeat       = 15 * time.Second
	DefaultStreamDrain           = 10 * time.Second
)

// streams counts the open event streams, in all and per customer.
type streams struct {
	mu               sync.Mutex
	total            int
	perCustomer      map[string]int
	max, maxCustomer int // negative: no limit
	overflows        atomic.Int64
}

// register registers the streams' metrics with reg.
func (s *streams) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "taskledger_http_event_streams",
			Help: "Live event streams (GET /v1/events/stream) open now.",
		}, func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(s.total) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskledger_http_event_stream_overflows_total",
			Help: "Event streams dropped because their client read too slowly.",
		}, func() float64 { return float64(s.overflows.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// enter takes a stream slot for p, or answers why not; leave gives it
// back.
func (s *streams) enter(p service.Principal) (leave func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max >= 0 && s.total >= s.max {
		return nil, api.ErrUnavailable.WithMessage(fmt.Sprintf("%d event streams open, the most this server serves (--max-streams); retry later", s.total))
	}
	counted := !p.IsOperator()
	if counted && s.maxCustomer >= 0 && s.perCustomer[p.CustomerID] >= s.maxCustomer {
		return nil, api.ErrUnavailable.WithMessage(fmt.Sprintf("this customer holds %d event streams, the most it may (--max-streams-per-customer); retry later", s.maxCustomer))
	}
	s.total++
	if counted {
		s.perCustomer[p.CustomerID]++
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.total--
		if counted {
			if s.perCustomer[p.CustomerID]--; s.perCustomer[p.CustomerID] == 0 {
				delete(s.perCustomer, p.CustomerID)
			}
		}
	}, nil
}

// overflowError ends a stream whose client fell behind.
type overflowError struct{ api.StreamOverflow }

func (e *overflowError) Error() string { return e.Reason }

// streamArgs parses the filter and the resume token of a stream request
// (Service.ParseCursor reads it); after is "" when the request names none.
func streamArgs(r *http.Request) (f service.StreamFilter, after string, err error) {
	q := r.URL.Query()
	list := func(name string) []string {
		var out []string
		for _, v := range q[name] {
			for part := range strings.SplitSeq(v, ",") {
				if part != "" {
					out = append(out, part)
				}
			}
		}
		return out
	}
	f = service.StreamFilter{TaskIDs: list("taskId"), RootIDs: list("rootId"), Queues: list("queue")}
	for _, t := range list("type") {
		f.Types = append(f.Types, events.Type(t))
	}
	if err := f.Validate(); err != nil {
		return f, "", err
	}
	after = q.Get("after")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		after = id
	}
	return f, after, nil
}

// streamCursor returns the cursor a stream of p starts from: the one
// token names (sealed for a customer, cursorSeal), or with none the
// log's end (live only: from the next event stored).
func (h *handler) streamCursor(r *http.Request, p service.Principal, token string) (service.Cursor, error) {
	if token == "" {
		return h.Service.LiveCursor(r.Context())
	}
	plain, ok := h.cursors.open(p, token)
	var c service.Cursor
	if ok {
		c, ok = h.Service.ParseCursor(plain)
	}
	if !ok {
		name := "after"
		if r.Header.Get("Last-Event-ID") != "" {
			name = "Last-Event-ID"
		}
		if !p.IsOperator() {
			return nil, invalidArg("%s must be 0 or the id of an event this stream sent this customer", name)
		}
		return nil, invalidArg("%s must be %s", name, h.Service.CursorForm())
	}
	return c, nil
}

// stream serves GET /v1/events/stream (docs/API.md, "Live event stream"):
// one goroutine follows the log into the stream's buffer (serveSSE); a
// client that lets the buffer fill is sent it, then an overflow
// message, and dropped.
func (h *handler) stream(w http.ResponseWriter, r *http.Request, p service.Principal) {
	f, token, err := streamArgs(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	after, err := h.streamCursor(r, p, token)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.serveSSE(w, r, p, func(ctx context.Context, send func([]byte) error) error {
		last, lastToken := events.Position(0), h.Service.CursorToken(after)
		if len(after) > 0 {
			last = after[0]
		}
		return h.Service.Stream(ctx, p, f, after, func(ev api.Event, at service.Cursor) error {
			token := h.Service.CursorToken(at)
			b, err := h.sseEvent(p, ev, token)
			if err != nil {
				return err
			}
			var full *bufferFull
			if err := send(b); errors.As(err, &full) {
				o := api.StreamOverflow{After: uint64(last), Reason: fmt.Sprintf(
					"the client read too slowly: %d events (%d bytes) not taken", full.n, full.bytes)}
				if len(at) > 1 {
					o.Cursor = lastToken
				}
				if !p.IsOperator() {
					o.After, o.Cursor = 0, h.cursors.seal(p, lastToken)
				}
				return &overflowError{o}
			}
			last, lastToken = events.Position(ev.Seq), token
			return nil
		})
	})
}

// bufferFull is what serveSSE's send answers when the stream's buffer
// holds n messages of bytes bytes and takes no more.
type bufferFull struct{ n, bytes int }

func (e *bufferFull) Error() string {
	return fmt.Sprintf("stream buffer full: %d messages, %d bytes", e.n, e.bytes)
}

// serveSSE serves one Server-Sent Events stream to p, within the
// stream limits (Streams): it takes a stream slot (503 when none is
// left), sends the headers, and runs produce in a goroutine of its own
// with a send that queues one message, at most Streams.Buffer messages
// and Streams.BufferBytes bytes, or answers a *bufferFull without
// queueing it. The handler writes what is queued, and a comment every
// Streams.Heartbeat. When produce returns, what is queued goes out
// within Streams.Drain; then an *overflowError from produce is sent as
// the overflow message, another error (not the client's leaving) is
// logged, and the stream ends.
func (h *handler) serveSSE(w http.ResponseWriter, r *http.Request, p service.Principal, produce func(ctx context.Context, send func([]byte) error) error) {
	leave, err := h.streams.enter(p)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer leave()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no") // proxies: do not buffer
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	msgs := make(chan []byte, h.Streams.Buffer)
	var held sync.Mutex // guards heldBytes and the sends
	heldBytes := 0
	send := func(b []byte) error {
		held.Lock()
		defer held.Unlock()
		n, bytes := len(msgs), heldBytes
		if n == cap(msgs) || bytes > 0 && bytes+len(b) > h.Streams.BufferBytes {
			h.streams.overflows.Add(1)
			return &bufferFull{n, bytes}
		}
		heldBytes += len(b)
		msgs <- b // never blocks: sends hold the lock, and msgs is not full
		return nil
	}
	done := make(chan error, 1)
	go func() {
		err := produce(ctx, send)
		// The handler may be stuck writing to a client that reads
		// nothing: what is left must go out within Streams.Drain.
		rc.SetWriteDeadline(time.Now().Add(h.Streams.Drain))
		done <- err
	}()
	ended := false
	defer func() {
		cancel()
		if !ended {
			<-done
		}
		// The connection may serve another request: no deadline for it.
		rc.SetWriteDeadline(time.Time{})
	}()
	write := func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		held.Lock()
		heldBytes -= len(b)
		held.Unlock()
		return len(msgs) > 0 || rc.Flush() == nil
	}
	heartbeat := time.NewTicker(h.Streams.Heartbeat)
	defer heartbeat.Stop()
	for {
		select {
		case b := <-msgs:
			if !write(b) {
				return
			}
		case <-heartbeat.C:
			if _, err := w.Write([]byte(": ping\n\n")); err != nil || rc.Flush() != nil {
				return
			}
		case err := <-done:
			ended = true
			for len(msgs) > 0 {
				if !write(<-msgs) {
					return
				}
			}
			var o *overflowError
			switch {
			case errors.As(err, &o):
				data, _ := json.Marshal(o.StreamOverflow)
				fmt.Fprintf(w, "event: %s\ndata: %s\n\n", api.StreamOverflowEvent, data)
			case err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled):
				// The headers are out: the stream just ends, and the
				// client resumes after its last id.
				h.ErrorLog.Log(zerolog.ErrorLevel, "stream "+r.Pattern, "event stream failed", func(e *zerolog.Event) {
					e.Err(err)
				})
			}
			rc.Flush()
			return
		}
	}
}

// sseEvent is the Server-Sent Events message of e for p; token is the
// resume token after it, its id (on a sharded log also its cursor: with
// one shard the token is its sequence). A customer's id is the token
// sealed (cursorSeal), also its cursor, and its Seq is left out
// (forCaller).
func (h *handler) sseEvent(p service.Principal, e api.Event, token string) ([]byte, error) {
	if !p.IsOperator() {
		token = h.cursors.seal(p, token)
		e = forCaller(p, []api.Event{e})[0]
	}
	if token != strconv.FormatUint(e.Seq, 10) {
		e.Cursor = token
	}
	data, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "id: %s\nevent: %s\ndata: %s\n\n", token, e.Type, data), nil
}

// stats serves GET /v1/stats (docs/API.md, "Statistics").
func (h *handler) stats(w http.ResponseWriter, r *http.Request, p service.Principal) {
	last, err := h.Service.LastSeq(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	applied := h.Ready.Applied()
	stats := h.Service.Stats(p, api.MaxStatsRows)
	out := api.Stats{
		At: stats.At.UTC(), Applied: applied, LastSeq: last, Lag: last - min(last, applied), CaughtUp: h.Ready.CaughtUp(),
		Queues: []api.QueueStats{}, Alarm: h.alarmStats(), Keys: []api.KeyStats{}, KeysTruncated: stats.KeysTruncated,
		Schedules: []api.ScheduleStats{}, SchedulesTruncated: stats.SchedulesTruncated, Partitions: h.partitionStats(), Epochs: h.epochStats(),
	}
	if p.IsOperator() && h.Health != nil { // global: never a customer's
		q := h.Health.Quarantine()
		out.Quarantine = &q
	}
	for _, q := range stats.Queues {
		row := api.QueueStats{
			CustomerID: q.CustomerID, Queue: q.Queue, Counts: make(map[string]int, len(q.Counts)),
			OldestQueuedSeconds: q.OldestQueued.Seconds(),
			Claims:              api.Rate{Last1m: q.Claims1m, Last5m: q.Claims5m},
			Results:             api.Rate{Last1m: q.Results1m, Last5m: q.Results5m},
			NearTimeout:         q.NearTimeout, Retries: q.Retries, Rejections: q.Rejections,
		}
		for st, n := range q.Counts {
			row.Counts[string(st)] = n
		}
		out.Queues = append(out.Queues, row)
	}
	for _, k := range stats.Keys {
		out.Keys = append(out.Keys, api.KeyStats{CustomerID: k.CustomerID, Key: k.Key, Limit: k.Limit, Holders: k.Holders, Waiting: k.Waiting})
	}
	for _, sc := range stats.Schedules {
		row := api.ScheduleStats{CustomerID: sc.CustomerID, ID: sc.ID, Paused: sc.Paused, Next: utc(sc.Next), RunCount: sc.Runs}
		if r := sc.LastRun; r != nil {
			row.LastRun = &api.ScheduleRun{At: r.At.UTC(), TaskID: r.TaskID, RequestID: r.RequestID, Status: string(r.Status), Missed: r.Missed, Manual: r.Manual}
		}
		out.Schedules = append(out.Schedules, row)
	}
	if !p.IsOperator() {
		writeJSON(w, http.StatusOK, customerStats{At: out.At, CaughtUp: out.CaughtUp, Queues: out.Queues,
			Keys: out.Keys, KeysTruncated: out.KeysTruncated, Schedules: out.Schedules, SchedulesTruncated: out.SchedulesTruncated})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// customerStats is GET /v1/stats for a customer token: the rows of its
// own queues, keys and schedules, and none of the log's or the process's
// figures (applied, lastSeq, lag, alarm, partitions, epochs), which tell
// how much every tenant does. It decodes as an api.Stats with those zero.
type customerStats struct {
	At                 time.Time           `json:"at"`
	CaughtUp           bool                `json:"caughtUp"`
	Queues             []api.QueueStats    `json:"queues"`
	Keys               []api.KeyStats      `json:"keys"`
	KeysTruncated      bool                `json:"keysTruncated,omitempty"`
	Schedules          []api.ScheduleStats `json:"schedules"`
	SchedulesTruncated bool                `json:"schedulesTruncated,omitempty"`
}

// alarmStats renders the alarm's recent lateness; no samples without.
func (h *handler) alarmStats() api.AlarmStats {
	if h.Lateness == nil {
		return api.AlarmStats{Timers: map[string]api.Lateness{}}
	}
	return h.Lateness()
}
