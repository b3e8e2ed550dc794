//go:build cluster

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/replay"
)

// Queues of the cluster test: tasks of clusterNextQueue are claimed with
// claims/next, tasks of clusterDirectQueue by their scheduler with /claim.
const (
	clusterNextQueue   = "cl-next"
	clusterDirectQueue = "cl-direct"
)

// A phase after a kill must see clusterMinWrites acknowledged writes within
// clusterRecoverBudget before the next step; NATS takes several seconds
// to elect new stream and consumer leaders.
const (
	clusterMinWrites     = 20
	clusterRecoverBudget = 60 * time.Second
)

// clusterAttemptTimeout bounds one request; a client gives up on a server
// that does not answer in time (one still catching up after a restart
// answers writes only once its projections have them) and tries the other.
const clusterAttemptTimeout = 5 * time.Second

// clusterOpBudget is how long one client operation keeps retrying transient
// failures (503, refused or reset connections) before the test fails.
const clusterOpBudget = 60 * time.Second

// clusterNode is one nats-server process of the test cluster.
type clusterNode struct {
	bin, name, dir, log, routes string
	port, clusterPort, profPort int
	cmd                         *exec.Cmd
}

func (n *clusterNode) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// start runs the node on its ports and store directory.
func (n *clusterNode) start(t *testing.T) {
	t.Helper()
	n.cmd = exec.Command(n.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-n", n.name,
		"-js", "-sd", n.dir, "-l", n.log, "--profile", strconv.Itoa(n.profPort),
		"--cluster_name", "tl", "--cluster", "nats://127.0.0.1:"+strconv.Itoa(n.clusterPort), "--routes", n.routes)
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// kill ends the node with SIGKILL and reaps it.
func (n *clusterNode) kill() {
	if n.cmd != nil && n.cmd.ProcessState == nil {
		n.cmd.Process.Signal(syscall.SIGKILL)
		n.cmd.Wait()
	}
}

func clusterFreePort(t *testing.T) int {
	t.Helper()
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startNATSCluster builds nats-server from the module's version and starts a
// three-node JetStream cluster on loopback, waiting for a meta leader.
func startNATSCluster(t *testing.T, dir string) []*clusterNode {
	t.Helper()
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		t.Fatalf("building nats-server: %v\n%s", err, out)
	}
	nodes := make([]*clusterNode, 3)
	var routes []string
	for i := range nodes {
		n := &clusterNode{bin: bin, name: fmt.Sprintf("n%d", i+1), port: clusterFreePort(t), clusterPort: clusterFreePort(t), profPort: clusterFreePort(t)}
		n.dir = filepath.Join(dir, n.name)
		n.log = filepath.Join(dir, n.name+".log")
		nodes[i] = n
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(n.clusterPort))
	}
	for _, n := range nodes {
		n.routes = strings.Join(routes, ",")
		n.start(t)
		t.Cleanup(n.kill)
	}
	nc := connectCluster(t, nodes)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return nodes
		}
		if time.Now().After(deadline) {
			t.Fatalf("no JetStream meta leader after 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func clusterURLs(nodes []*clusterNode) string {
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.url()
	}
	return strings.Join(urls, ",")
}

// connectCluster returns a connection to any node of the cluster that
// reconnects forever.
func connectCluster(t *testing.T, nodes []*clusterNode) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(clusterURLs(nodes), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// clusterShards is the number of event streams of the cluster test's log:
// CLUSTER_SHARDS, default 3 (docs/DESIGN.md, "Sharded log").
func clusterShards(t *testing.T) events.Shards {
	t.Helper()
	return events.Shards{K: envInt(t, "CLUSTER_SHARDS", 3, 1, eventlog.MaxShards)}
}

// streamLeader names the node leading shard i's event stream of a log
// of shards.
func streamLeader(t *testing.T, nc *nats.Conn, shards events.Shards, i int) string {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, shards.Stream(events.DefaultStream, i))
	if err != nil {
		t.Fatalf("event stream: %v", err)
	}
	if s.CachedInfo().Config.Replicas != 3 || s.CachedInfo().Cluster == nil {
		t.Fatalf("event stream has %d replicas, want 3", s.CachedInfo().Config.Replicas)
	}
	return s.CachedInfo().Cluster.Leader
}

