package natsapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/natsapi"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// tokens is the auth file of every test's server.
var tokens = map[string]string{"tok-acme": "acme", "tok-beta": "beta", "tok-op": "*"}

// env is a scheduler on an embedded server whose client port admits the
// auth file's tokens (as serve --auth-file --nats-listen), serving the
// API over HTTP and over NATS.
type env struct {
	srv  *broker.Embedded
	node *testnode.Node
	root string
	seen *patterns
}

// patterns records the routes the handler served to requests over NATS.
type patterns struct {
	mu   sync.Mutex
	seen map[string]int
}

func (p *patterns) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if r.RemoteAddr == "nats" {
			p.mu.Lock()
			p.seen[r.Pattern]++
			p.mu.Unlock()
		}
	})
}

func (p *patterns) count(pattern string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[pattern]
}

func setup(t *testing.T) *env {
	t.Helper()
	ns := testnats.NewNamespace(t)
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0",
		Clients: broker.Clients{Tokens: tokens, Root: ns.Subjects.Root}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	apiConn, err := srv.Connect() // as serve does: the API on a socket of its own
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(apiConn.Close)
	seen := &patterns{seen: map[string]int{}}
	n := testnode.Start(t, testnode.On(nc, ns), func(c *node.Config) {
		c.Tokens, c.Durable, c.Middleware, c.NATSAPIConn = tokens, srv, seen.wrap, apiConn
	})
	e := &env{srv: srv, node: n, root: ns.Subjects.Root, seen: seen}
	// The node subscribes once it runs: wait until it answers an
	// operator's connection.
	op, err := api.ConnectNATS(srv.ClientURL(), "*", "tok-op")
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	c := api.NewNATSClient(op, e.root, "op", "tok-op")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := c.Get(context.Background(), "none")
		if errors.Is(err, api.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API over NATS does not answer: %v", err)
		}
	}
	return e
}

