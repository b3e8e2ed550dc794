package projections_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// logBundle is a store on a fresh stream and an engine on it that has
// not been started.
type logBundle struct {
	ns     testnats.Namespace
	store  *store.Store
	engine *projections.Engine
}

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}

// setupLog opens a store on a fresh namespace and builds (but does not
// run) an engine on it.
func setupLog(t *testing.T) *logBundle {
	t.Helper()
	ns := testnats.NewNamespace(t)
	st, err := store.Open(context.Background(), testnats.Conn(t), store.Config{Stream: ns.Stream, Subjects: ns.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &logBundle{ns: ns, store: st, engine: newEngine(t, st.JetStream(), ns)}
}

func newEngine(t testing.TB, js jetstream.JetStream, ns testnats.Namespace) *projections.Engine {
	return mustEngine(projections.Config{Log: eventlog.Log{JS: js, Stream: ns.Stream, Subjects: ns.Subjects}, Logger: testLogger(t)})
}

// run runs e until the test ends and checks that it stopped only then.
func run(t *testing.T, e *projections.Engine) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine stopped with %v", err)
		}
	})
}

// eventually polls cond until it holds, failing the test after 30s.
var eventually = testnode.Eventually

// schedule appends a new task through the store and returns its state.
// An empty parent makes a root.
func (b *logBundle) schedule(t testing.TB, customer string, parent *aggregate.State, runAt time.Time) aggregate.State {
	t.Helper()
	id := events.NewID()
	spec := events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 60, RunAt: runAt}
	if parent != nil {
		spec.ParentID, spec.RootID = parent.TaskID, parent.Spec.RootID
	}
	st, _, err := b.store.Execute(context.Background(), id, "", aggregate.Schedule{TaskID: id, CustomerID: customer, Spec: spec})
	if err != nil {
		t.Fatalf("schedule: %v", err)
	}
	return st
}

// lastSeq is the stream's last sequence now.
func lastSeq(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// mustEngine is projections.New for configurations that are valid.
func mustEngine(cfg projections.Config) *projections.Engine {
	e, err := projections.New(cfg)
	if err != nil {
		panic(err)
	}
	return e
}