// startClusterServer runs `taskledger serve` against the cluster, with
// flags added, and waits until /readyz answers 200. Its log goes to
// logPath.
func startClusterServer(t *testing.T, urls, addr, name, logPath string, flags ...string) *process {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	// The processes of one test share a chain key, beside their logs.
	args := append([]string{"serve", "--nats-url", urls, "--replicas", "3", "--name", name,
		"--http", addr, "--log-format", "json", "--log-level", "warn",
		"--chain-key-file", filepath.Join(filepath.Dir(logPath), chainkey.FileName)}, flags...)
	cmd := exec.Command(taskledgerBinary(t), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, client: api.NewClient("http://"+addr, "")}
	t.Cleanup(p.kill)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("taskledger %s on %s not ready after 60s: %v", name, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Phases of the failover test, in order.
const (
	clusterHealthy = iota
	clusterNATSDown
	clusterServerDown
	clusterNATSBack
	clusterAllBack
	clusterPhases
)

var clusterPhaseNames = [clusterPhases]string{"healthy", "nats-node-down", "taskledger-down", "nats-node-back", "all-back"}

// clusterLoad drives clients against the taskledger servers and counts
// what they acknowledged. It is safe for concurrent use.
type clusterLoad struct {
	clients      []*api.Client // set before the load starts
	maxSchedules int           // if above 0, workers stop after this many schedules in all
	rec          *acked

	mu                                   sync.Mutex
	phase                                int
	writes, failures                     [clusterPhases]int
	schedules, nextClaims, directClaims  int
	results, lostClaims, ambiguousWrites int
	lastOK                               time.Time
	progress                             chan struct{} // a value after writes
	gapTotal, gapMax                     time.Duration
	gapMaxPhase                          int
	lastWrite                            time.Time
	writeGapMax                          time.Duration // the longest pause between acknowledged writes
	writeGapEnd                          time.Time     // when it ended
	failureKinds                         map[string]int
	firstFailure                         map[string]string // an example of each kind
}

func newClusterLoad() *clusterLoad {
	return &clusterLoad{rec: &acked{status: map[string]string{}}, failureKinds: map[string]int{}, firstFailure: map[string]string{}, progress: make(chan struct{}, 1)}
}

// full reports whether maxSchedules tasks were scheduled.
func (l *clusterLoad) full() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxSchedules > 0 && l.schedules >= l.maxSchedules
}

func (l *clusterLoad) setPhase(p int) {
	l.mu.Lock()
	l.phase = p
	l.mu.Unlock()
}

// ok records a successful request; a pause of more than 500ms since the
// previous one, across all clients, counts as unavailability.
func (l *clusterLoad) ok() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if gap := now.Sub(l.lastOK); !l.lastOK.IsZero() && gap > 500*time.Millisecond {
		l.gapTotal += gap
		if gap > l.gapMax {
			l.gapMax, l.gapMaxPhase = gap, l.phase
		}
	}
	l.lastOK = now
}

func (l *clusterLoad) failed(err error) {
	kind := "transport"
	var apiErr *api.Error
	switch {
	case errors.As(err, &apiErr):
		kind = fmt.Sprintf("%d %s", apiErr.Status, apiErr.Code)
	case errors.Is(err, syscall.ECONNREFUSED):
		kind = "refused"
	case errors.Is(err, context.DeadlineExceeded):
		kind = "timeout"
	}
	l.mu.Lock()
	l.failures[l.phase]++
	if l.failureKinds[kind]++; l.failureKinds[kind] == 1 {
		l.firstFailure[kind] = err.Error()
	}
	l.mu.Unlock()
}

