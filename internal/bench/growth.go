package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync/atomic"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
)

// The growth section runs the same workload growthRounds times on one
// fresh server, so that every round meets the history of those before
// it: a cost that grows with the number of tasks ever written shows as
// a falling rate. Each round enqueues n tasks from 50 clients and n in
// batches of 1,000, then drains the first n with 1,000 claims/next loops
// and the second with 50 batch loops, n = 20,000 × the scale: ten rounds
// leave 400,000 finished tasks in the log at scale 1.
const growthRounds = 10

// Figures of the growth section: the last round's rate ÷ the first's,
// for each phase, held to at least 0.9 (issue 30, "Cost that stays flat
// as the log grows"). Each round's own figures are named by
// FigGrowthRound.
const (
	FigGrowthEnqueue    = "growth: HTTP enqueue, round 10 ÷ round 1"
	FigGrowthBatch      = "growth: HTTP batch enqueue, round 10 ÷ round 1"
	FigGrowthDrain      = "growth: HTTP drain, round 10 ÷ round 1"
	FigGrowthBatchDrain = "growth: HTTP batch drain, round 10 ÷ round 1"
	FigGrowthCPU        = "growth: CPU per task, round 10 ÷ round 1"
)

// Phases of a growth round, as FigGrowthRound names them.
const (
	growthEnqueue    = "enqueue, 50 clients"
	growthBatch      = "batch enqueue, 1,000 a call"
	growthDrain      = "drain, 1,000 claims/next loops"
	growthBatchDrain = "batch drain, 50 loops"
	growthCPU        = "CPU per task"
	growthHeap       = "heap after the round"
	growthLoads      = "task reads from the log per task"
)

// FigGrowthRound names phase's figure of growth round round (1 to 10).
func FigGrowthRound(round int, phase string) string {
	return fmt.Sprintf("growth round %02d: %s", round, phase)
}

// growthTarget is the least ratio of the last round's rate to the
// first's that counts as flat.
const growthTarget = 0.9

// growth runs the growth rounds on a server of its own (default
// durability) and adds each round's rates, its CPU per task (whole
// process, over the 2n tasks enqueued and finished) and the live heap
// after it, then the ratios of the last round to the first. With
// Config.ProfileDir, each round writes its own CPU profile
// (growth-round01.pprof, ...) instead of one for the section, and the
// live heap after it (growth-round01.heap.pprof, ...), so the first and
// the last can be compared.
func (r *run) growth(ctx context.Context) error {
	srv, nc, err := startServer(filepath.Join(r.dir, "growth"), false)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	defer nc.Close()
	return r.withNode(ctx, nc, node.Config{Durable: srv}, func(nd *node.Node) error {
		url, stop, err := serveHTTP(nd)
		if err != nil {
			return err
		}
		defer stop()
		n := r.scaled(20000, 200)
		first := map[string]float64{}
		last := map[string]float64{}
		for round := 1; round <= growthRounds; round++ {
			rates, err := r.growthRound(ctx, nd, url, round, n)
			if err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
			if round == 1 {
				first = rates
			}
			last = rates
		}
		for _, c := range []struct{ name, phase string }{
			{FigGrowthEnqueue, growthEnqueue}, {FigGrowthBatch, growthBatch},
			{FigGrowthDrain, growthDrain}, {FigGrowthBatchDrain, growthBatchDrain},
		} {
			v := last[c.phase] / first[c.phase]
			r.add(atLeast(Figure{Section: "growth", Name: c.name, Value: v, Unit: "×"}, v, growthTarget, "≥ 0.9×"))
		}
		// CPU per task is a cost: flat is at most 1 ÷ 0.9.
		v := last[growthCPU] / first[growthCPU]
		r.add(atMost(Figure{Section: "growth", Name: FigGrowthCPU, Value: v, Unit: "×"}, v, 1/growthTarget, "≤ 1.11×"))
		r.say("  %d tasks written on the growth server", 2*n*growthRounds)
		return nil
	})
}

// growthRound runs one round of the growth workload and returns its
// figures by phase.
func (r *run) growthRound(ctx context.Context, nd *node.Node, url string, round, n int) (map[string]float64, error) {
	if r.cfg.ProfileDir != "" {
		f, err := os.Create(filepath.Join(r.cfg.ProfileDir, fmt.Sprintf("growth-round%02d.pprof", round)))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	const single, batch = "growth-single", "growth-batch"
	figs := map[string]float64{}
	var errs atomic.Int64
	phases := []struct {
		name  string
		conns int
		after string // the queue whose n tasks must be queued first, unmeasured
		fn    func(*api.Client) error
	}{
		{growthEnqueue, enqueueClients, "", func(c *api.Client) error { return enqueueEach(ctx, c, single, n) }},
		{growthBatch, 1, "", func(c *api.Client) error { return enqueueBatches(ctx, c, batch, n) }},
		{growthDrain, drainLoops, single, func(c *api.Client) error { return drainEach(ctx, c, single, n, &errs) }},
		{growthBatchDrain, batchLoops, batch, func(c *api.Client) error { return drainBatches(ctx, c, batch, n, &errs) }},
	}
	var cpu float64
	loads := nd.Store.CommandLoads()
	for _, p := range phases {
		if p.after != "" {
			if err := waitQueued(ctx, nd, p.after, n); err != nil {
				return nil, err
			}
		}
		c := httpClient(url, p.conns)
		u, err := measure(func() error { return p.fn(c) })
		c.HTTP.CloseIdleConnections()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		cpu += u.cpu.Seconds()
		rate := float64(n) / u.elapsed.Seconds()
		figs[p.name] = rate
		r.add(Figure{Section: "growth", Name: FigGrowthRound(round, p.name), Value: rate, Unit: "tasks/s"})
	}
	if e := errs.Load(); e > 0 {
		return nil, fmt.Errorf("%d failed claims or results", e)
	}
	// Commands decided on a state read from the log instead of the
	// store's cache: unlike the rates, a count the machine's load does
	// not move.
	perTask := float64(nd.Store.CommandLoads()-loads) / float64(2*n)
	r.add(Figure{Section: "growth", Name: FigGrowthRound(round, growthLoads), Value: perTask, Unit: "reads/task"})
	figs[growthCPU] = cpu * 1e6 / float64(2*n)
	r.add(Figure{Section: "growth", Name: FigGrowthRound(round, growthCPU), Value: figs[growthCPU], Unit: "µs/task"})
	heap := float64(heapAlloc()) / (1 << 20)
	if r.cfg.ProfileDir != "" {
		if err := writeHeapProfile(filepath.Join(r.cfg.ProfileDir, fmt.Sprintf("growth-round%02d.heap.pprof", round))); err != nil {
			return nil, err
		}
	}
	r.add(Figure{Section: "growth", Name: FigGrowthRound(round, growthHeap), Value: heap, Unit: "MiB"})
	return figs, nil
}
