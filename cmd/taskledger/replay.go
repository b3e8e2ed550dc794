package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/archive"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/replay"
)

// offline says whether a command reads the log directly (--data given
// explicitly, or --nats-url) instead of asking a server.
type offline struct {
	nf natsFlags
}

func (o *offline) register(fs flagSet) {
	o.nf.register(fs)
}

// openLog connects to the log (the NATS URL, or an embedded server on the
// data directory, which no running `taskledger serve` may be using) and
// returns a reader of it, sharded as its metadata records
// (eventlog.ReadShards), and what closes the connection.
func (o *offline) openLog(ctx context.Context) (eventlog.Log, func(), error) {
	if o.nf.url == "" {
		if _, err := os.Stat(o.nf.data); err != nil {
			return eventlog.Log{}, nil, fmt.Errorf("data directory: %w", err)
		}
	}
	nc, _, closeNATS, err := o.nf.connect(zerolog.Nop())
	if err != nil {
		return eventlog.Log{}, nil, err
	}
	js, err := jetstream.New(nc)
	if err == nil {
		var shards events.Shards
		if shards, err = eventlog.ReadShards(ctx, js, o.nf.stream); err == nil {
			return eventlog.Log{JS: js, Stream: o.nf.stream, Shards: shards}, closeNATS, nil
		}
	}
	closeNATS()
	return eventlog.Log{}, nil, err
}

// taskReader reads a task's or a lineage's events: eventlog.Log, or an
// archive.Archive.
type taskReader interface {
	Task(ctx context.Context, id string) ([]events.Event, error)
	LineageOf(ctx context.Context, id string) ([]events.Event, error)
}

// timeline returns the timeline of task id read from r (named where in
// an error), or with tree of its whole lineage.
func timeline(ctx context.Context, r taskReader, id string, tree bool, where string) ([]replay.Entry, error) {
	read := r.Task
	if tree {
		read = r.LineageOf
	}
	evs, err := read(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 {
		return nil, fmt.Errorf("task %s: not in %s", id, where)
	}
	return replay.Timeline(evs), nil
}

func historyCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("history")
	var cf clientFlags
	cf.register(fs)
	var off offline
	off.register(fs)
	tree := fs.Bool("tree", false, "the whole lineage (root and descendants), interleaved by time")
	ndjson := fs.Bool("ndjson", false, "one JSON entry per line")
	customer := fs.String("customer", "", "stream this customer's events instead of one task's")
	since := fs.String("since", "", "with --customer: from this RFC 3339 time or duration ago (e.g. 1h)")
	offlineMode := fs.Bool("offline", false, "read the log directly from --data (or --nats-url) instead of a server")
	archiveDir := fs.String("archive", "", "read the task from this archive directory (taskledger archive) instead of a server")
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	}
	if (id == "") == (*customer == "") {
		return fmt.Errorf("%w: give a task id, or --customer", errUsage)
	}
	direct := *offlineMode || off.nf.url != "" || *archiveDir != ""
	var entries []replay.Entry
	switch {
	case *customer != "" && *archiveDir != "":
		return fmt.Errorf("%w: --customer reads a log, not an archive", errUsage)
	case *customer != "":
		from, err := parseSince(*since)
		if err != nil {
			return err
		}
		return customerHistory(ctx, stdout, cf, off, direct, *customer, from, *ndjson || cf.json)
	case *archiveDir != "":
		a, err := archive.Open(*archiveDir)
		if err != nil {
			return err
		}
		if entries, err = timeline(ctx, a, id, *tree, "the archive"); err != nil {
			return err
		}
	case direct:
		log, closeLog, err := off.openLog(ctx)
		if err != nil {
			return err
		}
		defer closeLog()
		if entries, err = timeline(ctx, log, id, *tree, "the log"); err != nil {
			return err
		}
	default:
		c := cf.client()
		history := c.History
		if *tree {
			history = c.LineageHistory
		}
		h, err := history(ctx, id)
		if err != nil {
			return err
		}
		for _, e := range h.Events {
			entries = append(entries, replay.Entry{Seq: events.Position(e.Seq), At: e.At, TaskID: e.TaskID, Type: e.Type, Actor: e.Actor, Status: e.Status, Detail: e.Detail, Data: e.Data})
		}
	}
	switch {
	case *ndjson:
		return replay.WriteNDJSON(stdout, entries)
	case cf.json:
		return printJSON(stdout, entries)
	}
	if err := replay.WriteText(stdout, entries, *tree); err != nil || direct {
		return err
	}
	return printRunSummary(ctx, stdout, cf.client(), id)
}

