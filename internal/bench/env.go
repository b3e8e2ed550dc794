package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/store"
)

// concurrency is the number of concurrent publishers, callers and
// loaders the sections use.
const concurrency = 16

// phaseTimeout bounds one measured phase, so a stalled pipeline fails
// the run instead of hanging.
const phaseTimeout = 3 * time.Minute

// startServer starts an embedded server with file storage in dir and
// returns it with an in-process connection.
func startServer(dir string, syncAlways bool) (*broker.Embedded, *nats.Conn, error) {
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: dir, SyncAlways: syncAlways})
	if err != nil {
		return nil, nil, err
	}
	nc, err := srv.Connect()
	if err != nil {
		srv.Shutdown()
		return nil, nil, err
	}
	return srv, nc, nil
}

// openStore opens a Store on its own stream and subject root.
func openStore(ctx context.Context, nc *nats.Conn, name string, locate func(string) (string, string, events.Position, bool)) (*store.Store, error) {
	return store.Open(ctx, nc, store.Config{
		Stream:   "BENCH_" + strings.ToUpper(name),
		Subjects: events.Subjects{Root: name},
		Locate:   locate,
	})
}

// withNode runs a scheduler node (store, projections, alarm, service,
// HTTP handler) with the default stream on nc, calls fn once its
// projections have caught up, and stops the node when fn returns.
// Projection snapshots are off, so a snapshot write does not land in the
// middle of a measurement.
func (r *run) withNode(ctx context.Context, nc *nats.Conn, cfg node.Config, fn func(*node.Node) error) (err error) {
	cfg.NC, cfg.NoSnapshots = nc, true
	cfg.Logger = zerolog.New(r.log).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	nd, err := node.New(ctx, cfg)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- nd.Run(runCtx) }()
	defer func() {
		cancel()
		if stopErr := <-done; stopErr != nil && !errors.Is(stopErr, context.Canceled) && err == nil {
			err = fmt.Errorf("node stopped with %w", stopErr)
		}
	}()
	if err := waitFor(ctx, 30*time.Second, func() string { return "node not caught up" }, nd.Engine.CaughtUp); err != nil {
		return err
	}
	return fn(nd)
}

// customers is how many customers the generated tasks belong to.
const customers = 64

func customer(i int) string { return fmt.Sprintf("cust-%02d", i%customers) }

// spec is a typical root task's spec.
func spec(taskID string, at time.Time) events.TaskSpec {
	return events.TaskSpec{
		RootID:    taskID,
		RequestID: "req-" + taskID,
		Queue:     "default",
		Signal: events.Signal{
			ID: "sig-" + taskID, URI: "https://ci.example.com/hooks/github",
			EventType: "pull_request", EventAction: "opened",
		},
		Repo: "example/service",
		Message: events.Message{ID: "msg-0", CreatedAt: at, Content: []events.ContentPart{{
			Type: "text",
			Text: "The integration test TestCheckoutRetries fails about one run in five since the last " +
				"dependency bump; find the cause, fix it and open a pull request with the fix.",
		}}},
		RunAt:          at,
		TimeoutSeconds: 3600,
	}
}

// historyLen is the number of events history returns.
const historyLen = 10

// history returns the events of one task's typical life, in log order:
// scheduled, released, ready published, claimed, four follow-up messages
// with a mailbox read among them, and a successful result.
func history(taskID, customerID string, at time.Time) []events.Event {
	dlv := events.NewID()
	mail := func(i int) events.Payload {
		return events.MailboxAppended{Index: i, Message: events.Message{
			ID: "msg-" + strconv.Itoa(i), CreatedAt: at,
			Content: []events.ContentPart{{Type: "text", Text: "also check the flaky timeout in the retry path"}},
		}}
	}
	payloads := []events.Payload{
		events.TaskScheduled{Spec: spec(taskID, at)},
		events.DeliveryPending{DeliveryID: dlv, Attempt: 1, NextAt: at},
		events.ReadyPublished{DeliveryID: dlv},
		events.Claimed{DeliveryID: dlv, ExecutorID: "exec-1", Deadline: at.Add(time.Hour)},
		mail(1), mail(2), mail(3),
		events.MailboxRead{Cursor: 3},
		mail(4),
		events.ResultRecorded{DeliveryID: dlv, Result: events.Result{
			Success: true, Summary: "fixed the retry backoff; opened a pull request",
			Effects: []events.Effect{{Kind: "pull_request", Ref: "#128", URL: "https://example.com/pr/128"}},
		}},
	}
	evs := make([]events.Event, len(payloads))
	for i, p := range payloads {
		evs[i] = events.Event{
			ID: events.NewID(), TaskID: taskID, CustomerID: customerID, Number: i + 1,
			At: at, Actor: "scheduler", Data: p,
		}
	}
	return evs
}

// forEach calls fn(i) for every i in [0, n) from concurrency goroutines
// and returns the first error.
func forEach(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range concurrency {
		g.Go(func() error {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return nil
				}
				if err := fn(ctx, i); err != nil {
					return err
				}
			}
			return ctx.Err()
		})
	}
	return g.Wait()
}

// percentile returns the p-th quantile (0..1) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	return sorted[min(int(float64(len(sorted))*p), len(sorted)-1)]
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// discardLogger is a zerolog logger that writes nothing.
var discardLogger = zerolog.New(io.Discard)