// wrote records an acknowledged write of task in its returned status; a
// status behind one already acknowledged (another client's claim answered
// first) is not recorded.
func (l *clusterLoad) wrote(t api.Task, counter *int) {
	l.rec.mu.Lock()
	if old, ok := l.rec.status[t.ID]; !ok || rank[t.Status] >= rank[old] {
		l.rec.status[t.ID] = t.Status
	}
	l.rec.mu.Unlock()
	l.mu.Lock()
	l.writes[l.phase]++
	*counter++
	now := time.Now()
	if gap := now.Sub(l.lastWrite); !l.lastWrite.IsZero() && gap > l.writeGapMax {
		l.writeGapMax, l.writeGapEnd = gap, now
	}
	l.lastWrite = now
	l.mu.Unlock()
	select {
	case l.progress <- struct{}{}:
	default:
	}
}

// clusterTransient reports whether a request may succeed when repeated:
// the server was unreachable, or answered 503.
func clusterTransient(err error) bool {
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		return apiErr.Status == http.StatusServiceUnavailable
	}
	return true // refused, reset, EOF, timeout: the server or its reply is gone
}

func clusterConflict(err error) bool {
	var apiErr *api.Error
	return errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict
}

// do runs op against the servers in turn, starting with first, until it
// succeeds, fails with a non-transient error, or clusterOpBudget ends.
func (l *clusterLoad) do(first int, name string, op func(ctx context.Context, c *api.Client) error) error {
	deadline := time.Now().Add(clusterOpBudget)
	backoff := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), clusterAttemptTimeout)
		err := op(ctx, l.clients[(first+attempt)%len(l.clients)])
		cancel()
		if err == nil {
			l.ok()
			return nil
		}
		if !clusterTransient(err) {
			return err
		}
		l.failed(err)
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still failing after %s: %w", name, clusterOpBudget, err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (l *clusterLoad) get(first int, id string) (t api.Task, err error) {
	err = l.do(first, "get", func(ctx context.Context, c *api.Client) (err error) {
		t, err = c.Get(ctx, id)
		return err
	})
	return t, err
}

// worker schedules tasks (one in seven delayed), claims them (one in three
// directly with its delivery token, the others with claims/next) and
// reports results, going round the servers, until stop ends.
func (l *clusterLoad) worker(stop context.Context, w int) error {
	executor := fmt.Sprintf("w%d", w)
	for i := 0; stop.Err() == nil && !l.full(); i++ {
		first := (w + i) % len(l.clients)
		direct := i%3 == 0
		req := api.ScheduleRequest{
			RequestID: fmt.Sprintf("w%d-%d", w, i), Queue: clusterNextQueue,
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: fmt.Sprintf("cluster w%d-%d", w, i)}}},
		}
		if direct {
			req.Queue = clusterDirectQueue
		}
		if i%7 == 3 {
			d := 0.5
			req.DelaySeconds = &d
		}
		var task api.Task
		err := l.do(first, "schedule", func(ctx context.Context, c *api.Client) (err error) {
			task, _, err = c.Schedule(ctx, req)
			return err
		})
		if err != nil {
			return fmt.Errorf("worker %d: schedule %s: %w", w, req.RequestID, err)
		}
		l.wrote(task, &l.schedules)

		var claimed api.Task
		var ok bool
		if direct {
			claimed, ok, err = l.claimDirect(first, task.ID, executor)
		} else {
			err = l.do(first, "claims/next", func(ctx context.Context, c *api.Client) (err error) {
				claimed, ok, err = c.ClaimNext(ctx, clusterNextQueue, executor, 200*time.Millisecond)
				return err
			})
			if ok {
				l.wrote(claimed, &l.nextClaims)
			}
		}
		if err != nil {
			return fmt.Errorf("worker %d: claim: %w", w, err)
		}
		if !ok {
			continue
		}
		if err := l.finish(first, claimed); err != nil {
			return fmt.Errorf("worker %d: result of %s: %w", w, claimed.ID, err)
		}
	}
	return nil
}

