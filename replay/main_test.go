package replay_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// logBuffer collects a node's JSON log lines; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// running is a scheduler node running on a namespace of the package's
// NATS server.
type running struct {
	node *node.Node
	ns   testnats.Namespace
	nc   *nats.Conn
	log  *logBuffer // info-level JSON log of the node
	stop func()     // stops the node and waits; idempotent
}

// startNode runs a node on ns (a fresh namespace when ns is zero) with
// snapshots on, and waits until its projections have caught up.
func startNode(t *testing.T, nc *nats.Conn, ns testnats.Namespace, cfgs ...func(*node.Config)) *running {
	t.Helper()
	if ns.Stream == "" {
		ns = testnats.NewNamespace(t)
	}
	if nc == nil {
		nc = testnats.Conn(t)
	}
	logs := &logBuffer{}
	cfg := node.Config{
		NC: nc, Stream: ns.Stream, ReadyStream: ns.ReadyStream, Subjects: ns.Subjects,
		Logger: zerolog.New(logs).Level(zerolog.InfoLevel),
	}
	for _, f := range cfgs {
		f(&cfg)
	}
	n, err := node.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("node stopped with %v", err)
			}
		})
	}
	t.Cleanup(stop)
	eventually(t, "node caught up", func() bool { return n.Engine.CaughtUp() })
	return &running{node: n, ns: ns, nc: nc, log: logs, stop: stop}
}

// eventually polls cond until it holds, failing the test after 30s.
var eventually = testnode.Eventually

// streamState returns the stream's message count and last sequence now.
func streamState(t testing.TB, js jetstream.JetStream, stream string) (msgs, last uint64) {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs, info.State.LastSeq
}

// readAll returns every message of the stream with its event decoded (nil
// Data for an undecodable one).
func readAll(t testing.TB, js jetstream.JetStream, stream string) ([]replay.Message, []events.Event) {
	t.Helper()
	var msgs []replay.Message
	var evs []events.Event
	err := replay.Read(context.Background(), js, stream, replay.ReadOptions{}, func(m replay.Message) error {
		msgs = append(msgs, m)
		ev, err := events.Decode(m.Data)
		if err == nil {
			ev.Seq = m.Seq
		}
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return msgs, evs
}
