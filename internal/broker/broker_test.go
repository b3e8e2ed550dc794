package broker_test

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/taskledger/taskledger/internal/broker"
)

// TestPrivateListener: without Listen the embedded server still listens,
// on loopback only, and takes only the connections Connect makes.
func TestPrivateListener(t *testing.T) {
	t.Parallel()
	e, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	if u := e.ClientURL(); u != "" {
		t.Fatalf("ClientURL %q, want none for the private listener", u)
	}
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	host, _, err := net.SplitHostPort(nc.ConnectedAddr())
	if err != nil || !net.ParseIP(host).IsLoopback() {
		t.Fatalf("connected to %q (%v), want a loopback address", nc.ConnectedAddr(), err)
	}
	if _, err := nats.Connect(nc.ConnectedUrl(), nats.MaxReconnects(0)); err == nil || !strings.Contains(err.Error(), "Authorization") {
		t.Fatalf("a connection without the token: %v, want an authorization error", err)
	}
	if _, err := nats.Connect(nc.ConnectedUrl(), nats.Token("guess"), nats.MaxReconnects(0)); err == nil {
		t.Fatal("a connection with a wrong token was accepted")
	}
}

// TestListen: with Listen, the port is the one asked for (a random one
// for port 0), Connect reaches it, and a connection without credentials
// is refused there (TestNoAnonymousClient has the rest).
func TestListen(t *testing.T) {
	t.Parallel()
	e, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	if u := e.ClientURL(); u == "" || strings.HasSuffix(u, ":4222") {
		t.Fatalf("ClientURL %q with Listen 127.0.0.1:0, want a random port", e.ClientURL())
	}
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if nc, err := nats.Connect(e.ClientURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was admitted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a connection without credentials: %v, want an authorization violation", err)
	}
}

// TestClientTokens: with Listen and Clients, only the auth file's tokens
// connect there, each confined to the API subjects (auth_test.go has
// the rest); without Listen the tokens are refused (the private listener
// takes only the server's own).
func TestClientTokens(t *testing.T) {
	t.Parallel()
	clients := broker.Clients{Tokens: map[string]string{"tok-a": "a", "tok-op": "*"}, Root: "tl"}
	private, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(private.Shutdown)
	own, err := private.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if nc, err := nats.Connect(own.ConnectedUrl(), nats.Token("tok-op"), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("an auth-file token connected to the private listener")
	}

	e, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir(), Listen: "127.0.0.1:0", Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	for _, token := range []string{"", "tok-b"} {
		if nc, err := nats.Connect(e.ClientURL(), nats.Token(token), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Fatalf("token %q connected", token)
		}
	}
	violations := make(chan error, 4)
	onErr := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err })
	for _, token := range []string{"tok-a", "tok-op"} {
		nc, err := nats.Connect(e.ClientURL(), nats.Token(token), onErr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.SubscribeSync("$JS.API.>"); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("%s subscribing to the JetStream API: %v", token, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s subscribed to the JetStream API", token)
		}
		nc.Close()
	}
	if p := broker.CustomerPermissions("tl", "a"); p.Publish.Allow[0] != "tl.api.a.>" || p.Subscribe.Allow[0] != "_INBOX_a.>" {
		t.Fatalf("permissions %+v %+v", p.Publish, p.Subscribe)
	}
}