// claimDirect waits until task id has a delivery token and claims it with
// /claim. A conflict after a retried claim is resolved by reading the task:
// an earlier attempt may have landed with its reply lost.
func (l *clusterLoad) claimDirect(first int, id, executor string) (api.Task, bool, error) {
	var task api.Task
	var err error
	for start := time.Now(); ; {
		if task, err = l.get(first, id); err != nil {
			return task, false, err
		}
		if task.Delivery != nil && (task.Status == "scheduled" || task.Status == "queued") {
			break
		}
		if task.Status != "scheduled" || time.Since(start) > 20*time.Second {
			return task, false, nil // left for the drain
		}
		time.Sleep(20 * time.Millisecond)
	}
	token := task.Delivery.ID
	var claimed api.Task
	err = l.do(first, "claim", func(ctx context.Context, c *api.Client) (err error) {
		claimed, err = c.Claim(ctx, id, token, executor)
		return err
	})
	if clusterConflict(err) {
		if claimed, err = l.get(first, id); err != nil {
			return claimed, false, err
		}
		if claimed.Status != "running" || claimed.Claim == nil || claimed.Claim.DeliveryID != token || claimed.Claim.ExecutorID != executor {
			l.mu.Lock()
			l.lostClaims++
			l.mu.Unlock()
			return claimed, false, nil
		}
		l.mu.Lock()
		l.ambiguousWrites++
		l.mu.Unlock()
	} else if err != nil {
		return claimed, false, err
	}
	l.wrote(claimed, &l.directClaims)
	return claimed, true, nil
}

// finish reports a successful result for a claimed task. A conflict after
// a retry is an earlier attempt that landed, if the task succeeded.
func (l *clusterLoad) finish(first int, claimed api.Task) error {
	var done api.Task
	err := l.do(first, "result", func(ctx context.Context, c *api.Client) (err error) {
		done, err = c.RecordResult(ctx, claimed.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true, Summary: "done"})
		return err
	})
	if clusterConflict(err) {
		if done, err = l.get(first, claimed.ID); err != nil {
			return err
		}
		if done.Status != "succeeded" {
			return fmt.Errorf("result answered conflict and the task is %s", done.Status)
		}
		l.mu.Lock()
		l.ambiguousWrites++
		l.mu.Unlock()
	} else if err != nil {
		return err
	}
	l.wrote(done, &l.results)
	return nil
}

