// Package natsapi serves the HTTP API over NATS request/reply (docs/API.md,
// "NATS protocol"): a NATS micro service in a queue group, so every
// taskledger process on the stream serves it, that turns each request into
// an in-process http.Request and runs it through the same http.Handler the
// HTTP listener serves (internal/httpapi, wrapped by the node). Every
// route, limit, error and the group commit (answers to writes wait for
// the fsync) are thus those of HTTP by construction; this package adds
// only the translation, the customer check of the subject and a bound on
// the requests it serves at once.
package natsapi

import (
	"bytes"
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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// Config configures a Service. NC, Handler and Root are required.
type Config struct {
	// NC is the connection the service subscribes on: the scheduler's
	// own, which may publish to every inbox.
	NC *nats.Conn
	// Handler serves the requests: the API's handler (node.Node.Handler),
	// with its authentication, limits and group commit.
	Handler http.Handler
	// Root is the subject root (events.Subjects.Root); requests arrive on
	// api.NATSSubject(Root, customer) + ".>".
	Root string
	// Tokens maps bearer tokens to customer ids ("*" for an operator), as
	// the handler's: a request whose subject names another customer than
	// its token's is answered 403. Nil: no tokens, no check (the handler
	// then treats every request as the operator's).
	Tokens map[string]string
	// MaxRequests bounds the requests served at once, long polls
	// included (HTTP bounds those by its connections, --max-conns); past
	// it a request is answered 503 at once. Default 4096.
	MaxRequests int
	// MaxBytes bounds the bytes of the request bodies held by the
	// requests served at once (each up to the NATS max payload); past it
	// a request is answered 503 at once. Default DefaultMaxBytes.
	MaxBytes int64
	// MaxWait bounds how long one request is served (a long poll waits
	// at most api.MaxWaitSeconds); past it the request's context ends.
	// Default api.MaxWaitSeconds + 30 s.
	MaxWait time.Duration
	Logger  zerolog.Logger
}

// DefaultMaxRequests is Config.MaxRequests' default.
const DefaultMaxRequests = 4096

// DefaultMaxBytes is Config.MaxBytes' default: 256 MiB.
const DefaultMaxBytes = 256 << 20

// Service answers API requests over NATS. Run serves it.
type Service struct {
	cfg      Config
	slots    chan struct{}
	held     atomic.Int64 // bytes of the bodies of the requests in slots
	inflight sync.Map     // customer + "\x00" + request id → its context.CancelFunc
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Service, error) {
	if cfg.NC == nil || cfg.Handler == nil || cfg.Root == "" {
		return nil, errors.New("natsapi: Config.NC, Handler and Root are required")
	}
	if cfg.MaxRequests <= 0 {
		cfg.MaxRequests = DefaultMaxRequests
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = api.MaxWaitSeconds*time.Second + 30*time.Second
	}
	return &Service{cfg: cfg, slots: make(chan struct{}, cfg.MaxRequests)}, nil
}

// QueueGroup is the queue group of every taskledger process's service:
// each request goes to one of them.
const QueueGroup = "taskledger"

// DrainTimeout is how long Run lets the requests in progress finish once
// its ctx ended, as serve gives its HTTP requests.
const DrainTimeout = 65 * time.Second

// Run subscribes and serves until ctx ends (a message without a reply
// subject is dropped unserved); then it stops taking requests (one
// still delivered is answered 503), lets the ones in progress finish
// (at most DrainTimeout, then their contexts end) and returns nil once
// they are done. It returns an
// error if the service cannot be added.
func (s *Service) Run(ctx context.Context) error {
	svc, err := micro.AddService(s.cfg.NC, micro.Config{
		Name: "taskledger", Version: "1.0.0", QueueGroup: QueueGroup,
		Description: "taskledger API over NATS (docs/API.md, NATS protocol)",
	})
	if err != nil {
		return fmt.Errorf("natsapi: add service: %w", err)
	}
	reqCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // guards stopped and wg.Add against the Wait
		stopped bool
	)
	handler := micro.HandlerFunc(func(r micro.Request) {
		if r.Reply() == "" {
			return // a publish, not a request: nobody would read the answer
		}
		if !s.replyAllowed(r) {
			s.cfg.Logger.Warn().Str("subject", r.Subject()).Str("reply", events.Truncate(r.Reply(), 200)).Msg("NATS request naming a reply outside its customer's inbox dropped")
			return
		}
		size := int64(len(r.Data()))
		if s.held.Add(size) > s.cfg.MaxBytes {
			s.held.Add(-size)
			s.respond(r, errorAnswer(api.ErrUnavailable.WithMessage(fmt.Sprintf("the NATS requests in progress hold %d bytes of bodies; retry later", s.cfg.MaxBytes))))
			return
		}
		select {
		case s.slots <- struct{}{}:
		default:
			s.held.Add(-size)
			s.respond(r, errorAnswer(api.ErrUnavailable.WithMessage(fmt.Sprintf("%d NATS requests in progress; retry later", cap(s.slots)))))
			return
		}
		mu.Lock()
		if stopped { // a request the draining subscription still delivers
			mu.Unlock()
			<-s.slots
			s.held.Add(-size)
			s.respond(r, errorAnswer(api.ErrUnavailable.WithMessage("this process is shutting down; retry")))
			return
		}
		wg.Add(1)
		mu.Unlock()
		go func() {
			defer wg.Done()
			a := s.serveRecovered(reqCtx, r)
			// Free before answering: a client that sends its next request
			// on the answer finds this one's slot free.
			<-s.slots
			s.held.Add(-size)
			s.respond(r, a)
		}()
	})
	err = svc.AddEndpoint("api", handler, micro.WithEndpointSubject(api.NATSSubject(s.cfg.Root, "*")+".>"))
	if err != nil {
		svc.Stop()
		return fmt.Errorf("natsapi: add endpoint: %w", err)
	}
	// Every process hears every cancellation (no queue group): the one
	// serving the request ends it.
	cancels, err := s.cfg.NC.Subscribe(api.NATSSubject(s.cfg.Root, "*")+".cancel", func(m *nats.Msg) {
		if f, ok := s.inflight.Load(s.requestKey(m.Subject, m.Header.Get(api.NATSRequestIDHeader))); ok {
			f.(context.CancelFunc)()
		}
	})
	if err != nil {
		svc.Stop()
		return fmt.Errorf("natsapi: subscribe to cancellations: %w", err)
	}
	<-ctx.Done()
	cancels.Unsubscribe()
	svc.Stop() // drains: requests already delivered may still come
	mu.Lock()
	stopped = true
	mu.Unlock()
	// The requests in progress finish, as an HTTP server's do at
	// shutdown (long polls end as the service closes), for at most
	// DrainTimeout; then their contexts end.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(DrainTimeout):
		cancel()
		<-done
	}
	return nil
}

