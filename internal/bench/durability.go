package bench

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/taskledger/taskledger/internal/node"
)

// osSuffix ends the name of a figure measured with --durability os.
const osSuffix = " (os)"

// FigDurabilityCost is the name of the figure that gives, for the
// throughput figure before it, how much slower it is with fsync
// durability than with os.
func FigDurabilityCost(name string) string { return name + ": fsync cost (os ÷ fsync)" }

// durability runs the lifecycle and http sections (and nats, when the
// run measured it) again on a server of
// their own whose answers do not wait for the group commit (serve
// --durability os), their figures named "… (os)", and adds for each
// throughput figure of the run (fsync, the default) its cost: the os
// rate ÷ the fsync rate, with the target of at most 1.3. The raw
// ceilings and floors, which no answer waits on, are left out.
func (r *run) durability(ctx context.Context) error {
	srv, nc, err := startServer(filepath.Join(r.dir, "os"), false)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	defer nc.Close()
	fsync := make(map[string]float64)
	var names []string
	for _, f := range r.report.Figures {
		if f.Unit == "tasks/s" && (f.Section == "lifecycle" || f.Section == "http" || f.Section == "nats") && !strings.Contains(f.Name, "ceiling") && !strings.HasPrefix(f.Name, "raw ") {
			fsync[f.Name] = f.Value
			names = append(names, f.Name)
		}
	}
	apiConn, err := srv.Connect()
	if err != nil {
		return err
	}
	defer apiConn.Close()
	connect := r.connect
	r.suffix, r.connect = osSuffix, srv.Connect
	err = r.withNode(ctx, nc, node.Config{NATSAPIConn: apiConn}, func(nd *node.Node) error {
		if err := r.lifecycle(ctx, nd); err != nil {
			return err
		}
		if err := r.httpSection(ctx, nd); err != nil {
			return err
		}
		if _, ran := fsync[FigEnqueueNATS]; !ran {
			return nil
		}
		return r.natsSection(ctx, nd)
	})
	r.suffix, r.connect = "", connect
	if err != nil {
		return err
	}
	for _, name := range names {
		os, ok := r.report.Figure(name + osSuffix)
		if !ok || fsync[name] <= 0 {
			continue
		}
		cost := os.Value / fsync[name]
		r.add(atMost(Figure{Section: "durability", Name: FigDurabilityCost(name), Value: cost, Unit: "×"}, cost, 1.3, "≤ 1.3×"))
	}
	return nil
}