// TestClusterFailover runs two taskledger processes on one R3 stream of a
// three-node NATS cluster under load, SIGKILLs a NATS node (the event
// stream's leader), then one taskledger process, restarts both, and checks
// that the service kept answering while a majority lived, that nothing
// acknowledged was lost or moved backwards, that no delivery token was
// claimed twice, that the log verifies, and that every waiting task is
// still claimable. CLUSTER_SECONDS (default 60) is the length of the load.
func TestClusterFailover(t *testing.T) {
	total := time.Duration(envInt(t, "CLUSTER_SECONDS", 60, 5, 24*3600)) * time.Second
	dir := t.TempDir()
	nodes := startNATSCluster(t, dir)
	urls := clusterURLs(nodes)
	nc := connectCluster(t, nodes)
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"tl-a.log", "tl-b.log", "n1.log", "n2.log", "n3.log"} {
				clusterDumpTail(t, filepath.Join(dir, f), 30)
			}
		}
	})

	addrs := [2]string{freeAddr(t), freeAddr(t)}
	names := [2]string{"tl-a", "tl-b"}
	logs := [2]string{filepath.Join(dir, "tl-a.log"), filepath.Join(dir, "tl-b.log")}
	shards := clusterShards(t)
	shardsFlag := []string{"--shards", strconv.Itoa(shards.N())}
	var servers [2]*process
	for i := range servers {
		servers[i] = startClusterServer(t, urls, addrs[i], names[i], logs[i], shardsFlag...)
	}
	var leaders []string
	for i := range shards.N() {
		leaders = append(leaders, streamLeader(t, nc, shards, i))
	}
	t.Logf("%d event streams, leaders %v", shards.N(), leaders)
	l := newClusterLoad()
	for i := range servers {
		l.clients = append(l.clients, servers[i].client)
	}

	stop, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	g, gctx := errgroup.WithContext(stop)
	for w := range 6 {
		g.Go(func() error { return l.worker(gctx, w) })
	}
	start := time.Now()
	// until waits until frac of the load's length has passed and, when
	// the current phase follows a kill, until the clients have had
	// clusterMinWrites writes acknowledged in it (new leaders are elected
	// first). False if a worker failed first.
	until := func(frac float64, needWrites bool) bool {
		select {
		case <-time.After(time.Until(start.Add(time.Duration(frac * float64(total))))):
		case <-gctx.Done():
			return false
		}
		if !needWrites {
			return true
		}
		budget := time.After(clusterRecoverBudget)
		for {
			l.mu.Lock()
			n, phase := l.writes[l.phase], l.phase
			l.mu.Unlock()
			if n >= clusterMinWrites {
				return true
			}
			select {
			case <-l.progress:
			case <-gctx.Done():
				return false
			case <-budget:
				t.Errorf("%d writes acknowledged in phase %s after %s: the service did not continue\n%s", n, clusterPhaseNames[phase], clusterRecoverBudget, clusterState(nc, shards, addrs))
				return false
			}
		}
	}
	var killed *clusterNode
	steps := []struct {
		at         float64
		needWrites bool // writes acknowledged in the phase so far
		phase      int
		action     func()
	}{
		{0.2, false, clusterNATSDown, func() {
			leader := streamLeader(t, nc, shards, 0)
			for _, n := range nodes {
				if n.name == leader {
					killed = n
				}
			}
			if killed == nil {
				t.Errorf("stream leader %q is not a node of the cluster", leader)
				killed = nodes[0]
			}
			killed.kill()
			t.Logf("%.1fs: SIGKILLed NATS node %s (leader of shard 0's event stream)", time.Since(start).Seconds(), killed.name)
		}},
		{0.45, true, clusterServerDown, func() {
			servers[0].kill()
			t.Logf("%.1fs: SIGKILLed taskledger %s", time.Since(start).Seconds(), names[0])
		}},
		{0.65, true, clusterNATSBack, func() {
			killed.start(t)
			t.Logf("%.1fs: restarted NATS node %s", time.Since(start).Seconds(), killed.name)
		}},
		{0.8, false, clusterAllBack, func() {
			servers[0] = startClusterServer(t, urls, addrs[0], names[0], logs[0], shardsFlag...)
			t.Logf("%.1fs: restarted taskledger %s", time.Since(start).Seconds(), names[0])
		}},
	}
	done := 0
	for _, s := range steps {
		if !until(s.at, s.needWrites) {
			break
		}
		s.action()
		l.setPhase(s.phase)
		done++
	}
	if done == len(steps) {
		// The last phase lasts at least a fifth of the load.
		select {
		case <-time.After(max(time.Until(start.Add(total)), total/5)):
		case <-gctx.Done():
		}
	}
	stopLoad()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("load: %v", err)
	}
	loadTime := time.Since(start)

	l.mu.Lock()
	var failoverErrors int
	for p := clusterNATSDown; p < clusterPhases; p++ {
		failoverErrors += l.failures[p]
	}
	fmt.Printf("cluster failover: %s of load, 6 clients, 2 taskledger processes, 3 NATS nodes (%d event streams, R3)\n", loadTime.Round(time.Millisecond), shards.N())
	fmt.Printf("  acked: %d schedules, %d claims (%d claims/next, %d direct), %d results; %d writes resolved by a read after an ambiguous retry; %d direct claims lost\n",
		l.schedules, l.nextClaims+l.directClaims, l.nextClaims, l.directClaims, l.results, l.ambiguousWrites, l.lostClaims)
	for p := range clusterPhases {
		fmt.Printf("  phase %-16s %6d acked writes %6d retried errors\n", clusterPhaseNames[p], l.writes[p], l.failures[p])
	}
	fmt.Printf("  errors during failover (retried): %d; all retried errors by kind: %v\n", failoverErrors, l.failureKinds)
	for kind, example := range l.firstFailure {
		fmt.Printf("    e.g. %s: %.160s\n", kind, example)
	}
	fmt.Printf("  unavailability (pauses > 500ms without any successful request): %.2fs total, longest %.2fs (ending in phase %s)\n",
		l.gapTotal.Seconds(), l.gapMax.Seconds(), clusterPhaseNames[l.gapMaxPhase])
	writes := l.writes
	l.mu.Unlock()
	if done < len(steps) {
		t.FailNow()
	}
	for _, p := range []int{clusterNATSDown, clusterServerDown, clusterAllBack} {
		if writes[p] == 0 {
			t.Errorf("no acknowledged write during phase %s", clusterPhaseNames[p])
		}
	}

	clusterCheckAcked(t, l)
	drained := clusterDrain(t, l)
	clusterClaimedOnce(t, l)
	clusterVerify(t, urls, filepath.Join(dir, chainkey.FileName), len(l.rec.status))
	fmt.Printf("  after restart: %d waiting or orphaned tasks drained; every acked task present and not behind; no token claimed twice; replay verify clean\n", drained)
}

