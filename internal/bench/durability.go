package bench

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/taskledger/taskledger/internal/node"
)

// The suffixes of the figures the durability section measures, one for
// each mode.
const (
	fsyncSuffix = " (fsync)"
	osSuffix    = " (os)"
)

// FigDurabilityCost is the name of the figure that gives, for the
// throughput figure named, how much slower it is with fsync durability
// than with os.
func FigDurabilityCost(name string) string { return name + ": fsync cost (os ÷ fsync)" }

// durability runs the lifecycle and http sections (and nats, when the
// run measured it) twice more, each time on a fresh server of its own:
// first with the answers waiting for the group commit (serve
// --durability fsync, the default), their figures named "… (fsync)",
// then without it (--durability os), named "… (os)". Both start from an
// empty log, so the ratio measures durability alone, not the history the
// main run's server has gathered. For each throughput figure it adds the
// cost: the os rate ÷ the fsync rate, with the target of at most 1.3. The
// raw ceilings and floors, which no answer waits on, are measured once,
// by the main run.
func (r *run) durability(ctx context.Context) error {
	_, nats := r.report.Figure(FigEnqueueNATS)
	connect := r.connect
	defer func() { r.suffix, r.connect = "", connect }()
	for _, mode := range []struct {
		dir, suffix string
		durable     bool
	}{{"fsync", fsyncSuffix, true}, {"os", osSuffix, false}} {
		if err := r.durabilityMode(ctx, mode.dir, mode.suffix, mode.durable, nats); err != nil {
			return err
		}
	}
	r.suffix = ""
	for _, f := range r.report.Figures {
		name, ok := strings.CutSuffix(f.Name, fsyncSuffix)
		if !ok || f.Unit != "tasks/s" || f.Value <= 0 || strings.HasPrefix(name, "raw ") {
			continue
		}
		os, ok := r.report.Figure(name + osSuffix)
		if !ok {
			continue
		}
		cost := os.Value / f.Value
		r.add(atMost(Figure{Section: "durability", Name: FigDurabilityCost(name), Value: cost, Unit: "×"}, cost, 1.3, "≤ 1.3×"))
	}
	return nil
}

// durabilityMode runs one mode of the durability section on a fresh
// server in dir/name, its figures named with suffix.
func (r *run) durabilityMode(ctx context.Context, name, suffix string, durable, withNATS bool) error {
	srv, nc, err := startServer(filepath.Join(r.dir, name), false)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	defer nc.Close()
	apiConn, err := srv.Connect()
	if err != nil {
		return err
	}
	defer apiConn.Close()
	cfg := node.Config{NATSAPIConn: apiConn}
	if durable {
		cfg.Durable = srv
	}
	r.suffix, r.connect = suffix, srv.Connect
	return r.withNode(ctx, nc, cfg, func(nd *node.Node) error {
		if err := r.lifecycle(ctx, nd); err != nil {
			return err
		}
		if err := r.httpSection(ctx, nd); err != nil {
			return err
		}
		if !withNATS {
			return nil
		}
		return r.natsSection(ctx, nd)
	})
}
