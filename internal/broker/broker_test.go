package broker_test

import (
	"net"
	"strings"
	"testing"

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

// TestListen: with Listen, operators connect there without credentials,
// and so does Connect.
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
	for _, connect := range []func() (*nats.Conn, error){
		func() (*nats.Conn, error) { return e.Connect() },
		func() (*nats.Conn, error) { return nats.Connect(e.ClientURL()) },
	} {
		nc, err := connect()
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
	}
}
