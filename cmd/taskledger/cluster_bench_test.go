//go:build cluster

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/bench"
	"github.com/taskledger/taskledger/internal/lease"
)

// clockTicks is the kernel's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat: 100 on every Linux architecture Go supports.
const clockTicks = 100

// benchWorkers is how many clients drive each row's load, as in the
// failover test.
const benchWorkers = 6

// benchMaxTasks bounds the tasks one row schedules, whatever its length.
const benchMaxTasks = 200_000

// The timer-kill step: benchTimerTasks delayed tasks due over
// benchTimerSpread, starting benchTimerLead after they are scheduled;
// one of the two processes is killed benchTimerKill after that start.
const (
	benchTimerTasks  = 300
	benchTimerLead   = 2 * time.Second
	benchTimerSpread = 6 * time.Second
	benchTimerKill   = 1 * time.Second
)

// benchRow is one load configuration: P taskledger processes on K shards,
// with leased timer partitions or without (every process then does every
// timer's work).
type benchRow struct {
	procs, shards int
	leases        bool
}

func (r benchRow) String() string {
	l := "leases"
	if !r.leases {
		l = "no leases"
	}
	return fmt.Sprintf("P=%d K=%d %s", r.procs, r.shards, l)
}

// flags are the serve flags of the row; --shards only when K > 1, so a
// binary without sharding runs the K = 1 rows.
func (r benchRow) flags() []string {
	var f []string
	if r.shards > 1 {
		f = append(f, "--shards", strconv.Itoa(r.shards))
	}
	if !r.leases {
		f = append(f, "--no-timer-leases")
	}
	return f
}

// benchRows are the rows of `make cluster-bench`, in order.
var benchRows = []benchRow{
	{1, 1, true}, {2, 1, true}, {2, 1, false}, {3, 1, true}, {3, 1, false},
	{1, 3, true}, {2, 3, true}, {3, 3, true},
}

// benchEnv is the NATS cluster the bench runs on.
type benchEnv struct {
	t     *testing.T
	dir   string
	nodes []*clusterNode
	urls  string
	nc    *nats.Conn
	rep   bench.Report
}

// TestClusterBench measures taskledger on a three-node NATS cluster (R3)
// on loopback, with 1, 2 and 3 processes, K = 1 and 3 shards and leased
// timer partitions on and off: claims/s, lifecycles/s, CPU per task of
// each process and of the NATS nodes, OCC conflicts per 1,000 tasks and
// NATS memory per task; then timer lateness while a process is killed
// and unavailability while the event stream's leader node is killed. It
// prints one table. CLUSTER_BENCH_SECONDS (default 8) is the length of
// each row's load; CLUSTER_BENCH_ONLY (rows, memory, process-kill,
// nats-kill, comma-separated) runs only those steps. `make cluster-bench`
// runs it.
func TestClusterBench(t *testing.T) {
	seconds := envInt(t, "CLUSTER_BENCH_SECONDS", 8, 1, 600)
	load := time.Duration(seconds) * time.Second
	start := time.Now()
	dir := t.TempDir()
	e := &benchEnv{t: t, dir: dir, nodes: startNATSCluster(t, dir)}
	e.urls = clusterURLs(e.nodes)
	e.nc = connectCluster(t, e.nodes)
	e.rep = bench.Report{Started: start, Scale: float64(seconds)}

	only := benchSteps(t)
	if only["rows"] {
		for _, row := range benchRows {
			e.row(row, load)
		}
	}
	if only["memory"] {
		e.memory()
	}
	if only["epochs"] {
		e.epochs()
	}
	if only["process-kill"] {
		e.timerKill()
	}
	if only["nats-kill"] {
		e.natsKill()
	}

	e.rep.Seconds = time.Since(start).Seconds()
	e.rep.NumCPU, e.rep.GOMAXPROCS, e.rep.GoVersion = runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version()
	fmt.Printf("cluster bench: 3 NATS nodes (stream R3) on loopback; figures of one machine, where every process shares its cores; rows of %d s of load (the table's scale)\n", seconds)
	if err := bench.WriteTable(os.Stdout, e.rep); err != nil {
		t.Fatal(err)
	}
}

