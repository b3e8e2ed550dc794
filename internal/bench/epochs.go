package bench

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
)

// epochs measures what an epoch costs the NATS server (docs/DESIGN.md,
// "Epochs"): the Go heap of this process, which runs the embedded server,
// per task of an epoch while it is live, once it is sealed and once it is
// removed. The tasks are scheduled and canceled through a store without a
// cache and without projections, so the growth is the server's.
func (r *run) epochs(ctx context.Context, nc *nats.Conn) error {
	n := r.scaled(50_000, 2000)
	name := "epochs"
	st, err := store.Open(ctx, nc, store.Config{
		Stream: "BENCH_" + strings.ToUpper(name), Subjects: events.Subjects{Root: name},
		EpochSlots: 2, EpochPeriod: time.Hour, CacheSize: -1,
	})
	if err != nil {
		return err
	}
	defer st.Close()
	before := serverHeap()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	start := time.Now()
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)); i <= n && ctx.Err() == nil; i = int(next.Add(1)) {
				id := events.NewID()
				_, _, err := st.Execute(ctx, id, "", aggregate.Schedule{TaskID: id, CustomerID: customer(i), Spec: spec(id, time.Now().Add(time.Hour))})
				if err == nil {
					_, _, err = st.Execute(ctx, id, "", aggregate.Cancel{Reason: "bench"})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	r.say("  %d tasks scheduled and canceled in one epoch in %s", n, time.Since(start).Round(time.Millisecond))
	live := serverHeap()
	js, stream := st.JetStream(), "BENCH_"+strings.ToUpper(name)
	e := st.Epochs()
	if _, err := eventlog.UpdateEpochs(ctx, js, stream, func(e *eventlog.Epochs) bool {
		e.Current, e.Slots[1] = 1, eventlog.Slot{Epoch: e.Slots[0].Epoch + 1, State: eventlog.SlotOpen}
		return true
	}); err != nil {
		return err
	}
	if err := eventlog.SealSlot(ctx, js, stream, st.Shards(), 0, e.Slots[0].Epoch); err != nil {
		return err
	}
	sealed := serverHeap()
	if err := eventlog.RemoveEpoch(ctx, st.Log(), e.Slots[0].Epoch); err != nil {
		return err
	}
	removed := serverHeap()
	if r.cfg.ProfileDir != "" {
		if err := writeHeapProfile(filepath.Join(r.cfg.ProfileDir, "epochs-removed-heap.pprof")); err != nil {
			return err
		}
	}
	per := func(h uint64) float64 { return (float64(h) - float64(before)) / float64(n) }
	r.say("  heap: %.1f MiB before, %.1f live, %.1f sealed, %.1f removed", mib(before), mib(live), mib(sealed), mib(removed))
	r.add(Figure{Section: "epochs", Name: FigEpochLive, Value: per(live), Unit: "bytes"})
	r.add(Figure{Section: "epochs", Name: FigEpochSealed, Value: per(sealed), Unit: "bytes"})
	// What stays after removal is mostly nats-server's block buffer pools
	// and other fixed costs, spread over n: it falls with the scale.
	r.add(Figure{Section: "epochs", Name: FigEpochRemoved, Value: per(removed), Unit: "bytes"})
	return nil
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// serverHeap is heapAlloc after a second collection: nats-server keeps
// message block buffers in sync.Pools, which only the second collection
// after their last use empties.
func serverHeap() uint64 {
	runtime.GC()
	return heapAlloc()
}
