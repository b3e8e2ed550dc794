// Package bench measures taskledger's speed side by side with the raw
// JetStream ceiling of the same run: Run starts a fresh embedded server
// and measures, in order, the ceiling (raw sync and async appends, raw
// ordered reads), lifecycle throughput (Go SDK in process and HTTP), the
// HTTP protocol (enqueue, drains, a crowd of waiting long polls), latency
// at half the maximum rate, timer lateness — all with the answers waiting
// for the group commit (--durability fsync) —, the lifecycle and HTTP
// figures again on two fresh servers, with and without it (--durability
// os), and the cost of durability, the same workload in rounds over a
// growing log (growth),
// replay and aggregate loads over a large log, projection memory, memory
// under overload and the sync_always cost, and prints one table. `make bench` and `taskledger bench` run it;
// BENCH_SCALE (Config.Scale) scales the work. WriteMarkdown renders a
// report (the --json output) as docs/benchmarks.md: `make bench-doc`.
//
// The hot functions (codec, aggregate, projection apply) have ordinary Go
// benchmarks in this package's tests, for benchstat:
//
//	make bench-micro COUNT=10 > old.txt   # on the base commit
//	make bench-micro COUNT=10 > new.txt   # with the change
//	go run golang.org/x/perf/cmd/benchstat@latest old.txt new.txt
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/internal/node"
)

// Config configures Run. The zero value runs the defaults.
type Config struct {
	// Scale multiplies the amount of work (tasks, events, messages);
	// default 1, which finishes in a few minutes on two cores.
	Scale float64
	// JSON prints the report as JSON instead of a table.
	JSON bool
	// Dir is where the embedded servers keep their files, in a fresh
	// directory under it that Run removes at the end; default the system
	// temporary directory.
	Dir string
	// ProfileDir, if set, receives one CPU profile per section
	// (ceiling.pprof, lifecycle.pprof, ...), one block profile
	// (ceiling.block.pprof, ...) and the allocations so far
	// (ceiling.allocs.pprof, ...) for `go tool pprof`.
	ProfileDir string
	// Progress receives a line per step while Run works; default
	// os.Stderr.
	Progress io.Writer
	// Only, if set, names the sections to run (Sections); the ceiling
	// always runs, for the ratios, lifecycle runs with latency, timers
	// or burst, whose rates follow its own, and lifecycle and http run
	// with durability, which compares their figures. The report then
	// lacks the other figures.
	Only []string
	// Peers, if set, go into the report as they are (Report.Peers).
	Peers []Peer
}

// Figure is one measured value.
type Figure struct {
	Section string  `json:"section"`
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	// Ratio is the figure as a ratio to the reference RatioOf names,
	// measured in the same run (usually part of the raw ceiling); 0 when
	// the figure has none.
	Ratio   float64 `json:"ratio,omitempty"`
	RatioOf string  `json:"ratioOf,omitempty"`
	// Target is the project's target for the figure, if it has one, and Met
	// whether this run reached it.
	Target string `json:"target,omitempty"`
	Met    *bool  `json:"met,omitempty"`
}