// benchStepNames are the steps of the bench, in order.
var benchStepNames = []string{"rows", "memory", "epochs", "process-kill", "nats-kill"}

// benchSteps returns the steps CLUSTER_BENCH_ONLY names (a comma-separated
// list of benchStepNames), or all of them.
func benchSteps(t *testing.T) map[string]bool {
	steps := map[string]bool{}
	only := os.Getenv("CLUSTER_BENCH_ONLY")
	for _, name := range benchStepNames {
		steps[name] = only == ""
	}
	for name := range strings.SplitSeq(only, ",") {
		if _, ok := steps[name]; !ok && only != "" {
			t.Fatalf("CLUSTER_BENCH_ONLY=%q: %q is not one of %v", only, name, benchStepNames)
		}
		steps[name] = true
	}
	return steps
}

// add records a figure.
func (e *benchEnv) add(section, name string, v float64, unit string) {
	e.rep.Figures = append(e.rep.Figures, bench.Figure{Section: section, Name: name, Value: v, Unit: unit})
}

// note prints a line in place of figures that cannot be measured.
func (e *benchEnv) note(row benchRow, text string) {
	if row.procs > 0 {
		text = row.String() + ": " + text
	}
	fmt.Println("cluster bench: " + text)
}

// startServers starts n taskledger processes with flags and returns them
// with their addresses.
func (e *benchEnv) startServers(n int, flags ...string) ([]*process, []string) {
	servers := make([]*process, n)
	addrs := make([]string, n)
	for i := range servers {
		addrs[i] = freeAddr(e.t)
		name := fmt.Sprintf("tl-%c", 'a'+i)
		servers[i] = startClusterServer(e.t, e.urls, addrs[i], name, filepath.Join(e.dir, name+".log"), flags...)
	}
	return servers, addrs
}

// reset kills servers and deletes every stream of the account (the log,
// ready, probe and run streams, the lease and snapshot buckets), so the
// next row starts on an empty cluster: every row's processes use the same
// subjects, which two streams may not share.
func (e *benchEnv) reset(servers []*process) {
	e.t.Helper()
	for _, s := range servers {
		s.kill()
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	var all []string
	for n := range names.Name() {
		all = append(all, n)
	}
	if err := names.Err(); err != nil {
		e.t.Fatalf("listing streams: %v", err)
	}
	for _, n := range all {
		if err := js.DeleteStream(ctx, n); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			e.t.Fatalf("deleting stream %s: %v", n, err)
		}
	}
}

