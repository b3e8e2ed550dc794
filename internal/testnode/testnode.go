// Package testnode runs a whole scheduler node in a test: on a fresh
// namespace of the package's embedded NATS server (internal/testnats),
// with its API served over real HTTP.
package testnode

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
)

// Node is a running scheduler with an HTTP client for its API.
type Node struct {
	*node.Node
	NS     testnats.Namespace
	NC     *nats.Conn
	Client *api.Client
	URL    string
	// Stop stops the HTTP server and the node and waits for them. It is
	// idempotent and also runs when the test ends.
	Stop func()
}

// Option changes the node's configuration before it starts.
type Option func(*node.Config)

// On runs the node on nc and ns instead of a new connection and namespace,
// to restart a node on a log an earlier one wrote. A nil nc or a zero ns
// keeps the fresh one.
func On(nc *nats.Conn, ns testnats.Namespace) Option {
	return func(c *node.Config) {
		if nc != nil {
			c.NC = nc
		}
		if ns.Stream != "" {
			c.Stream, c.ReadyStream, c.Subjects = ns.Stream, ns.ReadyStream, ns.Subjects
		}
	}
}

// Start runs a node on a fresh namespace (or the one an Option sets on
// cfg.Stream etc.), serves its API and waits until its projections have
// caught up. Its log goes to the test's log at warn level unless an
// Option sets a Logger. Its answers wait for the package server's group
// commit, as serve's do by default (--durability fsync).
func Start(t testing.TB, opts ...Option) *Node {
	t.Helper()
	ns := testnats.NewNamespace(t)
	cfg := node.Config{
		NC: testnats.Conn(t), Stream: ns.Stream, ReadyStream: ns.ReadyStream, Subjects: ns.Subjects,
		Logger:  zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		Durable: testnats.Server(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	ns = testnats.Namespace{Stream: cfg.Stream, ReadyStream: cfg.ReadyStream, Subjects: cfg.Subjects}
	// Generous: on a loaded machine creating streams can take longer than
	// JetStream's default 5s API timeout.
	openCtx, cancelOpen := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelOpen()
	n, err := node.New(openCtx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	// The node's own server, with its limits, on a loopback port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- n.Server.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	client := api.NewClient(url, "")
	var once sync.Once
	stop := func() {
		once.Do(func() {
			n.Server.Close()
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("HTTP server stopped with %v", err)
			}
			client.HTTP.CloseIdleConnections()
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("node stopped with %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-n.Engine.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the node's projections to catch up")
	}
	return &Node{Node: n, NS: ns, NC: cfg.NC, Client: client, URL: url, Stop: stop}
}

// Eventually polls cond until it holds, failing the test after 30s.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
