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

// durability runs the lifecycle and http sections twice more, each time
// on a fresh server of its own: first with the answers waiting for the
// group commit (serve --durability fsync, the default), their figures
// named "… (fsync)", then without it (--durability os), named "… (os)".
// Both start from an empty log, so the ratio measures durability alone,
// not the history the main run's server has gathered. For each
// throughput figure it adds the cost: the os rate ÷ the fsync rate, with
// the target of at most 1.3. The raw ceilings and floors, which no answer
// waits on, are measured once, by the main run.
func (r *run) durability(ctx context.Context) error {
	defer func() { r.suffix = "" }()
	for _, mode := range []struct {
		dir, suffix string
		durable     bool
	}{{"fsync", fsyncSuffix, true}, {"os", osSuffix, false}} {
		srv, nc, err := startServer(filepath.Join(r.dir, mode.dir), false)
		if err != nil {
			return err
		}
		cfg := node.Config{}
		if mode.durable {
			cfg.Durable = srv
		}
		r.suffix = mode.suffix
		err = r.withNode(ctx, nc, cfg, func(nd *node.Node) error {
			if err := r.lifecycle(ctx, nd); err != nil {
				return err
			}
			return r.httpSection(ctx, nd)
		})
		nc.Close()
		srv.Shutdown()
		if err != nil {
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