// Report is what Run measured.
type Report struct {
	Scale      float64   `json:"scale"`
	Started    time.Time `json:"started"`
	Seconds    float64   `json:"seconds"` // wall time of the whole run
	GoVersion  string    `json:"goVersion"`
	NumCPU     int       `json:"numCPU"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	Machine    Machine   `json:"machine"`
	// Note is free text WriteMarkdown prints under the date, such as
	// where figures not measured by this Run came from; Run leaves it
	// empty.
	Note    string   `json:"note,omitempty"`
	Figures []Figure `json:"figures"`
	// Peers are other schedulers' results from the same sitting
	// (bench --peers), which WriteMarkdown sets beside the figures.
	Peers []Peer `json:"peers,omitempty"`
}

// Figure returns the figure named name, if the report has it.
func (r *Report) Figure(name string) (Figure, bool) {
	for _, f := range r.Figures {
		if f.Name == name {
			return f, true
		}
	}
	return Figure{}, false
}

// Names of the figures every complete report holds.
const (
	FigSync1         = "raw sync OCC append, 1 publisher"
	FigSync16        = "raw sync OCC append, 16 publishers"
	FigAsync         = "raw async append (≤ 4096 in flight)"
	FigRead          = "raw ordered-consumer read"
	FigLifecycleSDK  = "lifecycle, Go SDK in process"
	FigWritesPerTask = "JetStream writes per task"
	// FigNATSMessagesPerTask counts the messages the node's NATS
	// connection sent and received per task of the Go SDK lifecycle
	// (appends, publishes, acks, tail deliveries, pulls, notifications);
	// a raw async append is two (the publish and its ack).
	FigNATSMessagesPerTask = "NATS messages per task, node connection"
	FigLifecycleCPU        = "lifecycle CPU per task, Go SDK"
	FigLifecycleGarbage    = "lifecycle garbage per task, Go SDK"
	FigLifecycleHTTP       = "lifecycle, HTTP keep-alive clients"
	FigHTTPvsSDK           = "lifecycle HTTP ÷ Go SDK"
	FigSchedClaimP50       = "schedule→claimable p50"
	FigSchedClaimP99       = "schedule→claimable p99"
	FigSchedClaimP999      = "schedule→claimable p999"
	FigClaimP50            = "claim request p50"
	FigClaimP99            = "claim request p99"
	FigClaimP999           = "claim request p999"
	FigReleaseEarly        = "releases before runAt"
	FigReleaseP50          = "release lateness p50"
	FigReleaseP99          = "release lateness p99"
	FigReleaseMax          = "release lateness max"
	FigReleaseGCs          = "collections while releasing"
	FigTimeoutP50          = "timeout lateness p50"
	FigTimeoutP99          = "timeout lateness p99"
	FigTimeoutMax          = "timeout lateness max"
	FigBurstP99            = "burst due at one instant, claimed p99"
	FigBurstMax            = "burst due at one instant, claimed max"
	FigRebuild             = "projection rebuild"
	FigReplayRead          = "raw read of the same stream"
	FigLoadP50             = "aggregate load p50"
	FigLoadP99             = "aggregate load p99"
	FigStartCold           = "start-up without a snapshot"
	FigStartSnapshot       = "start-up from a snapshot"
	FigMemory              = "projection memory per active task"
	FigEpochLive           = "NATS heap per task of a live epoch"
	FigEpochSealed         = "NATS heap per task of a sealed epoch"
	FigEpochRemoved        = "NATS heap per task of a removed epoch"
	FigOverloadGrowth      = "overload: heap growth per task written"
	FigOverloadHeap        = "overload: live heap at the end"
	FigClaim               = "claim decide+append, 16 goroutines"
	FigSyncAlways1         = "sync_always OCC append, 1 publisher"
	FigSyncAlways16        = "sync_always OCC append, 16 publishers"
	FigSyncAlwaysCost      = "sync_always cost (default ÷ sync_always, 16 pub.)"
)

// References of Figure.RatioOf.
const (
	ratioAsync       = "raw async"       // raw async append rate; for lifecycles, of tasks/s × writes per task
	ratioRead        = "raw read"        // raw ordered read of the same stream
	ratioRTT         = "sync append RTT" // one sync OCC append's round trip (1 publisher)
	ratioDefaultSync = "default sync"    // the same append without sync_always
	ratioSync16      = "raw sync 16"     // raw sync OCC appends from 16 publishers
	ratioSDK         = "Go SDK"          // the Go SDK lifecycle rate
)

// FigureNames lists, in table order, the figures every complete report
// holds.
var FigureNames = []string{
	FigSync1, FigSync16, FigAsync, FigRead, FigClaim,
	FigLifecycleSDK, FigLifecycleFloor, FigLifecycleFloorWide, FigWritesPerTask, FigNATSMessagesPerTask, FigLifecycleCPU, FigLifecycleGarbage, FigLifecycleHTTP, FigHTTPvsSDK,
	FigHTTPCeilingEnqueue, FigHTTPCeilingBatch, FigHTTPCeilingDrain, FigHTTPCeilingCPU, FigHTTPCeilingBatchDrain,
	FigEnqueueFloorOne, FigEnqueueFloor, FigBatchDrainFloor,
	FigEnqueueHTTP, FigEnqueueWrites, FigEnqueueBatch, FigDrainHTTP, FigDrainErrors, FigDrainCPU, FigDrainGarbage,
	FigDrainBatch, FigDrainBatchCPU, FigDrainBatchGarb,
	FigEnqueueNATS, FigDrainNATS, FigDrainNATSErrors, FigDrainNATSBatch,
	FigWaitingPolls, FigWaitingMemory, FigWaiterMemory, FigWaitingClaimP99, FigWaitingErrors,
	FigSchedClaimP50, FigSchedClaimP99, FigSchedClaimP999, FigClaimP50, FigClaimP99, FigClaimP999,
	FigReleaseEarly, FigReleaseP50, FigReleaseP99, FigReleaseMax, FigReleaseGCs, FigTimeoutP50, FigTimeoutP99, FigTimeoutMax, FigBurstP99, FigBurstMax, FigFireP50, FigFireP99, FigFireMax,
	FigGrowthEnqueue, FigGrowthBatch, FigGrowthDrain, FigGrowthBatchDrain, FigGrowthCPU,
	FigRebuild, FigReplayRead, FigStartCold, FigStartSnapshot, FigLoadP50, FigLoadP99,
	FigMemory, FigEpochLive, FigEpochSealed, FigEpochRemoved, FigOverloadGrowth, FigOverloadHeap,
	FigSyncAlways1, FigSyncAlways16, FigSyncAlwaysCost,
}

// run is the state of one Run: its configuration, the report being
// filled and the figures later sections compare against.
type run struct {
	cfg    Config
	log    io.Writer
	dir    string
	report *Report

	// Measured earlier in the run, for the sections after.
	sync1Rate, sync16Rate, asyncRate float64
	httpRates                        map[string]float64 // the raw HTTP ceilings' and floors' tasks/s, by figure
	sdkRate                          float64            // lifecycle tasks/s through the Go SDK
	schedRate                        float64            // schedule calls/s during that lifecycle

	// connect opens a client connection to the run's default server
	// (the NATS section's).
	connect func(...nats.Option) (*nats.Conn, error)

	// suffix ends the names and sections of the figures being added
	// (osSuffix while the durability section repeats others).
	suffix string
}

// Run measures everything, in the order the package comment gives, on a
// fresh embedded server with file storage, writes progress lines to
// cfg.Progress, and writes the table (or JSON) to out. It takes a few
// minutes at Scale 1 and uses all CPUs; run it on an otherwise idle
// machine for figures worth comparing. ctx cancels it. It returns the
// report, also when writing it fails, and the first error.
func Run(ctx context.Context, cfg Config, out io.Writer) (Report, error) {
	if cfg.Scale == 0 {
		cfg.Scale = 1
	}
	if !(cfg.Scale > 0) || math.IsInf(cfg.Scale, 0) {
		return Report{}, fmt.Errorf("bench: scale %v: want a positive number", cfg.Scale)
	}
	if cfg.Progress == nil {
		cfg.Progress = os.Stderr
	}
	if cfg.Dir == "" {
		cfg.Dir = os.TempDir()
	}
	for _, name := range cfg.Only {
		if !slices.Contains(Sections, name) {
			return Report{}, fmt.Errorf("bench: no section %q: want one of %s", name, strings.Join(Sections, ", "))
		}
	}
	if slices.ContainsFunc(cfg.Only, func(s string) bool { return s == "latency" || s == "timers" || s == "burst" }) {
		cfg.Only = append(slices.Clone(cfg.Only), "lifecycle")
	}
	if slices.Contains(cfg.Only, "durability") {
		cfg.Only = append(slices.Clone(cfg.Only), "lifecycle", "http")
	}
	dir, err := os.MkdirTemp(cfg.Dir, "taskledger-bench-")
	if err != nil {
		return Report{}, fmt.Errorf("bench: data directory: %w", err)
	}
	defer os.RemoveAll(dir)
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return Report{}, fmt.Errorf("bench: profile directory: %w", err)
		}
	}
	// The nodes' loggers and the bench's own lines write from many
	// goroutines: one lock keeps them whole and the writer race-free.
	r := &run{cfg: cfg, log: zerolog.SyncWriter(cfg.Progress), dir: dir, report: &Report{
		Scale: cfg.Scale, Started: time.Now().UTC(), GoVersion: runtime.Version(),
		NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Machine: thisMachine(),
		Peers: cfg.Peers,
	}}
	r.say("scale %g, data in %s, %d CPUs, GOMAXPROCS %d", cfg.Scale, dir, r.report.NumCPU, r.report.GOMAXPROCS)
	err = r.all(ctx)
	r.report.Seconds = time.Since(r.report.Started).Seconds()
	r.say("done in %.1fs", r.report.Seconds)
	if err != nil {
		return *r.report, err
	}
	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(r.report)
	} else {
		err = WriteTable(out, *r.report)
	}
	return *r.report, err
}

// all runs the sections in order: the ceiling on the server's raw
// streams; lifecycle, http, nats, latency and timers on one scheduler
// node whose
// answers wait for the group commit (--durability fsync, the default);
// lifecycle and http again on two fresh servers, fsync and os (durability);
// rounds of the same workload on another (growth); replay on a large
// stream of its own; memory without a server; sync-always on a server of
// its own.
func (r *run) all(ctx context.Context) error {
	srv, nc, err := startServer(filepath.Join(r.dir, "default"), false)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	defer nc.Close()
	r.connect = srv.Connect
	if err := r.section(ctx, "ceiling", func(ctx context.Context) error { return r.ceiling(ctx, nc) }); err != nil {
		return err
	}
	apiConn, err := srv.Connect(nats.Name("taskledger API over NATS"))
	if err != nil {
		return err
	}
	defer apiConn.Close()
	if err := r.withNode(ctx, nc, node.Config{Durable: srv, NATSAPIConn: apiConn}, func(nd *node.Node) error {
		for _, s := range []struct {
			name string
			fn   func(context.Context, *node.Node) error
		}{{"lifecycle", r.lifecycle}, {"http", r.httpSection}, {"nats", r.natsSection}, {"latency", r.latency}, {"timers", r.timers}, {"burst", r.burst}} {
			if err := r.section(ctx, s.name, func(ctx context.Context) error { return s.fn(ctx, nd) }); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := r.section(ctx, "durability", r.durability); err != nil {
		return err
	}
	if err := r.section(ctx, "growth", r.growth); err != nil {
		return err
	}
	if err := r.section(ctx, "replay", func(ctx context.Context) error { return r.replay(ctx, nc) }); err != nil {
		return err
	}
	if err := r.section(ctx, "memory", r.memory); err != nil {
		return err
	}
	if err := r.section(ctx, "epochs", func(ctx context.Context) error { return r.epochs(ctx, nc) }); err != nil {
		return err
	}
	if err := r.section(ctx, "overload", func(ctx context.Context) error { return r.overload(ctx, nc) }); err != nil {
		return err
	}
	return r.section(ctx, "sync-always", r.syncAlways)
}

// Sections are the sections of a run after the ceiling, in order.
var Sections = []string{"lifecycle", "http", "nats", "latency", "timers", "burst", "durability", "growth", "replay", "memory", "epochs", "overload", "sync-always"}

// section runs fn under a CPU profile when profiles are asked for, unless
// Config.Only leaves it out.
func (r *run) section(ctx context.Context, name string, fn func(context.Context) error) error {
	if name != "ceiling" && len(r.cfg.Only) > 0 && !slices.Contains(r.cfg.Only, name) {
		return nil
	}
	r.say("— %s", name)
	if r.cfg.ProfileDir != "" && name != "growth" { // growth profiles each round itself
		f, err := os.Create(filepath.Join(r.cfg.ProfileDir, name+".pprof"))
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench: cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
		// Where goroutines wait, for a stage that leaves cores idle.
		runtime.SetBlockProfileRate(int(time.Millisecond))
		defer func() {
			runtime.SetBlockProfileRate(0)
			r.writeProfile(name+".block.pprof", "block")
			// Allocations since the start of the run: subtract the
			// previous section's with go tool pprof -diff_base.
			r.writeProfile(name+".allocs.pprof", "allocs")
		}()
	}
	forced := collections("forced")
	if err := fn(ctx); err != nil {
		return fmt.Errorf("bench: %s: %w", name, err)
	}
	if collections("forced") > forced {
		t0 := time.Now()
		made := unforce()
		r.say("  %d MB of garbage for the pacer's own collections after the section's forced ones (%s)", made>>20, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// collections counts the collections of a kind the process has
// completed since it started: "forced" (runtime.GC or
// debug.FreeOSMemory), "automatic" (the pacer's) or "total".
func collections(kind string) uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/" + kind + ":gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// writeProfile writes the named runtime profile into the profile
// directory; a profile that cannot be written is reported and skipped.
func (r *run) writeProfile(file, profile string) {
	f, err := os.Create(filepath.Join(r.cfg.ProfileDir, file))
	if err == nil {
		err = pprof.Lookup(profile).WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		r.say("  profile %s not written: %v", file, err)
	}
}

// say writes a progress line.
func (r *run) say(format string, args ...any) {
	fmt.Fprintf(r.log, "bench: "+format+"\n", args...)
}

// sayCPU reports the CPU time (of the whole process, server included) a
// phase of n operations used, per operation and as busy cores.
func (r *run) sayCPU(name string, cpu, elapsed time.Duration, n int, op string) {
	if cpu > 0 && n > 0 {
		r.say("  %s: %.0f µs of CPU per %s, %.2f of %d cores busy", name,
			float64(cpu.Microseconds())/float64(n), op, cpu.Seconds()/elapsed.Seconds(), runtime.NumCPU())
	}
}

// scaled returns n times the scale, but at least lo.
func (r *run) scaled(n, lo int) int { return max(int(float64(n)*r.cfg.Scale), lo) }

// add records a figure and prints it as a progress line.
func (r *run) add(f Figure) {
	f.Name += r.suffix
	f.Section += r.suffix
	r.report.Figures = append(r.report.Figures, f)
	line := fmt.Sprintf("%s: %s %s", f.Name, formatValue(f.Value), f.Unit)
	if f.RatioOf != "" {
		line += fmt.Sprintf(" (%s %s)", formatRatio(f.Ratio), f.RatioOf)
	}
	r.say("  %s", line)
}

// atLeast and atMost fill in a figure's target and whether v met it.
func atLeast(f Figure, v, limit float64, target string) Figure {
	ok := v >= limit
	f.Target, f.Met = target, &ok
	return f
}

func atMost(f Figure, v, limit float64, target string) Figure {
	ok := v <= limit
	f.Target, f.Met = target, &ok
	return f
}

// rttRatio expresses a duration in ms as a multiple of one sync OCC
// append's round trip (1 publisher) of this run.
func (r *run) rttRatio(f Figure) Figure {
	if r.sync1Rate > 0 {
		f.Ratio, f.RatioOf = f.Value/(1000/r.sync1Rate), ratioRTT
	}
	return f
}

// WriteTable writes the report's figures as an aligned text table.
func WriteTable(w io.Writer, rep Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tunit\tvs ceiling\ttarget\tmet")
	for _, f := range rep.Figures {
		ratio, met := "—", "—"
		if f.RatioOf != "" {
			ratio = formatRatio(f.Ratio) + " " + f.RatioOf
		}
		if f.Met != nil {
			met = map[bool]string{true: "yes", false: "no"}[*f.Met]
		}
		target := f.Target
		if target == "" {
			target = "—"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, formatValue(f.Value), f.Unit, ratio, target, met)
	}
	procs := ""
	if rep.GOMAXPROCS != rep.NumCPU { // set by hand (or a CPU quota): it changes the figures
		procs = fmt.Sprintf(", GOMAXPROCS %d", rep.GOMAXPROCS)
	}
	fmt.Fprintf(tw, "(scale %g, %d CPUs%s, %s, %.0fs)\n", rep.Scale, rep.NumCPU, procs, rep.GoVersion, rep.Seconds)
	return tw.Flush()
}

// formatValue prints a figure with three significant digits or as a
// whole number.
func formatValue(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func formatRatio(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.0f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

// Missing returns the names of FigureNames the report lacks.
func (r *Report) Missing() []string {
	var out []string
	for _, name := range FigureNames {
		if _, ok := r.Figure(name); !ok {
			out = append(out, name)
		}
	}
	return out
}

// unforce makes garbage until the pacer has started and ended
// pacerMemory collections itself (or 30 s have passed), so that the
// collections a section forced to measure memory leave nothing in its
// estimates, and returns how many bytes it made. A collection forced while the
// process rests teaches the pacer that marking costs nearly nothing:
// the collections it starts next begin at their heap goal, and every
// goroutine that allocates helps mark until they end. After the HTTP
// section's memory measurements, that stood the whole process still
// for 300–600 ms in the timers section.
func unforce() (made int) {
	want := collections("automatic") + pacerMemory
	deadline := time.Now().Add(30 * time.Second)
	for collections("automatic") < want && time.Now().Before(deadline) {
		for range 64 {
			made += len(make([]byte, garbageChunk))
		}
	}
	return made
}

// pacerMemory is how many collections the Go pacer's estimate of the
// cost of marking draws on: the largest of the last five
// (gcControllerState.endCycle in runtime/mgcpacer.go).
const pacerMemory = 5

// garbageChunk is what unforce allocates at a time; a variable, because
// a slice of constant size may be allocated on the stack.
var garbageChunk = 64 << 10