// row runs one configuration's load for length and records its figures.
func (e *benchEnv) row(row benchRow, length time.Duration) {
	servers, addrs := e.startServers(row.procs, row.flags()...)
	defer e.reset(servers)
	l := newClusterLoad()
	l.maxSchedules = benchMaxTasks
	for _, s := range servers {
		l.clients = append(l.clients, s.client)
	}
	idle, natsIdle := e.idleCPU(servers)
	cpu0, natsCPU0 := e.serverCPU(servers), e.natsCPU()
	stop, stopLoad := context.WithTimeout(context.Background(), length)
	defer stopLoad()
	g, gctx := errgroup.WithContext(stop)
	began := time.Now()
	for w := range benchWorkers {
		g.Go(func() error { return l.worker(gctx, w) })
	}
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		e.t.Fatalf("%s: load: %v", row, err)
	}
	elapsed := time.Since(began)
	cpu1, natsCPU1 := e.serverCPU(servers), e.natsCPU()
	logBytes, logMsgs := e.logSize(row)
	conflicts, byEvent := 0.0, map[string]float64{}
	for _, a := range addrs {
		for labels, n := range metric(e.t, a, "taskledger_occ_conflicts_total") {
			conflicts += n
			byEvent[strings.TrimSuffix(strings.TrimPrefix(labels, `event="`), `"`)] += n
		}
	}

	l.mu.Lock()
	claims, results, schedules := l.nextClaims+l.directClaims, l.results, l.schedules
	l.mu.Unlock()
	if results == 0 || schedules == 0 {
		e.t.Fatalf("%s: no task went through its lifecycle in %s", row, elapsed)
	}
	sec := row.String()
	e.add(sec, sec+": claims", float64(claims)/elapsed.Seconds(), "claims/s")
	e.add(sec, sec+": lifecycles", float64(results)/elapsed.Seconds(), "tasks/s")
	var total time.Duration
	for i := range servers {
		d := cpu1[i] - cpu0[i]
		total += d
		e.add(sec, fmt.Sprintf("%s: CPU per task, process %d", sec, i+1), micros(d)/float64(results), "µs/task")
	}
	if row.procs > 1 {
		e.add(sec, sec+": CPU per task, all processes", micros(total)/float64(results), "µs/task")
	}
	e.add(sec, sec+": CPU per task, 3 NATS nodes", micros(natsCPU1-natsCPU0)/float64(results), "µs/task")
	if logMsgs > 0 {
		e.add(sec, sec+": log events per task", float64(logMsgs)/float64(schedules), "events/task")
		e.add(sec, sec+": log bytes per task, one replica", float64(logBytes)/float64(schedules), "B/task")
	}
	e.add(sec, sec+": CPU while idle, all processes", idle, "ms/s")
	e.add(sec, sec+": CPU while idle, 3 NATS nodes", natsIdle, "ms/s")
	e.add(sec, sec+": OCC conflicts", 1000*conflicts/float64(schedules), "per 1,000 tasks")
	for _, typ := range slices.Sorted(maps.Keys(byEvent)) {
		e.add(sec, fmt.Sprintf("%s: OCC conflicts on %s", sec, typ), 1000*byEvent[typ]/float64(schedules), "per 1,000 tasks")
	}
	fmt.Printf("cluster bench: %s: %d tasks scheduled, %d claimed, %d finished in %s; %.0f OCC conflicts %v\n",
		row, schedules, claims, results, elapsed.Round(time.Millisecond), conflicts, byEvent)
}

// benchMemoryTasks is how many waiting tasks the memory step schedules.
const benchMemoryTasks = 20_000

// memory schedules benchMemoryTasks tasks due in an hour through one
// process, in batches, and records how much the NATS nodes' resident
// memory grew per task: an upper bound of the hot log's cost of a task
// that stays, since resident memory holds besides its subject's index
// entry the message block caches, the raft log's and the Go heap's slack
// (nats-server's heap may grow to twice what is live, and the Go runtime
// gives little back soon: it measured the same 10 s later).
func (e *benchEnv) memory() {
	servers, _ := e.startServers(1)
	defer e.reset(servers)
	before := e.natsRSS()
	ctx := context.Background()
	runAt := time.Now().Add(time.Hour)
	for i := 0; i < benchMemoryTasks; i += api.MaxBatchItems {
		reqs := make([]api.ScheduleRequest, min(api.MaxBatchItems, benchMemoryTasks-i))
		for j := range reqs {
			reqs[j] = api.ScheduleRequest{
				RequestID: fmt.Sprintf("mem-%d", i+j), Queue: "memory", RunAt: &runAt,
				Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "waiting"}}},
			}
		}
		items, err := servers[0].client.ScheduleBatch(ctx, reqs)
		if err != nil {
			e.t.Fatalf("memory step: batch at %d: %v", i, err)
		}
		for _, it := range items {
			if it.Status != http.StatusCreated {
				e.t.Fatalf("memory step: a batch item answered %d: %+v", it.Status, it)
			}
		}
	}
	var grown int64
	for i, rss := range e.natsRSS() {
		grown += rss - before[i]
	}
	e.add("memory", fmt.Sprintf("NATS RSS growth per waiting task, mean of 3 nodes (%d tasks)", benchMemoryTasks), float64(grown)/3/benchMemoryTasks, "B/task")
}

// benchEpochTasks is how many tasks the epochs step runs in one epoch,
// and benchEpochPeriod its epochs' length: long enough to run them all.
const (
	benchEpochTasks  = 5000
	benchEpochPeriod = 30 * time.Second
)

