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
// append pipeline, each with a message id and the expected last subject
// sequence, one after the other.
func appendTask(ctx context.Context, st *store.Store, data []byte, k int) error {
	subject, last := st.Subjects().Event(customer(0), events.NewID()), uint64(0)
	for range k {
		msg := rawMsg(subject, data)
		msg.Header.Set(jetstream.MsgIDHeader, events.NewID())
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
		seq, err := st.PublishAcked(ctx, msg)
		if err != nil {
			return err
		}
		last = seq
	}
	return nil
}

// lifecycleFloor measures n raw lifecycles: goroutines goroutines each
// making a task's lifecycleWrites appends, one task after another, while
// an ordered consumer reads the stream as the projections' tail does. It
// returns tasks/s, counted until the tail has read the last append.
func lifecycleFloor(ctx context.Context, nc *nats.Conn, n, goroutines int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	name := fmt.Sprintf("rawlifecycle%d", goroutines)
	st, err := openStore(ctx, nc, name, nil)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	data, err := sampleEvent()
	if err != nil {
		return 0, err
	}
	cons, err := st.JetStream().OrderedConsumer(ctx, "BENCH_"+strings.ToUpper(name), jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, err
	}
	read := make(chan struct{})
	var seen atomic.Int64
	cc, err := cons.Consume(func(jetstream.Msg) {
		if seen.Add(1) == int64(n*lifecycleWrites) {
			close(read)
		}
	})
	if err != nil {
		return 0, err
	}
	defer cc.Stop()

	start := time.Now()
	var next atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for range goroutines {
		g.Go(func() error {
			for next.Add(1) <= int64(n) {
				if err := appendTask(gctx, st, data, lifecycleWrites); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, fmt.Errorf("raw lifecycle, %d goroutines: %w", goroutines, err)
	}
	select {
	case <-read:
	case <-ctx.Done():
		return 0, fmt.Errorf("raw lifecycle, %d goroutines: the tail read %d of %d appends: %w", goroutines, seen.Load(), n*lifecycleWrites, ctx.Err())
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