func parseSince(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, fmt.Errorf("%w: --since wants an RFC 3339 time or a duration", errUsage)
	}
	return t, nil
}

func customerHistory(ctx context.Context, stdout io.Writer, cf clientFlags, off offline, direct bool, customer string, since time.Time, asJSON bool) error {
	emit := func(e replay.Entry) error {
		if asJSON {
			return json.NewEncoder(stdout).Encode(e)
		}
		_, err := fmt.Fprintf(stdout, "%d %s %s %s %s %s\n", e.Seq, e.At.Format("2006-01-02T15:04:05.000Z"), e.TaskID, e.Type, e.Status, e.Detail)
		return err
	}
	if !direct {
		return cf.client().CustomerEvents(ctx, customer, since, func(e api.Event) error {
			return emit(replay.Entry{Seq: events.Position(e.Seq), At: e.At, TaskID: e.TaskID, Type: e.Type, Actor: e.Actor, Status: e.Status, Detail: e.Detail, Data: e.Data})
		})
	}
	log, closeLog, err := off.openLog(ctx)
	if err != nil {
		return err
	}
	defer closeLog()
	states := replay.NewStatusTracker()
	return log.Customer(ctx, customer, since, func(ev events.Event) error {
		return emit(states.Entry(ev))
	}, func(c *events.CorruptError) error {
		return emit(replay.Entry{Seq: c.Pos, At: c.At, TaskID: c.TaskID(), Type: api.EventQuarantined,
			Detail: "does not decode (quarantined): " + c.Err.Error(), Data: api.QuarantinedData{Reason: c.Err.Error()}})
	})
}

func replayCommand(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: replay verify | replay rebuild | replay quarantine", errUsage)
	}
	switch args[0] {
	case "verify":
		return verifyCommand(ctx, args[1:], stdout)
	case "rebuild":
		return rebuildCommand(ctx, args[1:], stdout)
	case "quarantine":
		return quarantineCommand(ctx, args[1:], stdout)
	}
	return fmt.Errorf("%w: unknown replay command %q (verify, rebuild, quarantine)", errUsage, args[0])
}

func verifyCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("replay verify")
	var off offline
	off.register(fs)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	archiveDir := fs.String("archive", "", "verify this archive directory (taskledger archive) instead of the log")
	chainKey := chainKeyFlag(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	keyFile := chainKeyPath(*chainKey, off.nf)
	var (
		v     *replay.Verifier
		runs  replay.RunReader = noRuns{}
		heads []eventlog.Head
		read  func(fn func(eventlog.Message) error) error
		bar   = newProgress("verify")
	)
	if *archiveDir != "" {
		a, err := archive.Open(*archiveDir)
		if err != nil {
			return err
		}
		v = archiveVerifier(a.Manifest)
		chain, err := verifyChain(keyFile, a.Manifest.Stream, a.Manifest.Layout())
		if err != nil {
			return err
		}
		v.Keyed(chain)
		heads = a.Manifest.Heads()
		// The Runs the archive holds, if it holds them (runsFile).
		archived, ok, err := archivedRuns(*archiveDir)
		switch {
		case err != nil:
			return err
		case ok:
			runs = archived
		default:
			runs = nil
		}
		read = func(fn func(eventlog.Message) error) error {
			var n uint64
			total := a.Manifest.Events()
			defer bar.update(total, total)
			return a.Read(ctx, func(m eventlog.Message) error {
				if n++; n%50000 == 0 {
					bar.update(n, total)
				}
				return fn(m)
			})
		}
	} else {
		log, closeLog, err := off.openLog(ctx)
		if err != nil {
			return err
		}
		defer closeLog()
		v = replay.NewVerifier(events.DefaultSubjects)
		v.Shard(log.Shards)
		chain, err := verifyChain(keyFile, log.WithDefaults().Stream, log.Shards)
		if err != nil {
			return err
		}
		v.Keyed(chain)
		for i := range log.Shards.N() {
			first, err := log.FirstSeq(ctx, i)
			if err != nil {
				return err
			}
			v.StartAt(i, first)
		}
		if heads, err = node.LoadHeads(ctx, log.JS, off.nf.stream); err != nil {
			return err
		}
		read = func(fn func(eventlog.Message) error) error {
			return log.Read(ctx, eventlog.ReadOptions{Progress: bar.update}, fn)
		}
		// Every Run revision the log records is read back against its
		// digest (no bucket: each is reported unreadable).
		bucket, err := store.LookupRuns(ctx, log.JS, off.nf.stream)
		switch {
		case err == nil:
			runs = bucket
		case !errors.Is(err, store.ErrNoRun):
			return err
		}
	}
	for _, head := range heads {
		v.ExpectHead(head.Pos, head.Hash)
	}
	err := read(func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	})
	if err == nil && runs != nil {
		err = v.VerifyRuns(ctx, runs)
	}
	report := v.Report()
	bar.done()
	if err != nil {
		return err
	}
	if *asJSON {
		if err := printJSON(stdout, report); err != nil {
			return err
		}
	} else {
		for _, v := range report.Violations {
			fmt.Fprintf(stdout, "seq %d task %s: %s: %s\n", v.Seq, v.TaskID, v.Kind, v.Detail)
		}
		fmt.Fprintf(stdout, "%d events, %d tasks, %d violations\n", report.Events, report.Tasks, len(report.Violations))
		for _, head := range heads {
			fmt.Fprintf(stdout, "saved chain head: sequence %d, sha256 %x\n", head.Pos, head.Hash)
		}
	}
	if !report.Clean() {
		return errViolations
	}
	return nil
}