// clusterCheckAcked fails unless every acknowledged task exists with a status not
// behind the acknowledged one (a terminal one unchanged).
func clusterCheckAcked(t *testing.T, l *clusterLoad) {
	t.Helper()
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	i := 0
	for id, want := range l.rec.status {
		i++
		got, err := l.get(i%2, id)
		if err != nil {
			t.Fatalf("acknowledged task %s (%s): %v", id, want, err)
		}
		if rank[got.Status] < rank[want] || rank[want] == 3 && got.Status != want {
			t.Fatalf("task %s moved from acknowledged %s to %s", id, want, got.Status)
		}
	}
}

// clusterListAll returns every task, paging through GET /v1/tasks.
func clusterListAll(t *testing.T, l *clusterLoad) []api.Task {
	t.Helper()
	var all []api.Task
	after := ""
	for {
		var page api.TaskList
		err := l.do(0, "list", func(ctx context.Context, c *api.Client) (err error) {
			page, err = c.List(ctx, api.ListOptions{Limit: api.MaxListLimit, After: after})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Tasks...)
		if page.Next == "" {
			return all
		}
		after = page.Next
	}
}

// drain claims and finishes every task still waiting, on both queues, and
// finishes runs whose claimer's reply was lost in the failover. It
// returns how many tasks it handled.
func clusterDrain(t *testing.T, l *clusterLoad) int {
	t.Helper()
	handled := 0
	finish := func(task api.Task) {
		if err := l.do(handled%2, "result", func(ctx context.Context, c *api.Client) error {
			_, err := c.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true, Summary: "drained"})
			return err
		}); err != nil {
			t.Fatalf("finishing %s: %v", task.ID, err)
		}
		handled++
	}
	// A notification taken by the killed process reappears after the
	// ready consumer's ack wait (30s).
	deadline := time.Now().Add(120 * time.Second)
	for round := 0; ; round++ {
		waiting := 0
		for _, task := range clusterListAll(t, l) {
			switch task.Status {
			case "scheduled", "queued":
				waiting++
			case "running":
				finish(task) // its claimer lost the reply; it reports now
			}
		}
		if waiting == 0 {
			return handled
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks still waiting 120s after the load", waiting)
		}
		for _, q := range []string{clusterNextQueue, clusterDirectQueue} {
			var task api.Task
			var ok bool
			if err := l.do(round%2, "claims/next", func(ctx context.Context, c *api.Client) (err error) {
				task, ok, err = c.ClaimNext(ctx, q, "drainer", 200*time.Millisecond)
				return err
			}); err != nil {
				t.Fatalf("drain claim: %v", err)
			}
			if ok {
				finish(task)
			}
		}
	}
}

