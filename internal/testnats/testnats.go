// Package testnats runs one real embedded NATS JetStream server per test
// package and gives each test its own connection, stream and subjects.
package testnats

import (
	"fmt"
	"os"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
)

var (
	server *broker.Embedded
	dir    string
	seq    atomic.Int64
)

// NATSLeaks are the goroutines the NATS libraries are known to leave
// behind, which a leak check ignores: nats.go 1.55 starts an async
// publisher's reconnect watcher that can read its status channel only
// after an object store Put (a projection snapshot, the chain head) has
// already cleaned the publisher up and set the channel to nil, and then
// waits on it forever.
var NATSLeaks = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
}

// Main starts the package's server, runs the tests, stops the server and
// then fails the run if any goroutine leaked (but NATSLeaks and ignore).
// Call it from TestMain.
func Main(m *testing.M, ignore ...goleak.Option) {
	var err error
	if dir, err = os.MkdirTemp("", "taskledger-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if server, err = broker.StartEmbedded(broker.EmbeddedConfig{Dir: dir}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	server.Shutdown()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(append(NATSLeaks, ignore...)...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Server is the package's server, for what needs more of it than a
// connection (its group commit, broker.Embedded.Sync).
func Server() *broker.Embedded { return server }

// Disconnect drops the server's side of nc's connection, as a network
// failure would.
func Disconnect(t testing.TB, nc *nats.Conn) {
	t.Helper()
	if err := server.Disconnect(nc); err != nil {
		t.Fatal(err)
	}
}

// Conn returns a new in-process connection to the package's server,
// closed when the test ends.
func Conn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := server.Connect(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Namespace is a stream name and subject root no other test uses.
type Namespace struct {
	Stream      string
	ReadyStream string
	Subjects    events.Subjects
}

var unsafe = regexp.MustCompile(`[^A-Za-z0-9]`)

// NewNamespace returns a fresh namespace for t.
func NewNamespace(t testing.TB) Namespace {
	n := seq.Add(1)
	name := unsafe.ReplaceAllString(t.Name(), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	root := fmt.Sprintf("t%d", n)
	return Namespace{
		Stream:      fmt.Sprintf("%s_%d", name, n),
		ReadyStream: fmt.Sprintf("%s_%d_READY", name, n),
		Subjects:    events.Subjects{Root: root},
	}
}