// epochs runs benchEpochTasks tasks to their end in one epoch of a log
// with epochs (DESIGN.md "Epochs") and records the NATS nodes' resident
// memory per task while the epoch is live, once it is sealed, and once
// it is archived and removed (taskledger archive, epoch remove): the live
// Go heap (natsHeap), and the resident memory, which the Go runtime gives
// back only gradually.
func (e *benchEnv) epochs() {
	servers, _ := e.startServers(1, "--epoch-slots", "2", "--epoch-period", benchEpochPeriod.String(), "--retain-epochs", "1", "--epoch-check", "200ms")
	defer e.reset(servers)
	c, ctx := servers[0].client, context.Background()
	// Start the tasks just after a period begins, so they share an epoch.
	time.Sleep(benchEpochPeriod - time.Duration(time.Now().UnixNano()%int64(benchEpochPeriod)) + time.Second)
	before, beforeRSS, start := e.natsHeap(), e.natsRSS(), time.Now()
	var first string
	for i := 0; i < benchEpochTasks; i += api.MaxBatchItems {
		reqs := make([]api.ScheduleRequest, min(api.MaxBatchItems, benchEpochTasks-i))
		for j := range reqs {
			reqs[j] = api.ScheduleRequest{RequestID: fmt.Sprintf("epoch-%d", i+j), Queue: "epochs"}
		}
		items, err := c.ScheduleBatch(ctx, reqs)
		if err != nil || items[0].Task == nil {
			e.t.Fatalf("epochs step: batch at %d: %v %+v", i, err, items)
		}
		first = cmp.Or(first, items[0].Task.ID)
	}
	for done := 0; done < benchEpochTasks; {
		tasks, err := c.ClaimBatch(ctx, "epochs", "bench", api.MaxBatchItems, time.Second)
		if err != nil {
			e.t.Fatalf("epochs step: claims: %v", err)
		}
		results := make([]api.ResultItem, len(tasks))
		for i, task := range tasks {
			results[i] = api.ResultItem{TaskID: task.ID, ResultRequest: api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}}
		}
		if len(results) > 0 {
			if _, err := c.RecordResults(ctx, results); err != nil {
				e.t.Fatalf("epochs step: results: %v", err)
			}
		}
		done += len(tasks)
	}
	if time.Since(start) > benchEpochPeriod/2 {
		e.t.Fatalf("epochs step: %d tasks took %s, too long for one epoch of %s", benchEpochTasks, time.Since(start), benchEpochPeriod)
	}
	live, liveRSS := e.natsHeap(), e.natsRSS()
	h, err := c.History(ctx, first)
	if err != nil {
		e.t.Fatal(err)
	}
	part, _ := events.Shards{K: 1, Slots: 2}.Split(events.Position(h.Events[0].Seq))
	slot := part - 1
	var epoch int64
	for deadline := time.Now().Add(4 * benchEpochPeriod); epoch == 0; time.Sleep(200 * time.Millisecond) {
		stats, err := c.Stats(ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		if s := stats.Epochs.Slots[slot]; s.State == "sealed" {
			epoch = *s.Epoch
		} else if time.Now().After(deadline) {
			e.t.Fatalf("epochs step: slot %d not sealed: %+v", slot, stats.Epochs)
		}
	}
	sealed := e.natsHeap()
	dir, name := filepath.Join(e.dir, "epoch-archive"), strconv.FormatInt(epoch, 10)
	for _, args := range [][]string{{"archive", name, "--to", dir}, {"epoch", "remove", name, "--archive", dir}} {
		if out, errOut, code := replayCLI(e.t, append(args, "--nats-url", e.urls)...); code != 0 {
			e.t.Fatalf("epochs step: %v: exit %d\n%s\n%s", args, code, out, errOut)
		}
	}
	removed, removedRSS := e.natsHeap(), e.natsRSS()
	per := func(now, before []int64) float64 {
		var grown int64
		for i := range now {
			grown += now[i] - before[i]
		}
		return float64(grown) / 3 / benchEpochTasks
	}
	e.add("epochs", fmt.Sprintf("NATS heap per task of a live epoch, mean of 3 nodes (%d finished tasks)", benchEpochTasks), per(live, before), "B/task")
	e.add("epochs", "… once the epoch is sealed", per(sealed, before), "B/task")
	e.add("epochs", "… once it is archived and removed", per(removed, before), "B/task")
	e.add("epochs", "NATS RSS growth per task of the live epoch", per(liveRSS, beforeRSS), "B/task")
	e.add("epochs", "… once it is archived and removed", per(removedRSS, beforeRSS), "B/task")
}

