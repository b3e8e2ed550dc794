package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

// heapAlloc returns the live Go heap after a full collection: the bytes
// the heap profile's inuse_space would add up to, not the process RSS.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// writeHeapProfile writes the live heap's profile to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// memory measures the Go heap a projection engine holds per active
// (queued) task: a million tasks (times the scale), each folded from
// TaskScheduled, DeliveryPending and ReadyPublished through Engine.Apply,
// with no server.
func (r *run) memory(ctx context.Context) error {
	n := r.scaled(1_000_000, 2000)
	// Creation times spread over an hour, so the usage view keeps only the
	// last minute's admissions, as it would for tasks that accumulated.
	base := time.Now().Add(-time.Hour)
	// Fewer collections while the heap grows: their cost (scanning an
	// ever larger projection) is not what this section measures, and the
	// figure is read after a full collection either way.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	before := heapAlloc()
	eng, err := projections.New(projections.Config{Logger: discardLogger})
	if err != nil {
		return err
	}
	seq := uint64(0)
	start := time.Now()
	for i := range n {
		if i%10000 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		taskID, dlv, cust := events.NewID(), events.NewID(), customer(i)
		at := base.Add(time.Duration(i) * time.Hour / time.Duration(n))
		for k, p := range []events.Payload{
			events.TaskScheduled{Spec: spec(taskID, at)},
			events.DeliveryPending{DeliveryID: dlv, Attempt: 1, NextAt: at},
			events.ReadyPublished{DeliveryID: dlv},
		} {
			data, err := events.Encode(events.Event{ID: events.NewID(), TaskID: taskID, CustomerID: cust, Number: k + 1, At: at, Actor: "scheduler", Data: p})
			if err != nil {
				return err
			}
			seq++
			eng.Apply(events.Position(seq), data)
		}
	}
	elapsed := time.Since(start)
	if got := eng.QueueCounts()["default"][aggregate.StatusQueued]; got != n {
		return fmt.Errorf("%d tasks queued, want %d", got, n)
	}
	// The engine's share is what a collection frees once it is dropped:
	// the growth since before would also count (with a minus) whatever
	// the sections before left to be freed meanwhile.
	after := heapAlloc()
	if r.cfg.ProfileDir != "" {
		if err := writeHeapProfile(filepath.Join(r.cfg.ProfileDir, "memory-heap.pprof")); err != nil {
			return err
		}
	}
	runtime.KeepAlive(eng) // eng is dead from here on
	dropped := heapAlloc()
	held := int64(after) - int64(dropped)
	per := float64(held) / float64(n)
	r.say("  %d queued tasks: the engine holds %.1f MiB of heap (heap grew %.1f MiB; encode+apply %.0f events/s)",
		n, float64(held)/(1<<20), (float64(after)-float64(before))/(1<<20), float64(seq)/elapsed.Seconds())
	r.add(atMost(Figure{Section: "memory", Name: FigMemory, Value: per, Unit: "bytes"}, per, 512, "≤ 512 bytes"))
	debug.FreeOSMemory() // hand the projections back before the next section
	return nil
}