// connect opens a connection to the client port as customer with token.
func (e *env) connect(t *testing.T, customer, token string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := api.ConnectNATS(e.srv.ClientURL(), customer, token, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// text is a one-part text message.
func text(s string) events.Message {
	return events.Message{Content: []events.ContentPart{{Type: "text", Text: s}}}
}

func (e *env) http(token string) *api.Client { return api.NewClient(e.node.URL, token) }

// TestWorkerOverNATS: a worker built on executor/ with only a NATS URL
// and a token claims, heartbeats, saves its Run, reports an effect and its
// result, every call a NATS request; no HTTP URL is given to it.
func TestWorkerOverNATS(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := e.connect(t, "acme", "tok-acme")
	client := api.NewNATSClient(nc, e.root, "acme", "tok-acme")
	w, err := executor.NewWorker(executor.WorkerConfig{
		API: client, Queue: "nq", ExecutorID: "nats-worker", HeartbeatSeconds: 3, PollWait: 5 * time.Second,
		CheckInterval: 500 * time.Millisecond, Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	}, func(ctx context.Context, run *executor.Run) (string, error) {
		if _, err := run.SaveContext(ctx, "input", map[string]string{"seen": run.Task.ID}); err != nil {
			return "", err
		}
		if _, err := run.Effect(ctx, "pr", func(context.Context) (events.Effect, error) {
			return events.Effect{Kind: "pull_request", Ref: "pr-1"}, nil
		}, nil); err != nil {
			return "", err
		}
		select { // a heartbeat every second
		case <-time.After(2500 * time.Millisecond):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return "done over NATS", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()

	h := e.http("tok-acme")
	task, _, err := h.Schedule(ctx, api.ScheduleRequest{Queue: "nq", Message: text("work")})
	if err != nil {
		t.Fatal(err)
	}
	for task.Status != api.StatusSucceeded {
		if ctx.Err() != nil || task.Status == api.StatusFailed {
			t.Fatalf("task %s is %s, want succeeded", task.ID, task.Status)
		}
		time.Sleep(50 * time.Millisecond)
		if task, err = h.Get(ctx, task.ID); err != nil {
			t.Fatal(err)
		}
	}
	if task.Result == nil || task.Result.Summary != "done over NATS" {
		t.Fatalf("result %+v, want the worker's summary", task.Result)
	}
	if len(task.Effects) != 1 || task.Effects[0].Ref != "pr-1" {
		t.Fatalf("effects %+v, want pr-1", task.Effects)
	}
	doc, err := h.GetRun(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := doc.Run.Contexts["input"]; !ok || !strings.Contains(string(c.Value), task.ID) {
		t.Fatalf("Run contexts %+v, want input naming the task", doc.Run.Contexts)
	}
	// The route is counted once its handler returned, which can be after
	// the result's event was applied and read above.
	testnode.Eventually(t, "the result counted", func() bool { return e.seen.count("POST /v1/tasks/{id}/result") > 0 })
	for _, p := range []string{"POST /v1/tasks/{id}/heartbeat", "PUT /v1/tasks/{id}/run", "POST /v1/tasks/{id}/effects",
		"POST /v1/tasks/{id}/result", "POST /v1/tasks/{id}/check"} {
		if e.seen.count(p) == 0 {
			t.Errorf("no %s over NATS; served: %v", p, e.seen.seen)
		}
	}
	if e.seen.count("POST /v1/claims/next")+e.seen.count("POST /v1/claims") == 0 {
		t.Errorf("no claim over NATS; served: %v", e.seen.seen)
	}
}

// violations collects a connection's asynchronous errors: the server's
// permission violations.
type violations chan error

func (v violations) option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case v <- err:
		default:
		}
	})
}

// want waits for a permission violation naming subject.
func (v violations) want(t *testing.T, what, subject string) {
	t.Helper()
	select {
	case err := <-v:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Fatalf("%s: got %v, want a permission violation for %s", what, err, subject)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no permission violation for %s", what, subject)
	}
}

// TestCustomerConfinement: a customer's token may publish only its own
// requests and subscribe only to its own inbox; a connection without a
// known token is refused; an operator's token may do more.
func TestCustomerConfinement(t *testing.T) {
	e := setup(t)
	for _, token := range []string{"", "wrong"} {
		if nc, err := nats.Connect(e.srv.ClientURL(), nats.Token(token)); err == nil {
			nc.Close()
			t.Fatalf("connection with token %q admitted", token)
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connection with token %q: %v, want an authorization violation", token, err)
		}
	}

	v := make(violations, 8)
	nc := e.connect(t, "acme", "tok-acme", v.option())
	for _, subject := range []string{
		api.NATSSubject(e.root, "beta") + ".req", // another customer's requests
		"$JS.API.STREAM.LIST",                    // the JetStream API
		e.root + ".evt.x",                        // the log
		api.NATSInbox("beta") + ".x",             // another customer's inbox
	} {
		if err := nc.Publish(subject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		v.want(t, "publish", subject)
	}
	for _, subject := range []string{
		api.NATSInbox("beta") + ".>",           // another customer's answers
		api.NATSSubject(e.root, "beta") + ".>", // another customer's requests
		api.NATSSubject(e.root, "acme") + ".>", // even its own: only the scheduler serves them
		">",
	} {
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		v.want(t, "subscribe", subject)
		sub.Unsubscribe()
	}

	// Its own subject with another customer's token: 403, as the subject
	// is not the token's.
	msg := apiMsg(e.root, "acme", ".req", http.MethodGet, "/v1/tasks", "tok-beta")
	reply, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := reply.Header.Get(api.NATSStatusHeader); got != "403" {
		t.Fatalf("another customer's token on acme's subject: status %s %s, want 403", got, reply.Data)
	}
	// A task of beta is not found by acme over NATS, as over HTTP.
	bt, _, err := e.http("tok-beta").Schedule(context.Background(), api.ScheduleRequest{Queue: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.NewNATSClient(nc, e.root, "acme", "tok-acme").Get(context.Background(), bt.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("acme reading beta's task over NATS: %v, want not found", err)
	}

	// The operator may not subscribe to the requests (they carry the
	// customers' tokens), nor touch the log, but may send any customer's
	// requests from its own inbox.
	ov := make(violations, 4)
	opConn, err := api.ConnectNATS(e.srv.ClientURL(), "*", "tok-op", ov.option())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(opConn.Close)
	for _, subject := range []string{api.NATSSubject(e.root, "*") + ".>", e.root + ".evt.>"} {
		sub, err := opConn.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		ov.want(t, "operator subscribe", subject)
		sub.Unsubscribe()
	}
	if err := opConn.Publish(e.root+".evt.beta."+bt.ID, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	ov.want(t, "operator publish", e.root+".evt.beta."+bt.ID)
	got, err := api.NewNATSClient(opConn, e.root, "beta", "tok-op").Get(context.Background(), bt.ID)
	if err != nil || got.ID != bt.ID {
		t.Fatalf("operator reading beta's task over NATS: %+v %v", got, err)
	}
}

// raw is one answer, over either transport.
type raw struct {
	status int
	body   string
}

// viaHTTP sends method path body with token over HTTP.
func (e *env) viaHTTP(t *testing.T, token, method, path string, body []byte) raw {
	t.Helper()
	req, err := http.NewRequest(method, e.node.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if len(body) > 0 { // as the API over NATS does for a body
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return raw{resp.StatusCode, string(data)}
}

// viaNATS sends the same request over nc, on customer's subject.
func (e *env) viaNATS(t *testing.T, nc *nats.Conn, customer, token, method, path string, body []byte) raw {
	t.Helper()
	msg := apiMsg(e.root, customer, ".req", method, path, token)
	msg.Data = body
	reply, err := nc.RequestMsg(msg, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	status, err := strconv.Atoi(reply.Header.Get(api.NATSStatusHeader))
	if err != nil {
		t.Fatalf("answer without a status: %v", reply.Header)
	}
	return raw{status, string(reply.Data)}
}

// TestSameAnswers: bad inputs answer over NATS with HTTP's status and
// body, byte for byte.
func TestSameAnswers(t *testing.T) {
	e := setup(t)
	nc := e.connect(t, "acme", "tok-acme")
	big := `{"queue":"q","message":{"content":[{"type":"text","text":"` + strings.Repeat("x", events.MaxPayloadBytes+1) + `"}]}}`
	for _, c := range []struct {
		name, token, method, path, body string
		status                          int
	}{
		{"unknown task", "tok-acme", http.MethodGet, "/v1/tasks/nope", "", http.StatusNotFound},
		{"bad JSON", "tok-acme", http.MethodPost, "/v1/tasks", `{"queue":`, http.StatusBadRequest},
		{"bad wait", "tok-acme", http.MethodPost, "/v1/claims/next", `{"queue":"q","waitSeconds":-1}`, http.StatusBadRequest},
		{"too large a message", "tok-acme", http.MethodPost, "/v1/tasks", big, 0},
		{"bad id", "tok-acme", http.MethodGet, "/v1/tasks/a%20b", "", http.StatusBadRequest},
		{"no token", "", http.MethodGet, "/v1/tasks", "", http.StatusUnauthorized},
		{"no route", "tok-acme", http.MethodGet, "/v1/nothing", "", http.StatusNotFound},
		{"operator only", "tok-acme", http.MethodPost, "/v1/admin/projections/rebuild", "", 0},
		{"result without claim", "tok-acme", http.MethodPost, "/v1/tasks/nope/result", `{"deliveryId":"d","success":true}`, http.StatusNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := e.viaHTTP(t, c.token, c.method, c.path, []byte(c.body))
			n := e.viaNATS(t, nc, "acme", c.token, c.method, c.path, []byte(c.body))
			if h != n {
				t.Fatalf("HTTP answered %d %s\nNATS answered %d %s", h.status, h.body, n.status, n.body)
			}
			if c.status != 0 && h.status != c.status || h.status < 400 {
				t.Fatalf("status %d %s, want %d", h.status, h.body, c.status)
			}
		})
	}

	// A body over the connection's max payload is refused by the client
	// without sending it, as 413.
	client := api.NewNATSClient(nc, e.root, "acme", "tok-acme")
	_, err := client.ScheduleBatch(context.Background(), []api.ScheduleRequest{{Queue: "q", Message: text(strings.Repeat("y", int(nc.MaxPayload())))}})
	if !errors.Is(err, api.ErrPayloadTooLarge) {
		t.Fatalf("batch over the max payload: %v, want payload_too_large", err)
	}
	// An event stream is HTTP only: the client says so without asking,
	// the server answers 400.
	if err := client.StreamRun(context.Background(), "x", 0, func(api.RunStreamItem) error { return nil }); !errors.Is(err, api.ErrHTTPOnly) {
		t.Fatalf("StreamRun over NATS: %v, want ErrHTTPOnly", err)
	}
	if n := e.viaNATS(t, nc, "acme", "tok-acme", http.MethodGet, "/v1/events/stream", nil); n.status != http.StatusBadRequest {
		t.Fatalf("event stream over NATS: %d %s, want 400", n.status, n.body)
	}
}

// TestLongPollAndDurability: a claims/next long poll over NATS waits
// until a task arrives and answers then; the answers to writes over NATS
// wait for the group commit, as over HTTP.
func TestLongPollAndDurability(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := e.connect(t, "acme", "tok-acme")
	client := api.NewNATSClient(nc, e.root, "acme", "tok-acme")
	type claimed struct {
		task api.Task
		ok   bool
		err  error
		took time.Duration
	}
	got := make(chan claimed, 1)
	start := time.Now()
	go func() {
		task, ok, err := client.ClaimNext(ctx, "lp", "poller", 20*time.Second)
		got <- claimed{task, ok, err, time.Since(start)}
	}()
	time.Sleep(700 * time.Millisecond)
	before := e.srv.CommitStats().Callers
	task, _, err := client.Schedule(ctx, api.ScheduleRequest{Queue: "lp", Message: text("wake")})
	if err != nil {
		t.Fatal(err)
	}
	if after := e.srv.CommitStats().Callers; after <= before {
		t.Fatalf("group commit callers %d → %d: the schedule over NATS did not wait for the fsync", before, after)
	}
	c := <-got
	if c.err != nil || !c.ok || c.task.ID != task.ID {
		t.Fatalf("long poll: %+v, want task %s", c, task.ID)
	}
	if c.took < 600*time.Millisecond || c.took > 15*time.Second {
		t.Fatalf("long poll answered after %s, want once the task arrived (~0.7 s)", c.took)
	}
	// Nothing ready: the long poll answers empty at its wait.
	t0 := time.Now()
	if _, ok, err := client.ClaimNext(ctx, "lp", "poller", time.Second); err != nil || ok {
		t.Fatalf("empty long poll: ok %v, %v", ok, err)
	}
	if took := time.Since(t0); took < 900*time.Millisecond {
		t.Fatalf("empty long poll answered after %s, want its 1 s wait", took)
	}
}

// TestCanceledPollClaimsNothing: a long poll whose caller gave up is
// ended on the server too, so a task that arrives afterwards is not
// claimed for a caller that is gone (as a closed HTTP connection ends
// its request).
func TestCanceledPollClaimsNothing(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := e.connect(t, "acme", "tok-acme")
	client := api.NewNATSClient(nc, e.root, "acme", "tok-acme")
	pollCtx, giveUp := context.WithTimeout(ctx, 500*time.Millisecond)
	defer giveUp()
	if _, ok, err := client.ClaimNext(pollCtx, "gone", "quitter", 20*time.Second); ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("poll given up: ok %v, %v; want the context's deadline", ok, err)
	}
	time.Sleep(200 * time.Millisecond) // the cancellation's way to the server
	task, _, err := client.Schedule(ctx, api.ScheduleRequest{Queue: "gone", Message: text("late")})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if task, err = client.Get(ctx, task.ID); err != nil {
		t.Fatal(err)
	}
	if task.Claim != nil {
		t.Fatalf("task claimed by %s after its poll was given up", task.Claim.ExecutorID)
	}
	got, ok, err := client.ClaimNext(ctx, "gone", "keeper", 5*time.Second)
	if err != nil || !ok || got.ID != task.ID {
		t.Fatalf("fresh poll: %v %v %v, want task %s", got.ID, ok, err, task.ID)
	}
}

// TestMaxRequests: past MaxRequests requests in progress (long polls
// included) a request is answered 503 with Retry-After at once; the
// handler's status, headers and body come back as it wrote them.
func TestMaxRequests(t *testing.T) {
	nc := testnats.Conn(t)
	ns := testnats.NewNamespace(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	svc, err := natsapi.New(natsapi.Config{NC: nc, Root: ns.Subjects.Root, MaxRequests: 1, MaxBytes: 64,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/hold":
				entered <- struct{}{}
				<-release
			case "/huge":
				w.Write(make([]byte, nc.MaxPayload()))
				return
			case "/panic":
				panic("a handler bug")
			}
			w.Header().Set("X-Echo", r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization"))
			w.WriteHeader(http.StatusTeapot)
			w.Write([]byte("body"))
		})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(ctx) }()
	defer func() { stop(); <-ran }()
	request := func(path string) *nats.Msg {
		msg := apiMsg(ns.Subjects.Root, "c", ".req", http.MethodPost, path, "x")
		var reply *nats.Msg
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // until subscribed
			if reply, err = nc.RequestMsg(msg, 10*time.Second); !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	if got := request("/echo?a=1"); got.Header.Get(api.NATSStatusHeader) != "418" || got.Header.Get("X-Echo") != "POST /echo?a=1 Bearer x" || string(got.Data) != "body" {
		t.Fatalf("echo: %v %q", got.Header, got.Data)
	}
	big := apiMsg(ns.Subjects.Root, "c", ".req", http.MethodPost, "/echo", "")
	big.Data = make([]byte, 65)
	if got, err := nc.RequestMsg(big, 10*time.Second); err != nil || got.Header.Get(api.NATSStatusHeader) != "503" || !strings.Contains(string(got.Data), "64 bytes") {
		t.Fatalf("a body past MaxBytes: %v %v, want 503 saying so", got, err)
	}
	if got := request("/panic"); got.Header.Get(api.NATSStatusHeader) != "500" || !strings.Contains(string(got.Data), `"internal"`) {
		t.Fatalf("a handler's panic: %v %q, want 500 (and the process alive)", got.Header, got.Data)
	}
	if got := request("/huge"); got.Header.Get(api.NATSStatusHeader) != "500" || !strings.Contains(string(got.Data), "max payload") {
		t.Fatalf("answer over the max payload: %v %q, want 500 saying so", got.Header, got.Data)
	}
	held := make(chan *nats.Msg, 1)
	go func() {
		for {
			// The request before it answers before its slot is free: a
			// 503 here is that slot, not yet this test's.
			if got := request("/hold"); got.Header.Get(api.NATSStatusHeader) != "503" {
				held <- got
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	<-entered
	if got := request("/echo"); got.Header.Get(api.NATSStatusHeader) != "503" || got.Header.Get("Retry-After") != "1" || !strings.Contains(string(got.Data), `"unavailable"`) {
		t.Fatalf("past MaxRequests: %v %q, want 503 with Retry-After", got.Header, got.Data)
	}
	close(release)
	if got := <-held; got.Header.Get(api.NATSStatusHeader) != "418" {
		t.Fatalf("held request: %v", got.Header)
	}
	long := apiMsg(ns.Subjects.Root, "c", ".req", http.MethodGet, "/"+strings.Repeat("a", natsapi.MaxHeaderBytes), "")
	if got, err := nc.RequestMsg(long, 10*time.Second); err != nil || got.Header.Get(api.NATSStatusHeader) != "431" {
		t.Fatalf("long path: %v %v, want 431", got, err)
	}
	msg := apiMsg(ns.Subjects.Root, "c", ".req", "PATCH", "/x", "")
	if got, err := nc.RequestMsg(msg, 10*time.Second); err != nil || got.Header.Get(api.NATSStatusHeader) != "400" {
		t.Fatalf("method PATCH: %v %v, want 400", got, err)
	}
}

// TestQueueGroup: every process of a stream serves the API over NATS,
// each request answered by one of them.
func TestQueueGroup(t *testing.T) {
	e := setup(t)
	nc, err := e.srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	second := &patterns{seen: map[string]int{}}
	testnode.Start(t, testnode.On(nc, e.node.NS), func(c *node.Config) {
		c.Tokens, c.Durable, c.Middleware, c.Name = tokens, e.srv, second.wrap, "second"
	})
	client := api.NewNATSClient(e.connect(t, "acme", "tok-acme"), e.root, "acme", "tok-acme")
	const pattern = "GET /v1/tasks/{id}"
	before := e.seen.count(pattern) // setup's
	requests := 0
	for second.count(pattern) == 0 || e.seen.count(pattern) == before {
		if requests == 200 {
			t.Fatalf("200 requests: first process served %d, second %d; want both some", e.seen.count(pattern)-before, second.count(pattern))
		}
		if _, err := client.Get(context.Background(), "none"); !errors.Is(err, api.ErrNotFound) {
			t.Fatal(err)
		}
		requests++
	}
	time.Sleep(100 * time.Millisecond) // a second answer to one request would be counted by now
	if n := e.seen.count(pattern) - before + second.count(pattern); n != requests {
		t.Fatalf("%d requests served %d times, want each once", requests, n)
	}
}

// TestShutdownFinishesRequests: once Run's context ends, a request in
// progress still finishes and is answered before Run returns.
func TestShutdownFinishesRequests(t *testing.T) {
	nc := testnats.Conn(t)
	ns := testnats.NewNamespace(t)
	entered, release := make(chan struct{}), make(chan struct{})
	svc, err := natsapi.New(natsapi.Config{NC: nc, Root: ns.Subjects.Root,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			select {
			case <-release:
				w.WriteHeader(http.StatusCreated)
			case <-r.Context().Done(): // cut short
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(ctx) }()
	answered := make(chan string, 1)
	go func() {
		msg := apiMsg(ns.Subjects.Root, "c", ".req", http.MethodPost, "/x", "")
		for {
			reply, err := nc.RequestMsg(msg, 10*time.Second)
			if errors.Is(err, nats.ErrNoResponders) { // not subscribed yet
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if err != nil {
				answered <- err.Error()
				return
			}
			answered <- reply.Header.Get(api.NATSStatusHeader)
			return
		}
	}()
	<-entered
	stop()
	select {
	case err := <-ran:
		t.Fatalf("Run returned (%v) with a request in progress", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if got := <-answered; got != "201" {
		t.Fatalf("request in progress at shutdown: %s, want its 201", got)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

// TestReplyConfined: a customer's request naming a reply subject outside
// its own inbox gets no answer there — the service answers on its own,
// unrestricted connection, so an answer to a chosen reply would let the
// customer publish into the log, a bucket or another customer's inbox.
// The same request with a reply in its own inbox is answered.
func TestReplyConfined(t *testing.T) {
	e := setup(t)
	watch, err := e.srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	targets := []string{
		e.root + ".evt.beta.task_y",    // another customer's task subject in the log
		"$KV." + e.root + "_META.x",    // a bucket
		api.NATSInbox("beta") + ".r1",  // another customer's inbox
		"$JS.API.STREAM.PURGE.ANY",     // the JetStream API
		api.NATSInbox("acme") + "x.r1", // a prefix of acme's inbox without its dot
		"_INBOXx.r1",                   // no inbox: the default's prefix without its dot
		"_INBOX_.r1",                   // no inbox: a customer's without the customer
		"_INBOX.r1",                    // the default inbox: taskledger's own JetStream answers
	}
	got := make(chan string, len(targets))
	for _, target := range targets {
		if _, err := watch.Subscribe(target, func(m *nats.Msg) { got <- m.Subject }); err != nil {
			t.Fatal(err)
		}
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := e.connect(t, "acme", "tok-acme")
	own := api.NATSInbox("acme") + ".own"
	answered, err := nc.SubscribeSync(own)
	if err != nil {
		t.Fatal(err)
	}
	request := func(reply string) {
		msg := apiMsg(e.root, "acme", ".get", http.MethodGet, "/v1/tasks/none", "tok-acme")
		msg.Reply = reply
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	for _, target := range targets {
		request(target)
	}
	request(own)
	if _, err := answered.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("no answer in acme's own inbox: %v", err)
	}
	select {
	case subject := <-got:
		t.Fatalf("the service answered acme's request at %s", subject)
	case <-time.After(300 * time.Millisecond):
	}

	// An operator's request may name its own inbox or a customer's (its
	// token may read them), but no other subject, not even the default
	// inbox.
	op, err := nats.Connect(e.srv.ClientURL(), nats.Token("tok-op"), nats.CustomInboxPrefix(api.NATSOperatorInbox))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Close)
	opAnswered, err := op.SubscribeSync(api.NATSOperatorInbox + ".own")
	if err != nil {
		t.Fatal(err)
	}
	for _, reply := range []string{targets[0], targets[1], targets[3], targets[5], targets[6], targets[7]} {
		msg := apiMsg(e.root, "acme", ".get", http.MethodGet, "/v1/tasks/none", "tok-op")
		msg.Reply = reply
		if err := op.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	msg := apiMsg(e.root, "acme", ".get", http.MethodGet, "/v1/tasks/none", "tok-op")
	msg.Reply = api.NATSOperatorInbox + ".own"
	if err := op.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := opAnswered.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("no answer in the operator's inbox: %v", err)
	}
	select {
	case subject := <-got:
		t.Fatalf("the service answered the operator's request at %s", subject)
	case <-time.After(300 * time.Millisecond):
	}
}

// apiMsg is a request of the API over NATS: on customer's subject under
// root (its last token suffix), with the method, path and, unless empty,
// the bearer token.
func apiMsg(root, customer, suffix, method, path, token string) *nats.Msg {
	msg := nats.NewMsg(api.NATSSubject(root, customer) + suffix)
	msg.Header.Set(api.NATSMethodHeader, method)
	msg.Header.Set(api.NATSPathHeader, path)
	if token != "" {
		msg.Header.Set(api.NATSAuthHeader, "Bearer "+token)
	}
	return msg
}