// timerKill schedules delayed tasks through one of two processes, kills
// the other (SIGKILL) while they fall due, and records how late each was
// released (its DeliveryPending against its runAt): the killed process's
// partitions are released by the survivor once their leases lapse.
func (e *benchEnv) timerKill() {
	servers, _ := e.startServers(2)
	defer e.reset(servers)
	survivor := servers[1].client
	ctx := context.Background()
	first := time.Now().Add(benchTimerLead)
	ids := make([]string, benchTimerTasks)
	for i := range ids {
		runAt := first.Add(benchTimerSpread * time.Duration(i) / benchTimerTasks)
		task, _, err := survivor.Schedule(ctx, api.ScheduleRequest{
			RequestID: fmt.Sprintf("timer-%d", i), Queue: "timer-kill", RunAt: &runAt,
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "timer"}}},
		})
		if err != nil {
			e.t.Fatalf("timer step: schedule: %v", err)
		}
		ids[i] = task.ID
	}
	if time.Until(first) < benchTimerKill/2 {
		e.t.Fatalf("timer step: scheduling %d tasks took past their first runAt; raise benchTimerLead", benchTimerTasks)
	}
	time.Sleep(time.Until(first.Add(benchTimerKill)))
	servers[0].kill()
	killedAt := time.Now()
	// Every task is due by then, and every lease lapsed and was taken.
	time.Sleep(time.Until(first.Add(benchTimerSpread + lease.DefaultTTL + 3*time.Second)))

	var late []time.Duration
	afterKill, byKilled := 0, 0
	for _, id := range ids {
		h, err := survivor.History(ctx, id)
		if err != nil {
			e.t.Fatalf("timer step: history of %s: %v", id, err)
		}
		task, err := survivor.Get(ctx, id)
		if err != nil {
			e.t.Fatalf("timer step: %s: %v", id, err)
		}
		i := slices.IndexFunc(h.Events, func(ev api.Event) bool { return ev.Type == string(events.TypeDeliveryPending) })
		if i < 0 {
			e.t.Fatalf("timer step: task %s (runAt %s) not released %s after its runAt", id, task.RunAt.Format(time.TimeOnly), time.Since(task.RunAt).Round(time.Millisecond))
		}
		if task.RunAt.After(killedAt) {
			afterKill++
			late = append(late, h.Events[i].At.Sub(task.RunAt))
		}
		if h.Events[i].Actor == "tl-a" {
			byKilled++
		}
	}
	slices.Sort(late)
	sec := "process kill"
	e.add(sec, "timer lateness p99 while a process is killed (P=2, TTL 5 s)", millis(late[len(late)*99/100]), "ms")
	e.add(sec, "timer lateness max while a process is killed (P=2, TTL 5 s)", millis(late[len(late)-1]), "ms")
	fmt.Printf("cluster bench: process kill: %d timers due after the kill (released late by a median of %s); %d of all %d released by the killed process before it died\n",
		len(late), late[len(late)/2].Round(time.Millisecond), byKilled, benchTimerTasks)
}

// benchNATSKills is how many times natsKill kills the event stream's
// leader: the election takes a random 4 to 9 s, so one kill says little.
const benchNATSKills = 6

