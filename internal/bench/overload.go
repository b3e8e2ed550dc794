package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
)

// overload measures memory while producers outrun the executors (issue
// 7): concurrency goroutines schedule root tasks as fast as they can, on
// a node of its own stream, while one executor drains them at about a
// hundred tasks a second. The admission quota (active roots per
// customer) bounds the backlog, rejected tasks answer 429 and are kept
// as finished tasks, and retention bounds how many finished tasks the
// projections hold; so the live heap levels off while the log grows.
// The heap is sampled after a full collection every second; the figure
// is its growth per task written over the second half of the run (the
// least-squares slope), once quota and retention are reached: what is
// left growing with the log.
func (r *run) overload(ctx context.Context, nc *nats.Conn) error {
	quota, retain := r.scaled(300, 30), r.scaled(20_000, 2_000)
	length := time.Duration(r.scaled(30, 6)) * time.Second
	cfg := node.Config{
		Stream: "OVERLOAD", Subjects: events.Subjects{Root: "overload"}, Retain: retain,
		Admission: scheduler.Admission{Default: scheduler.Quota{MaxActiveRoots: quota}},
	}
	return r.withNode(ctx, nc, cfg, func(nd *node.Node) error {
		local := httpapi.NewLocal(nd.Service)
		ctx, cancel := context.WithTimeout(ctx, length)
		defer cancel()
		var accepted, rejected, done atomic.Int64
		g, gctx := errgroup.WithContext(ctx)
		for p := range concurrency {
			g.Go(func() error {
				for i := p; gctx.Err() == nil; i += concurrency {
					_, _, err := local.Schedule(gctx, scheduleRequest(i, "overload"))
					switch {
					case err == nil:
						accepted.Add(1)
					case errors.Is(err, api.ErrAdmissionRejected):
						rejected.Add(1)
					case gctx.Err() == nil:
						return fmt.Errorf("schedule: %w", err)
					}
				}
				return nil
			})
		}
		g.Go(func() error {
			for gctx.Err() == nil {
				t, ok, err := local.ClaimNext(gctx, "overload", "slow-executor", time.Second)
				if err != nil || !ok {
					continue // the run ending, or nothing ready yet
				}
				time.Sleep(10 * time.Millisecond) // the work
				if _, err := local.RecordResult(gctx, t.ID, api.ResultRequest{DeliveryID: t.Claim.DeliveryID, Success: true}); err == nil {
					done.Add(1)
				}
			}
			return nil
		})
		var tasks, heap []float64 // tasks written, heap bytes; one sample a second
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for ctx.Err() == nil {
			select {
			case <-tick.C:
				tasks, heap = append(tasks, float64(accepted.Load()+rejected.Load())), append(heap, float64(heapAlloc()))
				r.say("  %2ds: heap %.1f MiB, %d accepted, %d rejected (429), %d done",
					len(heap), heap[len(heap)-1]/(1<<20), accepted.Load(), rejected.Load(), done.Load())
			case <-ctx.Done():
			}
		}
		if err := g.Wait(); err != nil {
			return err
		}
		if len(heap) < 4 {
			return fmt.Errorf("only %d heap samples", len(heap))
		}
		if r.cfg.ProfileDir != "" {
			if err := writeHeapProfile(filepath.Join(r.cfg.ProfileDir, "overload-heap.pprof")); err != nil {
				return err
			}
		}
		half := len(heap) / 2
		r.say("  quota %d active roots × %d customers, retain %d: %d tasks in the projections, %d evicted",
			quota, customers, retain, len(nd.Engine.List(projections.Filter{}, "", 1<<30)), nd.Engine.Evicted())
		r.add(Figure{Section: "overload", Name: FigOverloadGrowth, Value: slope(tasks[half:], heap[half:]), Unit: "bytes/task"})
		r.add(Figure{Section: "overload", Name: FigOverloadHeap, Value: heap[len(heap)-1] / (1 << 20), Unit: "MiB"})
		return nil
	})
}

// slope is the least-squares slope of y over x.
func slope(x, y []float64) float64 {
	n := float64(len(x))
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx, sy, sxx, sxy = sx+x[i], sy+y[i], sxx+x[i]*x[i], sxy+x[i]*y[i]
	}
	if d := n*sxx - sx*sx; d != 0 {
		return (n*sxy - sx*sy) / d
	}
	return 0
}
