package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
)

// The floors: what the enqueue and the lifecycle would cost if the
// scheduler did nothing but their appends, made the way its store makes
// them. A task's appends depend on each other (each carries the previous
// one's sequence, as the optimistic concurrency check needs), so they go
// one after the other while different tasks' appends share the pipeline.
const (
	FigLifecycleFloor     = "raw lifecycle: 3 appends a task + tail, 72 goroutines"
	FigLifecycleFloorWide = "raw lifecycle: 3 appends a task + tail, 1,024 goroutines"

	// lifecycleWrites is what a task's lifecycle writes when a claimer
	// waits for it (the handoff): TaskScheduled, Claimed,
	// ResultRecorded. The lifecycle measures its own (FigWritesPerTask).
	lifecycleWrites = 3
	// floorGoroutines is the lifecycle's own concurrency: its schedulers
	// and its workers' slots. wideGoroutines fills the pipeline far
	// better: what the floor reaches with 14 times the concurrency.
	floorGoroutines = schedulers + workers*workerSlots
	wideGoroutines  = 1024
)

// appendTask makes k appends on a new task's subject of st through its
// append pipeline, each with the expected last subject sequence (as the
// store's appends on a single server), one after the other.
func appendTask(ctx context.Context, st *store.Store, data []byte, k int) error {
	subject, last := st.Subjects().Event(customer(0), events.NewID()), uint64(0)
	for range k {
		msg := rawMsg(subject, data)
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
		seq, err := st.Pipeline().Publish(ctx, msg)
		if err != nil {
			return err
		}
		last = seq
	}
	return nil
}

// tailed is a store of the floors' own, whose stream an ordered consumer
// reads as the projections' tail does, counting what it has read.
type tailed struct {
	st       *store.Store
	data     []byte
	cc       jetstream.ConsumeContext
	appended atomic.Int64
	read     atomic.Int64
}

// openTailed opens a store on its own stream name and starts its tail.
func openTailed(ctx context.Context, nc *nats.Conn, name string) (*tailed, error) {
	data, err := sampleEvent()
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, nc, name, nil)
	if err != nil {
		return nil, err
	}
	t := &tailed{st: st, data: data}
	cons, err := st.JetStream().OrderedConsumer(ctx, "BENCH_"+strings.ToUpper(name), jetstream.OrderedConsumerConfig{})
	if err == nil {
		t.cc, err = cons.Consume(func(jetstream.Msg) { t.read.Add(1) })
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	return t, nil
}

// task makes a new task's k appends (appendTask).
func (t *tailed) task(ctx context.Context, k int) error {
	if err := appendTask(ctx, t.st, t.data, k); err != nil {
		return err
	}
	t.appended.Add(int64(k))
	return nil
}

// caughtUp waits until the tail has read every append made so far.
func (t *tailed) caughtUp(ctx context.Context) error {
	for t.read.Load() < t.appended.Load() {
		if err := sleep(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("the tail read %d of %d appends: %w", t.read.Load(), t.appended.Load(), err)
		}
	}
	return nil
}

func (t *tailed) close() {
	t.cc.Stop()
	t.st.Close()
}

// lifecycleFloor measures n raw lifecycles: goroutines goroutines each
// making a task's lifecycleWrites appends, one task after another, while
// an ordered consumer reads the stream as the projections' tail does. It
// returns tasks/s, counted until the tail has read the last append.
func lifecycleFloor(ctx context.Context, nc *nats.Conn, n, goroutines int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	t, err := openTailed(ctx, nc, fmt.Sprintf("rawlifecycle%d", goroutines))
	if err != nil {
		return 0, err
	}
	defer t.close()

	start := time.Now()
	var next atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for range goroutines {
		g.Go(func() error {
			for next.Add(1) <= int64(n) {
				if err := t.task(gctx, lifecycleWrites); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, fmt.Errorf("raw lifecycle, %d goroutines: %w", goroutines, err)
	}
	if err := t.caughtUp(ctx); err != nil {
		return 0, fmt.Errorf("raw lifecycle, %d goroutines: %w", goroutines, err)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