// natsKill runs the failover test's load on two processes and, in turn
// benchNATSKills times, SIGKILLs the NATS node leading the event stream,
// records the longest pause between acknowledged writes until the load
// is back, and restarts the node.
func (e *benchEnv) natsKill() {
	servers, _ := e.startServers(2)
	defer e.reset(servers)
	l := newClusterLoad()
	l.maxSchedules = benchMaxTasks
	for _, s := range servers {
		l.clients = append(l.clients, s.client)
	}
	stop, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	g, gctx := errgroup.WithContext(stop)
	for w := range benchWorkers {
		g.Go(func() error { return l.worker(gctx, w) })
	}
	var pauses []time.Duration
	for k := range benchNATSKills {
		if !e.writesSince(l, gctx, time.Now()) {
			break
		}
		killed := e.leaderNode()
		l.mu.Lock()
		l.writeGapMax = 0
		l.mu.Unlock()
		killed.kill()
		killedAt := time.Now()
		if !e.writesSince(l, gctx, killedAt) {
			break
		}
		l.mu.Lock()
		gap, gapEnd := l.writeGapMax, l.writeGapEnd
		l.mu.Unlock()
		pauses = append(pauses, gap)
		fmt.Printf("cluster bench: NATS kill %d: node %s (stream leader) SIGKILLed; longest pause between acked writes %s, ending %s after the kill\n",
			k+1, killed.name, gap.Round(time.Millisecond), gapEnd.Sub(killedAt).Round(time.Millisecond))
		killed.start(e.t)
		e.replicasCurrent()
	}
	stopLoad()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		e.t.Fatalf("NATS kill: load: %v", err)
	}
	if len(pauses) < benchNATSKills {
		e.t.Fatalf("NATS kill: the load did not recover after kill %d", len(pauses)+1)
	}
	l.mu.Lock()
	kinds := l.failureKinds
	l.mu.Unlock()
	sec := "NATS node kill"
	n := len(pauses)
	e.add(sec, fmt.Sprintf("pause between acked writes, stream leader's node killed (P=2), mean of %d", n), mean(pauses).Seconds(), "s")
	e.add(sec, fmt.Sprintf("pause between acked writes, stream leader's node killed (P=2), max of %d", n), slices.Max(pauses).Seconds(), "s")
	fmt.Printf("cluster bench: NATS kill: retried errors: %v\n", kinds)
}

// writesSince waits until the load has had clusterMinWrites acknowledged
// writes after since, at least a second after it, within
// clusterRecoverBudget; false if the load failed or the budget ran out.
func (e *benchEnv) writesSince(l *clusterLoad, ctx context.Context, since time.Time) bool {
	l.mu.Lock()
	n0 := l.writes[l.phase]
	l.mu.Unlock()
	budget := time.After(clusterRecoverBudget)
	settle := time.After(time.Until(since.Add(time.Second)))
	settled := false
	for {
		l.mu.Lock()
		n, last := l.writes[l.phase]-n0, l.lastWrite
		l.mu.Unlock()
		if settled && n >= clusterMinWrites && last.After(since) {
			return true
		}
		select {
		case <-l.progress:
		case <-settle:
			settled = true
		case <-ctx.Done():
			return false
		case <-budget:
			e.t.Errorf("%d writes acknowledged %s after a NATS kill", n, clusterRecoverBudget)
			return false
		}
	}
}

