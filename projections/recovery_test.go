package projections_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testlog"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// running is a node with its info-level JSON log.
type running struct {
	*testnode.Node
	log *testlog.Buffer
}

// startLoggedNode runs a node on nc and ns (fresh ones when nil and zero) with
// snapshots on and its log captured, and waits until its projections have
// caught up.
func startLoggedNode(t *testing.T, nc *nats.Conn, ns testnats.Namespace, cfgs ...func(*node.Config)) *running {
	t.Helper()
	logs := &testlog.Buffer{}
	opts := []testnode.Option{testnode.On(nc, ns), func(c *node.Config) { c.Logger = zerolog.New(logs).Level(zerolog.InfoLevel) }}
	for _, f := range cfgs {
		opts = append(opts, f)
	}
	return &running{Node: testnode.Start(t, opts...), log: logs}
}

// logLines returns the node's log lines with message msg, decoded.
func (r *running) logLines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.log.String()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if line["message"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// logUint returns field of the single log line with message msg.
func (r *running) logUint(t *testing.T, msg, field string) uint64 {
	t.Helper()
	lines := r.logLines(t, msg)
	if len(lines) != 1 {
		t.Fatalf("%d log lines %q, want 1; log:\n%s", len(lines), msg, r.log.String())
	}
	v, ok := lines[0][field].(float64)
	if !ok {
		t.Fatalf("log line %q has no %s: %v", msg, field, lines[0])
	}
	return uint64(v)
}

// settledTraffic runs n root tasks (every fifth with a child, every
// seventh task canceled, mail on some) to completion and waits until the node
// has applied everything and has no release, delivery or report left.
func settledTraffic(t *testing.T, r *running, n int) {
	t.Helper()
	svc, op, ctx := r.Service, scheduler.Operator, context.Background()
	queue := "snap"
	var tasks []string
	for i := range n {
		st, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{CustomerID: fmt.Sprintf("c%d", i%4), Queue: queue, Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "work"}}}})
		if err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, st.TaskID)
		if i%5 == 0 {
			child, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{CustomerID: st.CustomerID, ParentID: st.TaskID, Queue: queue, Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "help"}}}})
			if err != nil {
				t.Fatal(err)
			}
			tasks = append(tasks, child.TaskID)
		}
		if i%3 == 0 {
			if _, _, err := svc.AppendMail(ctx, op, st.TaskID, events.Message{Content: []events.ContentPart{{Type: "text", Text: "note"}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, id := range tasks {
		if i%7 == 3 {
			if _, err := svc.Cancel(ctx, op, id, "skip"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Until no task waits: a child whose parent ended first is canceled
	// by the claim that finds it, instead of claimed.
	waiting := func() int {
		n := 0
		for _, st := range []aggregate.Status{aggregate.StatusScheduled, aggregate.StatusQueued} {
			n += len(r.Engine.List(projections.Filter{Status: st}, "", len(tasks)))
		}
		return n
	}
	var claimed atomic.Int64
	var g errgroup.Group
	deadline := time.Now().Add(60 * time.Second)
	for w := range 2 {
		g.Go(func() error {
			for waiting() > 0 {
				if time.Now().After(deadline) {
					return fmt.Errorf("%d claims, %d tasks still waiting after 60s", claimed.Load(), waiting())
				}
				st, ok, err := svc.ClaimNext(ctx, op, queue, fmt.Sprintf("w%d", w), 200*time.Millisecond)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				claimed.Add(1)
				if _, err := svc.RecordResult(ctx, op, st.TaskID, st.Claim.DeliveryID, events.Result{Success: true, Summary: "ok"}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	testnode.Eventually(t, "traffic settled", func() bool {
		last := logSeqs(t, r.Store)
		e := r.Engine
		return e.Applied() == last && e.TimerLen(projections.Release) == 0 && e.TimerLen(projections.Deliver) == 0 &&
			e.TimerLen(projections.Report) == 0 && e.TimerLen(projections.Expire) == 0 &&
			len(e.List(projections.Filter{Status: aggregate.StatusQueued}, "", 1)) == 0
	})
}

// rebuiltDigest is the digest of projections folded afresh from the whole
// log up to last.
func rebuiltDigest(t *testing.T, js jetstream.JetStream, ns testnats.Namespace, last uint64) string {
	t.Helper()
	e := mustEngine(projections.Config{Log: eventlog.Log{JS: js, Stream: ns.Stream, Subjects: ns.Subjects}})
	if err := e.RebuildTo(context.Background(), []events.Position{events.Position(last)}, nil); err != nil {
		t.Fatal(err)
	}
	return e.Digest()
}

// snapshotApplied reads the applied sequence a stored snapshot claims.
func snapshotApplied(t *testing.T, data []byte) uint64 {
	t.Helper()
	var s struct {
		Applied uint64 `msgpack:"applied"`
	}
	if err := msgpack.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s.Applied
}

// TestSnapshotRecovery runs a node with frequent snapshots, then restarts
// it on the same log with a corrupted snapshot, a snapshot of a longer
// stream, one of an older format and a valid one: the first three are
// ignored and the projections rebuilt (labels included), the last is loaded and caught up from; every time the result
// equals a fresh rebuild of the log.
func TestSnapshotRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, ns := testnats.Conn(t), testnats.NewNamespace(t)
	every := func(c *node.Config) { c.SnapshotEvery = 50 }
	first := startLoggedNode(t, nc, ns, every)
	settledTraffic(t, first, 100)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The chain head goes with every snapshot, and at clean shutdown.
	headAt := func(want uint64) {
		t.Helper()
		h, ok, err := node.LoadHead(ctx, js, ns.Stream)
		if err != nil || !ok || h.Pos != events.Position(want) {
			t.Fatalf("chain head %+v (saved %v, %v), want one at %d", h, ok, err, want)
		}
		if err := first.Store.Log().Check(ctx, h); err != nil {
			t.Fatalf("the log does not hold its own chain head: %v", err)
		}
	}
	labeled := events.NewID() // a labeled task in the snapshot
	lst, _, err := first.Store.Execute(ctx, labeled, "", aggregate.Schedule{TaskID: labeled, CustomerID: "late", Spec: events.TaskSpec{
		RootID: labeled, Queue: "snap", TimeoutSeconds: 60, RunAt: time.Now().Add(time.Hour), Labels: map[string]string{"kind": "snap"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Engine.WaitFor(ctx, lst.LastSeq); err != nil {
		t.Fatal(err)
	}
	if err := first.Engine.SaveSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	headAt(first.Engine.Applied())
	id := events.NewID() // an event after the snapshot
	if _, _, err := first.Store.Execute(ctx, id, "", aggregate.Schedule{TaskID: id, CustomerID: "late", Spec: events.TaskSpec{
		RootID: id, Queue: "snap", TimeoutSeconds: 60, RunAt: time.Now().Add(time.Hour),
	}}); err != nil {
		t.Fatal(err)
	}
	shutdownAt, err := first.Store.LastSeq(ctx) // one shard: its last position
	if err != nil {
		t.Fatal(err)
	}
	first.Stop()
	headAt(shutdownAt)
	if n := len(first.logLines(t, "projection snapshot written")); n < 3 {
		t.Fatalf("%d snapshots written, want the periodic ones and ours", n)
	}
	snaps, err := projections.OpenObjectSnapshots(ctx, js, node.SnapshotBucket(ns.Stream), "projections", 1)
	if err != nil {
		t.Fatal(err)
	}
	good, ok, err := snaps.Load(ctx)
	if err != nil || !ok {
		t.Fatalf("no snapshot stored: %v", err)
	}
	goodApplied := snapshotApplied(t, good)
	// More events after the snapshot, so loading it means catching up.
	st, err := store.Open(ctx, nc, store.Config{Stream: ns.Stream, Subjects: ns.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		id := events.NewID()
		if _, _, err := st.Execute(ctx, id, "", aggregate.Schedule{TaskID: id, CustomerID: "late", Spec: events.TaskSpec{
			RootID: id, Queue: "snap", TimeoutSeconds: 60, RunAt: time.Now().Add(time.Hour),
		}}); err != nil {
			t.Fatal(err)
		}
	}
	// And schedules, one paused, neither due while the node runs.
	for i, paused := range []bool{false, true} {
		spec := events.ScheduleSpec{Cron: "0 0 29 2 *", Timezone: "UTC", Overlap: events.OverlapSkip, Catchup: events.CatchupOne, // leap days
			Task: events.TaskSpec{Queue: "snap", TimeoutSeconds: 60}}
		id := fmt.Sprint("sched-", i)
		if _, _, err := st.ExecuteSchedule(ctx, "late", id, "", aggregate.CreateSchedule{ID: id, CustomerID: "late", Spec: spec, Paused: paused}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	last := streamLast(t, js, ns.Stream)
	if goodApplied == 0 || goodApplied >= last {
		t.Fatalf("snapshot at %d, stream ends at %d", goodApplied, last)
	}
	want := rebuiltDigest(t, js, ns, last)
	t.Logf("snapshot at %d of %d events", goodApplied, last)

	// restart runs a node on the log with snapshot data in the bucket and
	// checks its projections against the fresh rebuild.
	restart := func(t *testing.T, data []byte) *running {
		t.Helper()
		if err := snaps.Save(ctx, data); err != nil {
			t.Fatal(err)
		}
		r := startLoggedNode(t, nc, ns, every)
		if a := r.Engine.Applied(); a != last {
			t.Fatalf("caught up at %d, stream ends at %d", a, last)
		}
		r.Stop()
		if got := r.Engine.Digest(); got != want {
			t.Fatalf("digest %s after restart, fresh rebuild %s", got, want)
		}
		return r
	}
	ignored := func(t *testing.T, r *running, why string) {
		t.Helper()
		lines := r.logLines(t, "projection snapshot ignored; rebuilding from the log")
		if len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0]["error"]), why) {
			t.Fatalf("snapshot not ignored for %q: %v\nlog:\n%s", why, lines, r.log.String())
		}
		if n := len(r.logLines(t, "projection snapshot loaded")); n != 0 {
			t.Fatal("a bad snapshot was loaded")
		}
		if from := r.logUint(t, "projections catching up", "from"); from != 1 {
			t.Fatalf("caught up from %d, want 1 (a full rebuild)", from)
		}
	}

	t.Run("Corrupted", func(t *testing.T) {
		bad := append([]byte(nil), good...)
		for i := len(bad)/2 - 4; i < len(bad)/2+4; i++ {
			bad[i] ^= 0xff
		}
		ignored(t, restart(t, bad), "checksum")
	})

	t.Run("AheadOfTheStream", func(t *testing.T) {
		// A snapshot of another, longer stream saved into this bucket.
		longer := testnats.NewNamespace(t)
		other, err := store.Open(ctx, nc, store.Config{Stream: longer.Stream, Subjects: longer.Subjects})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		var g errgroup.Group
		g.SetLimit(16)
		for range last + 10 {
			g.Go(func() error {
				id := events.NewID()
				_, _, err := other.Execute(ctx, id, "", aggregate.Schedule{TaskID: id, CustomerID: "big", Spec: events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 60}})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		otherLast := streamLast(t, js, longer.Stream)
		scratch, err := projections.OpenObjectSnapshots(ctx, js, node.SnapshotBucket(longer.Stream), "projections", 1)
		if err != nil {
			t.Fatal(err)
		}
		e := mustEngine(projections.Config{Log: eventlog.Log{JS: js, Stream: longer.Stream, Subjects: longer.Subjects}, Snapshots: scratch})
		if err := e.RebuildTo(ctx, []events.Position{events.Position(otherLast)}, nil); err != nil {
			t.Fatal(err)
		}
		if err := e.SaveSnapshot(ctx); err != nil {
			t.Fatal(err)
		}
		data, _, err := scratch.Load(ctx)
		if err != nil || snapshotApplied(t, data) != otherLast {
			t.Fatalf("other stream's snapshot: %v", err)
		}
		ignored(t, restart(t, data), "ahead of the stream")
	})

	t.Run("OlderFormat", func(t *testing.T) {
		// The snapshot as the build before labels (format 5) wrote it.
		var old map[string]any
		if err := msgpack.Unmarshal(good, &old); err != nil {
			t.Fatal(err)
		}
		old["format"] = projections.SnapshotFormat - 1
		data, err := msgpack.Marshal(old)
		if err != nil {
			t.Fatal(err)
		}
		r := restart(t, data)
		ignored(t, r, "unknown snapshot format")
		if l := r.Engine.List(projections.Filter{Labels: map[string]string{"kind": "snap"}}, "", 10); len(l) != 1 || l[0].TaskID != labeled {
			t.Fatalf("the rebuilt label index lists %+v, want %s", l, labeled)
		}
	})

	t.Run("Valid", func(t *testing.T) {
		r := restart(t, good)
		if a := r.logUint(t, "projection snapshot loaded", "applied"); a != goodApplied {
			t.Fatalf("snapshot loaded at %d, stored at %d", a, goodApplied)
		}
		// Right after the restore the engine stood at the snapshot's
		// sequence and read on from the next one.
		if from := r.logUint(t, "projections catching up", "from"); from != goodApplied+1 {
			t.Fatalf("caught up from %d, want %d", from, goodApplied+1)
		}
		if n := len(r.logLines(t, "projection snapshot ignored; rebuilding from the log")); n != 0 {
			t.Fatal("the valid snapshot was ignored")
		}
	})

	t.Run("Missing", func(t *testing.T) {
		if err := snaps.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		r := startLoggedNode(t, nc, ns, func(c *node.Config) { c.SnapshotEvery = 1 << 40 })
		r.Stop()
		if got := r.Engine.Digest(); got != want {
			t.Fatalf("digest %s, fresh rebuild %s", got, want)
		}
		if from := r.logUint(t, "projections catching up", "from"); from != 1 {
			t.Fatalf("caught up from %d without a snapshot", from)
		}
	})
}

// streamLast returns the last sequence of the named stream now.
func streamLast(t testing.TB, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return lastSeq(t, s)
}
