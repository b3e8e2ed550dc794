package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
)

// The NATS section measures the HTTP section's enqueue and drains over
// the API over NATS (internal/natsapi): the same calls of the same Go
// client, each a NATS request on one client connection instead of an
// HTTP request, served by the same handler with the same group commit.
// Each figure's ratio is to its HTTP twin of the same run.

// Figures of the NATS section.
const (
	FigEnqueueNATS     = "NATS enqueue, 50 clients, 1 task a call"
	FigDrainNATS       = "NATS drain, 1,000 claims/next loops"
	FigDrainNATSErrors = "NATS drain errors, 1,000 loops"
	FigDrainNATSBatch  = "NATS drain, 50 batch loops (max 100)"
)

// natsTwin is each NATS figure's HTTP twin.
var natsTwin = map[string]string{FigEnqueueNATS: FigEnqueueHTTP, FigDrainNATS: FigDrainHTTP, FigDrainNATSBatch: FigDrainBatch}

// natsSection runs the NATS figures on nd, through a client connection
// of its own to the run's server.
func (r *run) natsSection(ctx context.Context, nd *node.Node) error {
	if r.connect == nil {
		return errors.New("bench: the NATS section needs the run's server")
	}
	const customer = "bench"
	nc, err := r.connect(nats.CustomInboxPrefix(api.NATSInbox(customer)), nats.Name("bench NATS client"))
	if err != nil {
		return err
	}
	defer nc.Close()
	c := api.NewNATSClient(nc, events.DefaultSubjects.Root, customer, "")
	n := r.scaled(20000, 200)

	if err := r.natsPhase(FigEnqueueNATS, n, func() error { return enqueueEach(ctx, c, "nats-single", n) }); err != nil {
		return err
	}
	// The batch drain's tasks: enqueued the same way, not measured.
	if err := enqueueEach(ctx, c, "nats-batch", n); err != nil {
		return err
	}
	for _, q := range []string{"nats-single", "nats-batch"} {
		if err := waitQueued(ctx, nd, q, n); err != nil {
			return err
		}
	}
	var errs atomic.Int64
	if err := r.natsPhase(FigDrainNATS, n, func() error { return drainEach(ctx, c, "nats-single", n, &errs) }); err != nil {
		return err
	}
	r.add(atMost(Figure{Section: "nats", Name: FigDrainNATSErrors, Value: float64(errs.Load()), Unit: "errors"}, float64(errs.Load()), 0, "0"))
	errs.Store(0)
	if err := r.natsPhase(FigDrainNATSBatch, n, func() error { return drainBatches(ctx, c, "nats-batch", n, &errs) }); err != nil {
		return err
	}
	if errs.Load() > 0 {
		return fmt.Errorf("%s: %d errors", FigDrainNATSBatch, errs.Load())
	}
	return nil
}

// natsPhase runs fn over n tasks and records its rate as figure name,
// with its ratio to its HTTP twin when the run measured that.
func (r *run) natsPhase(name string, n int, fn func() error) error {
	u, err := measure(fn)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	r.sayCPU(name, u.cpu, u.elapsed, n, "task")
	f := Figure{Section: "nats", Name: name, Value: float64(n) / u.elapsed.Seconds(), Unit: "tasks/s"}
	if twin, ok := r.report.Figure(natsTwin[name] + r.suffix); ok && twin.Value > 0 {
		f.Ratio, f.RatioOf = f.Value/twin.Value, "HTTP"
	}
	r.add(f)
	return nil
}
