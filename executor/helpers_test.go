package executor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// Helpers of the worker tests. Every name starts with "wk" so that the
// other test files of the package may define their own setup.

// wkEnv is one running scheduler behind a real HTTP server, plus a
// JetStream context on the same NATS server for workers in NATS mode.
type wkEnv struct {
	node   *node.Node
	client *api.Client
	ns     testnats.Namespace
	js     jetstream.JetStream
	log    zerolog.Logger
}

// wkSetup starts a scheduler node on a fresh namespace of the package's
// NATS server, serves its API over HTTP and waits until it is ready.
func wkSetup(t *testing.T) *wkEnv {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)
	n := testnode.Start(t, func(c *node.Config) { c.Logger = log })
	js, err := jetstream.New(testnats.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	return &wkEnv{node: n.Node, client: n.Client, ns: n.NS, js: js, log: log}
}

// kv opens a checkpoint bucket unique to this namespace.
func (e *wkEnv) kv(t *testing.T, suffix string) *executor.KVCheckpoints {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cps, err := executor.OpenKVCheckpoints(ctx, e.js, e.ns.Stream+"_RUNS_"+suffix)
	if err != nil {
		t.Fatal(err)
	}
	return cps
}

// httpCfg configures a worker that long-polls POST /v1/claims/next. Its
// stop stands for a crash: it keeps its claims (KeepClaimsOnShutdown),
// for a restarted worker with the same id to resume.
func (e *wkEnv) httpCfg(queue, executorID string) executor.WorkerConfig {
	return executor.WorkerConfig{
		API: e.client, Queue: queue, ExecutorID: executorID,
		CheckInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond, Logger: e.log,
		KeepClaimsOnShutdown: true,
	}
}

// natsCfg configures a worker that reads the ready stream directly and
// keeps its checkpoints in cps.
func (e *wkEnv) natsCfg(queue, executorID string, cps executor.CheckpointStore) executor.WorkerConfig {
	cfg := e.httpCfg(queue, executorID)
	cfg.JS, cfg.ReadyStream, cfg.Subjects, cfg.Checkpoints = e.js, e.ns.ReadyStream, e.ns.Subjects, cps
	return cfg
}

// wkWorker is a running executor.Worker.
type wkWorker struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// start runs a worker until stop (or the end of the test).
func (e *wkEnv) start(t *testing.T, cfg executor.WorkerConfig, h executor.Handler) *wkWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &wkWorker{cancel: cancel, done: make(chan error, 1)}
	wk, err := executor.NewWorker(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	go func() { w.done <- wk.Run(ctx) }()
	t.Cleanup(func() { w.stop(t) })
	return w
}

// stop cancels the worker's context (as a killed executor would stop) and
// waits until its Run has returned, with every run it held.
func (w *wkWorker) stop(t *testing.T) {
	t.Helper()
	w.once.Do(func() {
		w.cancel()
		select {
		case w.err = <-w.done:
		case <-time.After(20 * time.Second):
			w.err = errors.New("worker did not stop within 20s")
		}
	})
	if w.err != nil {
		t.Errorf("worker Run: %v", w.err)
	}
}

// wkEventually polls cond until it holds, failing the test after 30s.
var wkEventually = testnode.Eventually

// wkRecv waits for a value from ch, failing the test after 20s.
func wkRecv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// schedule schedules req and fails the test on any error.
func (e *wkEnv) schedule(t *testing.T, req api.ScheduleRequest) api.Task {
	t.Helper()
	task, _, err := e.client.Schedule(context.Background(), req)
	if err != nil {
		t.Fatalf("schedule %+v: %v", req, err)
	}
	return task
}

// waitStatus polls a task until it has status and returns it.
func (e *wkEnv) waitStatus(t *testing.T, id, status string) api.Task {
	t.Helper()
	var task api.Task
	wkEventually(t, "task "+id+" "+status, func() bool {
		var err error
		if task, err = e.client.Get(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		return task.Status == status
	})
	return task
}

// countEvents counts the events of type typ in a task's history.
func (e *wkEnv) countEvents(t *testing.T, id, typ string) int {
	t.Helper()
	h, err := e.client.History(context.Background(), id)
	if err != nil {
		t.Fatalf("history %s: %v", id, err)
	}
	n := 0
	for _, ev := range h.Events {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// wkText is a one-part text message.
func wkText(s string) events.Message {
	return events.Message{Content: []events.ContentPart{{Type: "text", Text: s}}}
}

// wkBlock waits until ctx is done and returns its error: a handler or step
// that would run forever, interrupted only by a stop or a shutdown.
func wkBlock(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// wkItemIDs returns the ids of transcript items, in order.
func wkItemIDs(items []api.TranscriptItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}