// clusterClaimedOnce fails if any task's history holds more than one Claimed.
func clusterClaimedOnce(t *testing.T, l *clusterLoad) {
	t.Helper()
	for i, task := range clusterListAll(t, l) {
		var h api.History
		if err := l.do(i%2, "history", func(ctx context.Context, c *api.Client) (err error) {
			h, err = c.History(ctx, task.ID)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if claims := countClaims(h); claims > 1 {
			t.Errorf("task %s claimed %d times", task.ID, claims)
		}
		if task.Status != "succeeded" {
			t.Errorf("task %s is %s after the drain", task.ID, task.Status)
		}
	}
}

// clusterVerify runs `taskledger replay verify` against the cluster,
// with the servers' chain key file.
func clusterVerify(t *testing.T, urls, keyFile string, acked int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(taskledgerBinary(t), "replay", "verify", "--nats-url", urls, "--chain-key-file", keyFile, "--json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var report replay.Report
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatalf("replay verify: %v (%v)\nstdout: %s\nstderr: %s", err, runErr, stdout.String(), stderr.String())
	}
	fmt.Printf("  replay verify: %d events, %d tasks, %d violations\n", report.Events, report.Tasks, len(report.Violations))
	for i, v := range report.Violations {
		if i == 20 {
			break
		}
		t.Errorf("violation at seq %d task %s: %s: %s", v.Seq, v.TaskID, v.Kind, v.Detail)
	}
	if runErr != nil || !report.Clean() {
		t.Fatalf("replay verify: %v, %d violations", runErr, len(report.Violations))
	}
	if report.Tasks < acked {
		t.Fatalf("replay verify saw %d tasks, %d were acknowledged", report.Tasks, acked)
	}
}

// clusterDumpTail logs the last n lines of a file.
func clusterDumpTail(t *testing.T, path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	t.Logf("--- last lines of %s:\n%s", filepath.Base(path), strings.Join(lines[max(0, len(lines)-n):], "\n"))
}

// clusterState describes the event stream's replicas and each server's
// projections, for a failure message.
func clusterState(nc *nats.Conn, shards events.Shards, addrs [2]string) string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, jsErr := jetstream.New(nc)
	for i := range shards.N() {
		if jsErr != nil {
			fmt.Fprintf(&b, "jetstream: %v\n", jsErr)
			break
		}
		name := shards.Stream(events.DefaultStream, i)
		if s, err := js.Stream(ctx, name); err != nil {
			fmt.Fprintf(&b, "event stream %s: %v\n", name, err)
		} else if info := s.CachedInfo(); info.Cluster != nil {
			fmt.Fprintf(&b, "event stream %s: last seq %d, leader %s\n", name, info.State.LastSeq, info.Cluster.Leader)
			for _, r := range info.Cluster.Replicas {
				fmt.Fprintf(&b, "  replica %s: current %t, offline %t, lag %d, active %s\n", r.Name, r.Current, r.Offline, r.Lag, r.Active)
			}
			cl := s.ListConsumers(ctx)
			for c := range cl.Info() {
				leader := ""
				if c.Cluster != nil {
					leader = c.Cluster.Leader
				}
				fmt.Fprintf(&b, "  consumer %s on %q: delivered %d, pending %d, waiting %d, created %s\n", c.Name, leader, c.Delivered.Stream, c.NumPending, c.NumWaiting, c.Created.Format("15:04:05.000"))
			}
			if err := cl.Err(); err != nil {
				fmt.Fprintf(&b, "  consumers: %v\n", err)
			}
		}
	}
	for _, addr := range addrs {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			fmt.Fprintf(&b, "%s /readyz: %v\n", addr, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Fprintf(&b, "%s /readyz: %d %s", addr, resp.StatusCode, body)
	}
	return b.String()
}