func mean(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// leaderNode returns the node leading the event stream (the NATS kill
// step's log has one shard).
func (e *benchEnv) leaderNode() *clusterNode {
	leader := streamLeader(e.t, e.nc, events.Shards{K: 1}, 0)
	for _, n := range e.nodes {
		if n.name == leader {
			return n
		}
	}
	e.t.Fatalf("stream leader %q is not a node of the cluster", leader)
	return nil
}

// replicasCurrent waits, at most a minute, until every replica of the
// event stream is current, so the next kill leaves a quorum.
func (e *benchEnv) replicasCurrent() {
	js, err := jetstream.New(e.nc)
	if err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := js.Stream(ctx, events.DefaultStream)
		cancel()
		if err == nil && s.CachedInfo().Cluster != nil && len(s.CachedInfo().Cluster.Replicas) == 2 &&
			!slices.ContainsFunc(s.CachedInfo().Cluster.Replicas, func(r *jetstream.PeerInfo) bool { return !r.Current || r.Offline }) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("event stream replicas not current a minute after a NATS restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logSize returns the bytes and messages of the event stream, for a row
// on one stream (0, 0 for a sharded row, whose stream names this bench
// does not know).
func (e *benchEnv) logSize(row benchRow) (bytes, msgs uint64) {
	if row.shards > 1 {
		return 0, 0
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, events.DefaultStream)
	if err != nil {
		e.t.Fatalf("event stream: %v", err)
	}
	return s.CachedInfo().State.Bytes, s.CachedInfo().State.Msgs
}

// benchIdle is how long idleCPU watches the processes without load.
const benchIdle = time.Second

// idleCPU returns the CPU the servers (summed) and the NATS nodes use
// without load, in ms per second: lease renewals, heartbeats, the
// replicas' own chatter. It is part of every per-task figure, and the
// larger part at a low rate.
func (e *benchEnv) idleCPU(servers []*process) (procs, nats float64) {
	sum := func(ds []time.Duration) (t time.Duration) {
		for _, d := range ds {
			t += d
		}
		return t
	}
	p0, n0, t0 := sum(e.serverCPU(servers)), e.natsCPU(), time.Now()
	time.Sleep(benchIdle)
	p1, n1, el := sum(e.serverCPU(servers)), e.natsCPU(), time.Since(t0).Seconds()
	return millis(p1-p0) / el, millis(n1-n0) / el
}

// serverCPU returns each process's user and system CPU time so far.
func (e *benchEnv) serverCPU(servers []*process) []time.Duration {
	out := make([]time.Duration, len(servers))
	for i, s := range servers {
		out[i] = procCPU(e.t, s.cmd.Process.Pid)
	}
	return out
}

// natsCPU returns the NATS nodes' CPU time so far, summed.
func (e *benchEnv) natsCPU() time.Duration {
	var d time.Duration
	for _, n := range e.nodes {
		d += procCPU(e.t, n.cmd.Process.Pid)
	}
	return d
}

// natsHeap returns each NATS node's live Go heap in bytes: HeapAlloc as
// its profiling port reports it after two collections (nats-server keeps
// message block buffers in sync.Pools, which only the second empties).
func (e *benchEnv) natsHeap() []int64 {
	heaps := make([]int64, len(e.nodes))
	for i, n := range e.nodes {
		for range 2 {
			resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(n.profPort) + "/debug/pprof/heap?gc=1&debug=1")
			if err != nil {
				e.t.Fatal(err)
			}
			body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
			resp.Body.Close()
			if err != nil {
				e.t.Fatal(err)
			}
			m := regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)$`).FindSubmatch(body)
			if m == nil {
				e.t.Fatalf("node %s: no HeapAlloc in its heap profile", n.name)
			}
			heaps[i], _ = strconv.ParseInt(string(m[1]), 10, 64)
		}
	}
	return heaps
}

// natsRSS returns each NATS node's resident memory in bytes.
func (e *benchEnv) natsRSS() []int64 {
	out := make([]int64, len(e.nodes))
	for i, n := range e.nodes {
		out[i] = procStat(e.t, n.cmd.Process.Pid, 24) * int64(os.Getpagesize())
	}
	return out
}

// procCPU reads utime + stime of pid from /proc.
func procCPU(t *testing.T, pid int) time.Duration {
	ticks := procStat(t, pid, 14) + procStat(t, pid, 15)
	return time.Duration(ticks) * time.Second / clockTicks
}

// procStat returns field n (from 1, as proc(5) numbers them) of
// /proc/<pid>/stat.
func procStat(t *testing.T, pid, n int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("reading the CPU time of process %d: %v", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// field 3 starts after the last ')'.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	v, err := strconv.ParseInt(fields[n-3], 10, 64)
	if err != nil {
		t.Fatalf("/proc/%d/stat field %d: %v", pid, n, err)
	}
	return v
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
