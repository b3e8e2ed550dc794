package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
)

// authEnv is an embedded server exposing its client port (Listen) to an
// auth file's tokens, with a log stream on the default subjects holding
// one event of customer b, a KV bucket and an object store, all made by
// taskledger's own connection.
type authEnv struct {
	srv  *broker.Embedded
	own  *nats.Conn
	js   jetstream.JetStream
	subj events.Subjects
}

const (
	stream      = "TASKLEDGER"
	schedToken  = "scheduler-token-0123456789abcdef-0123456789"
	tokA, tokOp = "tok-a", "tok-op"
)

func setupAuth(t *testing.T) *authEnv {
	t.Helper()
	subj := events.DefaultSubjects
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0", Token: schedToken,
		Clients: broker.Clients{Tokens: map[string]string{tokA: "a", "tok-b": "b", tokOp: "*"}, Root: subj.Root}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	own, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	js, err := jetstream.New(own)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// No DenyDelete or DenyPurge: only the permissions may refuse.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: subj.Log(), Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subj.Event("b", "t1"), []byte("b's event")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "LEASES"}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "SNAPSHOTS"}); err != nil {
		t.Fatal(err)
	}
	return &authEnv{srv: srv, own: own, js: js, subj: subj}
}

// intact fails the test unless the log stream still holds exactly its
// one event, and the buckets are still there.
func (e *authEnv) intact(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("the log stream: %v", err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("the log stream holds %d messages, want its 1", n)
	}
	if _, err := e.js.KeyValue(ctx, "LEASES"); err != nil {
		t.Fatalf("KV bucket: %v", err)
	}
	if _, err := e.js.ObjectStore(ctx, "SNAPSHOTS"); err != nil {
		t.Fatalf("object store: %v", err)
	}
}

// client is a connection to the client port with a token and inbox, and
// the permission violations the server reports to it.
type client struct {
	nc         *nats.Conn
	violations chan error
}

func (e *authEnv) connect(t *testing.T, token, inbox string) *client {
	t.Helper()
	c := &client{violations: make(chan error, 16)}
	nc, err := nats.Connect(e.srv.ClientURL(), nats.Token(token), nats.CustomInboxPrefix(inbox), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.violations <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	return c
}

// refused waits for the server's permission violation naming subject.
func (c *client) refused(t *testing.T, what, subject string) {
	t.Helper()
	select {
	case err := <-c.violations:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Fatalf("%s: got %v, want a permission violation for %q", what, err, subject)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s %q: no permission violation", what, subject)
	}
}

// cannotSubscribe subscribes to each subject and waits for the refusal.
func (c *client) cannotSubscribe(t *testing.T, subjects ...string) {
	t.Helper()
	for _, s := range subjects {
		sub, err := c.nc.SubscribeSync(s)
		if err != nil {
			t.Fatal(err)
		}
		c.refused(t, "subscribe", s)
		sub.Unsubscribe()
	}
}

// cannotPublish publishes to each subject and waits for the refusal.
func (c *client) cannotPublish(t *testing.T, subjects ...string) {
	t.Helper()
	for _, s := range subjects {
		if err := c.nc.Publish(s, []byte(`{"forged":true}`)); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "publish", s)
	}
}

// cannotRequest sends each JetStream API request and waits for the
// refusal: no answer comes.
func (c *client) cannotRequest(t *testing.T, subjects ...string) {
	t.Helper()
	for _, s := range subjects {
		if msg, err := c.nc.Request(s, nil, 500*time.Millisecond); err == nil {
			t.Fatalf("request %s answered: %s", s, msg.Data)
		}
		c.refused(t, "publish", s)
	}
}

// forbidden are what neither a customer's nor an operator's token may
// do to the log: publish events, concurrency and schedule events, ready
// notifications and heartbeats, call the JetStream API to read, delete
// or purge a stream, a KV bucket or an object store, and read the
// default inbox.
func (e *authEnv) forbidden(t *testing.T, c *client) {
	t.Helper()
	c.cannotPublish(t,
		e.subj.Event("b", "t1"), e.subj.Event("a", "t2"), e.subj.Key("b", "k"), e.subj.Schedule("b", "s"),
		e.subj.Ready("q"), e.subj.Heartbeats(), e.subj.Root+".probe",
		"$KV.LEASES.p0", "$O.SNAPSHOTS.C.x")
	c.cannotRequest(t,
		"$JS.API.STREAM.DELETE."+stream, "$JS.API.STREAM.PURGE."+stream, "$JS.API.STREAM.INFO."+stream,
		"$JS.API.STREAM.MSG.DELETE."+stream, "$JS.API.STREAM.UPDATE."+stream, "$JS.API.DIRECT.GET."+stream,
		"$JS.API.STREAM.MSG.GET."+stream, "$JS.API.CONSUMER.CREATE."+stream, "$JS.API.STREAM.CREATE.FORGED",
		"$JS.API.STREAM.DELETE.KV_LEASES", "$JS.API.STREAM.PURGE.OBJ_SNAPSHOTS", "$JS.API.STREAM.LIST")
	// Nor read the default inbox, where taskledger's own connections get
	// the JetStream API's answers (events read by direct get among them).
	c.cannotSubscribe(t, e.subj.Events(), e.subj.Customer("b"), e.subj.AllReady(), e.subj.Heartbeats(),
		"$JS.>", "$KV.>", "$O.>", "$SYS.>", ">", api.NATSSubject(e.subj.Root, "b")+".>", "_INBOX.>")
	e.intact(t)
}