// answer is what a request gets back: an HTTP answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// errorAnswer is e as the handler writes it.
func errorAnswer(e *api.Error) answer {
	body, _ := json.Marshal(e)
	h := http.Header{"Content-Type": {"application/json"}}
	if e.Status == http.StatusServiceUnavailable || e.Status == http.StatusTooManyRequests {
		h.Set("Retry-After", "1")
	}
	return answer{status: e.Status, header: h, body: append(body, '\n')}
}

// MaxHeaderBytes bounds a request's headers, keys and values, as HTTP's
// default --max-header-bytes does; more is 431.
const MaxHeaderBytes = 64 << 10

// serveRecovered is serve, with a panic answered 500 as net/http ends
// the request, not the process.
func (s *Service) serveRecovered(ctx context.Context, r micro.Request) (a answer) {
	defer func() {
		if v := recover(); v != nil {
			s.cfg.Logger.Error().Interface("panic", v).Str("subject", r.Subject()).Msg("NATS request panicked; answered 500")
			a = errorAnswer(api.ErrInternal.WithMessage("internal error"))
		}
	}()
	return s.serve(ctx, r)
}

// serve runs r through the handler.
func (s *Service) serve(ctx context.Context, r micro.Request) answer {
	h := r.Headers()
	size := 0
	for k, vs := range h {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	if size > MaxHeaderBytes {
		return errorAnswer(api.ErrHeaderTooLarge.WithMessage(fmt.Sprintf("headers of %d bytes; at most %d", size, MaxHeaderBytes)))
	}
	method, path := nats.Header(h).Get(api.NATSMethodHeader), nats.Header(h).Get(api.NATSPathHeader)
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete:
	default:
		return errorAnswer(api.ErrInvalid.WithMessage(fmt.Sprintf("%s header %q: want GET, POST, PUT or DELETE", api.NATSMethodHeader, method)))
	}
	if !strings.HasPrefix(path, "/") {
		return errorAnswer(api.ErrInvalid.WithMessage(fmt.Sprintf("%s header %q: want an absolute path, like /v1/tasks", api.NATSPathHeader, path)))
	}
	auth := nats.Header(h).Get(api.NATSAuthHeader)
	if err := s.checkCustomer(r.Subject(), auth); err != nil {
		return errorAnswer(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.MaxWait)
	defer cancel()
	if id := nats.Header(h).Get(api.NATSRequestIDHeader); id != "" {
		key := s.requestKey(r.Subject(), id)
		if _, taken := s.inflight.LoadOrStore(key, cancel); !taken {
			defer s.inflight.Delete(key)
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, bytes.NewReader(r.Data()))
	if err != nil {
		return errorAnswer(api.ErrInvalid.WithMessage(fmt.Sprintf("%s header: %v", api.NATSPathHeader, err)))
	}
	if strings.HasSuffix(req.URL.Path, "/stream") { // decoded, as the router matches it
		return errorAnswer(api.ErrInvalid.WithMessage("event streams are served over HTTP only"))
	}
	// The handler's guard admits, without tokens, only a loopback Host:
	// a request over NATS comes from a connection the server admitted.
	req.Host, req.RemoteAddr = "localhost", "nats"
	req.ContentLength = int64(len(r.Data()))
	if len(r.Data()) == 0 {
		req.Body = http.NoBody
	} else {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	w := &recorder{header: http.Header{}}
	s.cfg.Handler.ServeHTTP(w, req)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return answer{status: w.status, header: w.header, body: w.body.Bytes()}
}

// requestKey names a request by its subject's customer and its id, so a
// customer cancels only its own requests (its token publishes only on its
// own subjects).
func (s *Service) requestKey(subject, id string) string {
	customer, _ := s.customer(subject)
	return customer + "\x00" + id
}

// customer returns the customer a request's subject names
// (api.NATSSubject(Root, customer) + "." + anything); ok is false for a
// subject outside the API's.
func (s *Service) customer(subject string) (customer string, ok bool) {
	rest, ok := strings.CutPrefix(subject, api.NATSSubject(s.cfg.Root, ""))
	customer, _, _ = strings.Cut(rest, ".")
	return customer, ok && customer != ""
}

// replyAllowed reports whether the service may answer r on the reply
// subject r names. NATS checks the subjects a client publishes to, not
// the reply subject it names, and the service answers on its own
// connection, which may publish anywhere: answering a customer's request
// at a reply it chose would let that customer publish into the log, the
// buckets, the ready queues or another customer's inbox. So with tokens,
// a reply must lie in the inbox of the customer the subject names (the
// only subjects its token may subscribe to; the client's
// nats.CustomInboxPrefix is api.NATSInbox), or, for a request with an
// operator's token, in the operator's or a customer's inbox
// (api.NATSOperatorInbox, api.NATSInbox: those an operator's connection
// may subscribe to): never on a log, ready, KV or JetStream API subject,
// nor in the default inbox "_INBOX.", where an answer could pose as the
// JetStream API's to taskledger's own connections. Without tokens only
// taskledger's own connections reach the server, which are unrestricted
// anyway.
func (s *Service) replyAllowed(r micro.Request) bool {
	if s.cfg.Tokens == nil {
		return true
	}
	token, _ := strings.CutPrefix(nats.Header(r.Headers()).Get(api.NATSAuthHeader), "Bearer ")
	if owner, known := s.cfg.Tokens[token]; known && owner == "*" {
		return isInbox(r.Reply())
	}
	customer, ok := s.customer(r.Subject())
	return ok && strings.HasPrefix(r.Reply(), api.NATSInbox(customer)+".")
}

// isInbox reports whether subject lies in the operator's inbox
// (api.NATSOperatorInbox) or a customer's (api.NATSInbox).
func isInbox(subject string) bool {
	if strings.HasPrefix(subject, api.NATSOperatorInbox+".") {
		return true
	}
	rest, ok := strings.CutPrefix(subject, api.NATSInbox(""))
	customer, tail, dotted := strings.Cut(rest, ".")
	return ok && dotted && tail != "" && events.ValidID(customer) == nil
}

// checkCustomer refuses a request whose subject names another customer
// than its token's (an operator's token may name any). An unknown token
// passes: the handler answers it 401, as over HTTP.
func (s *Service) checkCustomer(subject, auth string) *api.Error {
	if s.cfg.Tokens == nil {
		return nil
	}
	customer, ok := s.customer(subject)
	token, bearer := strings.CutPrefix(auth, "Bearer ")
	owner, known := s.cfg.Tokens[token]
	if !ok || !bearer || !known || owner == "*" || owner == customer {
		return nil
	}
	return api.ErrForbidden.WithMessage(fmt.Sprintf("subject %q is customer %q's; this token is another customer's", subject, customer))
}

// respond sends a as r's reply: the status in api.NATSStatusHeader, the
// handler's headers and its body. An answer too large for a NATS message
// becomes a 500 saying so.
func (s *Service) respond(r micro.Request, a answer) {
	h := micro.Headers{}
	for k, v := range a.header {
		h[k] = v
	}
	h[api.NATSStatusHeader] = []string{strconv.Itoa(a.status)}
	if int64(len(a.body))+4096 > s.cfg.NC.MaxPayload() {
		s.cfg.Logger.Warn().Int("bytes", len(a.body)).Str("subject", r.Subject()).Msg("NATS answer over the max payload; answered 500")
		e := errorAnswer(api.ErrInternal.WithMessage(fmt.Sprintf("the answer (%d bytes) is over the NATS max payload (%d bytes); ask over HTTP", len(a.body), s.cfg.NC.MaxPayload())))
		h = micro.Headers(e.header)
		h[api.NATSStatusHeader] = []string{strconv.Itoa(e.status)}
		a = e
	}
	if err := r.Respond(a.body, micro.WithHeaders(h)); err != nil {
		s.cfg.Logger.Warn().Err(err).Str("subject", r.Subject()).Msg("NATS answer not sent")
	}
}

// recorder is the http.ResponseWriter of a request over NATS: it keeps
// the status, headers and body for the reply.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(p)
}