// archiveVerifier is the verifier of an archive's events.
func archiveVerifier(m archive.Manifest) *replay.Verifier {
	v := replay.NewVerifier(events.Subjects{Root: m.Subjects})
	v.Shard(m.Layout())
	if m.EpochSlots > 0 { // one epoch of several
		v.Partial()
	}
	for _, p := range m.Parts {
		v.StartAt(p.Part, p.FirstSeq)
	}
	return v
}

// noRuns is the Run store of a log without a runs bucket: every
// revision is missing.
type noRuns struct{}

func (noRuns) Revisions(context.Context, string, uint64, uint64, func(uint64, []byte) error) error {
	return errors.New("no runs bucket")
}

// errViolations makes verify exit non-zero without repeating the report.
var errViolations = fmt.Errorf("the log breaks invariants")

// progress prints a progress bar on a terminal and progress lines otherwise.
type progress struct {
	what    string
	start   time.Time
	tty     bool
	lastLog time.Time
}

func newProgress(what string) *progress {
	return &progress{what: what, start: time.Now(), tty: isatty.IsTerminal(os.Stderr.Fd())}
}

func (p *progress) update(seq, last uint64) {
	if last == 0 {
		return
	}
	elapsed := time.Since(p.start)
	rate := float64(seq) / max(elapsed.Seconds(), 1e-9)
	eta := time.Duration(float64(last-seq) / max(rate, 1e-9) * float64(time.Second))
	frac := float64(seq) / float64(last)
	if p.tty {
		bar := strings.Repeat("#", int(frac*30)) + strings.Repeat(".", 30-int(frac*30))
		fmt.Fprintf(os.Stderr, "\r%s [%s] %d/%d events %.0f/s ETA %s   ", p.what, bar, seq, last, rate, eta.Round(time.Second))
		return
	}
	if time.Since(p.lastLog) >= 2*time.Second || seq == last {
		p.lastLog = time.Now()
		fmt.Fprintf(os.Stderr, "%s: %d/%d events (%.1f%%), %.0f events/s, ETA %s\n", p.what, seq, last, 100*frac, rate, eta.Round(time.Second))
	}
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprintln(os.Stderr)
	}
}

// rebuildCommand drops the stored projection snapshot, rebuilds the
// projections from sequence 1 and writes a fresh snapshot, so the next
// start loads it instead of replaying everything.
func rebuildCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("replay rebuild")
	var off offline
	off.register(fs)
	retain := retainFlag(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkRetain(*retain); err != nil {
		return err
	}
	log, closeLog, err := off.openLog(ctx)
	if err != nil {
		return err
	}
	defer closeLog()
	snaps, err := projections.OpenObjectSnapshots(ctx, log.JS, node.SnapshotBucket(off.nf.stream), "projections", off.nf.replicas)
	if err != nil {
		return err
	}
	if err := snaps.Delete(ctx); err != nil {
		return fmt.Errorf("dropping the old snapshot: %w", err)
	}
	positions, err := log.LastPositions(ctx)
	if err != nil {
		return err
	}
	eng, err := projections.New(projections.Config{Log: log, Shards: log.Shards, Snapshots: snaps, Retain: *retain})
	if err != nil {
		return err
	}
	start := time.Now()
	bar := newProgress("rebuild")
	if err := eng.RebuildTo(ctx, positions, bar.update); err != nil {
		return err
	}
	last := eng.Applied()
	bar.done()
	elapsed := time.Since(start)
	if err := eng.SaveSnapshot(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rebuilt %d events in %s (%.0f events/s); snapshot written; digest %s\n",
		last, elapsed.Round(time.Millisecond), float64(last)/max(elapsed.Seconds(), 1e-9), eng.Digest())
	return nil
}