// TestNoAnonymousClient: the client port refuses a connection without a
// token, with an unknown one, and with an empty one; without Clients it
// refuses every token but taskledger's own.
func TestNoAnonymousClient(t *testing.T) {
	t.Parallel()
	e := setupAuth(t)
	for _, opts := range [][]nats.Option{nil, {nats.Token("guess")}, {nats.UserInfo("taskledger", "")}} {
		if nc, err := nats.Connect(e.srv.ClientURL(), append(opts, nats.MaxReconnects(0))...); err == nil {
			nc.Close()
			t.Fatalf("connection with %d options admitted", len(opts))
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connection: %v, want an authorization violation", err)
		}
	}

	bare, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0", Token: schedToken})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bare.Shutdown)
	if nc, err := nats.Connect(bare.ClientURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a connection without a token was admitted without Clients")
	}
	nc, err := nats.Connect(bare.ClientURL(), nats.Token(schedToken))
	if err != nil {
		t.Fatalf("taskledger's own token: %v", err)
	}
	nc.Close()

	if _, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Token: "short"}); err == nil {
		t.Fatal("a short Token was accepted")
	}
}

// TestCustomerToken: a customer's token (an executor's, or a stolen one)
// can neither read another tenant's events or answers, nor publish to
// any log subject, nor use the JetStream API; it can publish its own API
// requests and read its own inbox.
func TestCustomerToken(t *testing.T) {
	t.Parallel()
	e := setupAuth(t)
	a := e.connect(t, tokA, api.NATSInbox("a"))
	e.forbidden(t, a)
	a.cannotSubscribe(t, e.subj.Customer("a"), api.NATSInbox("b")+".>", api.NATSOperatorInbox+".>")
	a.cannotPublish(t, api.NATSSubject(e.subj.Root, "b")+".req")

	// Its own request is delivered, and the answer reaches its inbox.
	served, err := e.own.Subscribe(api.NATSSubject(e.subj.Root, "*")+".>", func(m *nats.Msg) { m.Respond([]byte("ok")) })
	if err != nil {
		t.Fatal(err)
	}
	defer served.Unsubscribe()
	if err := e.own.Flush(); err != nil {
		t.Fatal(err)
	}
	if msg, err := a.nc.Request(api.NATSSubject(e.subj.Root, "a")+".req", []byte("{}"), 5*time.Second); err != nil || string(msg.Data) != "ok" {
		t.Fatalf("a's own API request: %v", err)
	}
}

// TestOperatorToken: an operator's token may send the API requests of
// every customer and read its inbox, but not touch the log nor use the
// JetStream API, nor read the requests (they carry customers' tokens).
func TestOperatorToken(t *testing.T) {
	t.Parallel()
	e := setupAuth(t)
	op := e.connect(t, tokOp, api.NATSOperatorInbox)
	e.forbidden(t, op)

	served, err := e.own.Subscribe(api.NATSSubject(e.subj.Root, "*")+".>", func(m *nats.Msg) { m.Respond([]byte("ok")) })
	if err != nil {
		t.Fatal(err)
	}
	defer served.Unsubscribe()
	if err := e.own.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ customer, inbox string }{{"a", api.NATSOperatorInbox}, {"b", api.NATSOperatorInbox}, {"b", api.NATSInbox("b")}} {
		op := e.connect(t, tokOp, c.inbox)
		if msg, err := op.nc.Request(api.NATSSubject(e.subj.Root, c.customer)+".req", []byte("{}"), 5*time.Second); err != nil || string(msg.Data) != "ok" {
			t.Fatalf("operator's API request for %s with inbox %s: %v", c.customer, c.inbox, err)
		}
	}
}

// TestOwnToken: taskledger's own token, generated or given, has every
// right: it may delete the log's stream (so only it can).
func TestOwnToken(t *testing.T) {
	t.Parallel()
	e := setupAuth(t)
	nc, err := nats.Connect(e.srv.ClientURL(), nats.Token(schedToken))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, stream); err != nil {
		t.Fatalf("taskledger's own token deleting the stream: %v", err)
	}
	if _, err := e.js.Stream(ctx, stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream after delete: %v", err)
	}
}
