package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// binaries are the taskledger commands built once per set of build tags
// for the process tests, in one temporary directory.
var (
	binMu    sync.Mutex
	binDir   string
	binaries = map[string]*builtBinary{}
)

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// taskledgerBinary returns the taskledger command of a normal build.
func taskledgerBinary(t *testing.T) string {
	t.Helper()
	return buildBinary(t, "")
}

// buildBinary returns the taskledger command built with the build tags
// tags (comma-separated, "" for none), building it on first use.
func buildBinary(t *testing.T, tags string) string {
	t.Helper()
	binMu.Lock()
	if binDir == "" {
		dir, err := os.MkdirTemp("", "taskledger-bin-")
		if err != nil {
			binMu.Unlock()
			t.Fatal(err)
		}
		binDir = dir
	}
	b, ok := binaries[tags]
	if !ok {
		b = &builtBinary{}
		binaries[tags] = b
	}
	dir := binDir
	binMu.Unlock()
	b.once.Do(func() {
		name := "taskledger"
		args := []string{"build"}
		if tags != "" {
			name += "-" + strings.ReplaceAll(tags, ",", "-")
			args = append(args, "-tags", tags)
		}
		b.path = filepath.Join(dir, name)
		out, err := exec.Command("go", append(args, "-o", b.path, ".")...).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	binMu.Lock()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	binMu.Unlock()
	os.Exit(code)
}

// process is a `taskledger serve` child process.
type process struct {
	cmd    *exec.Cmd
	client *api.Client
}

// freeAddr returns a loopback address no listener holds now, for a
// server a test starts (and may restart) there. Its port is below the
// kernel's ephemeral range (32768 and up on Linux), which every port-0
// listener draws from, the embedded NATS servers' private listeners
// included: a port taken from that range and closed again could be
// handed to one of them before the test's server binds it.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(10000+rand.IntN(22000)))
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	t.Fatal("no free loopback port below 32000 in 100 tries")
	return ""
}

// envInt returns the whole number in the environment variable name,
// def when it is unset; outside min..max fails t.
func envInt(t *testing.T, name string, def, min, max int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < min || n > max {
		t.Fatalf("%s=%q: want a whole number from %d to %d", name, s, min, max)
	}
	return n
}

// startServer runs `taskledger serve` on dataDir with flags added and
// waits until it answers.
func startServer(t *testing.T, dataDir, addr string, flags ...string) *process {
	t.Helper()
	args := append([]string{"serve", "--data", dataDir, "--http", addr, "--log-format", "json", "--log-level", "warn"}, flags...)
	cmd := exec.Command(taskledgerBinary(t), args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, client: api.NewClient("http://"+addr, "")}
	t.Cleanup(func() { p.kill() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := p.client.List(ctx, api.ListOptions{Limit: 1})
		cancel()
		if err == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("server on %s not ready: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *process) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}

// acked records, per task, the last status the server acknowledged.
type acked struct {
	mu     sync.Mutex
	status map[string]string
}

func (a *acked) set(id, status string) {
	a.mu.Lock()
	a.status[id] = status
	a.mu.Unlock()
}

// rank orders statuses so "moved backwards" can be checked.
var rank = map[string]int{"scheduled": 0, "queued": 1, "running": 2, "succeeded": 3, "failed": 3, "canceled": 3, "timed_out": 3}

// TestKillNineMidTraffic kills the server with SIGKILL while clients
// schedule, claim and report, restarts it on the same data, and checks
// that nothing acknowledged was lost or moved backwards, that every
// waiting task is still released and claimable, that a run whose
// executor vanished times out, and that no token was claimed twice.
func TestKillNineMidTraffic(t *testing.T) {
	t.Parallel()
	data, addr := t.TempDir(), freeAddr(t)
	srv := startServer(t, data, addr)
	rec := &acked{status: map[string]string{}}
	ctx, stop := context.WithCancel(context.Background())
	var g errgroup.Group
	for w := range 4 {
		g.Go(func() error { return traffic(ctx, srv.client, w, rec) })
	}
	// Let traffic build up, then kill the server without warning.
	for {
		rec.mu.Lock()
		n := len(rec.status)
		rec.mu.Unlock()
		if n >= 150 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv.kill()
	stop()
	g.Wait()

	srv = startServer(t, data, addr)
	c := srv.client
	bg := context.Background()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for id, want := range rec.status {
		got, err := c.Get(bg, id)
		if err != nil {
			t.Fatalf("acknowledged task %s (%s) after restart: %v", id, want, err)
		}
		if rank[got.Status] < rank[want] || rank[want] == 3 && got.Status != want {
			t.Fatalf("task %s moved from acknowledged %s to %s", id, want, got.Status)
		}
	}
	// Drain: every task not running or terminal must become claimable
	// (delayed ones once due); claim and finish them all.
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := c.List(bg, api.ListOptions{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		waiting := 0
		for _, task := range l.Tasks {
			switch task.Status {
			case "scheduled", "queued":
				waiting++
			case "running":
				if task.TimeoutSeconds > 1 {
					// Its executor was cut off by the kill between claim
					// and result; it reports now, as it would on retry.
					if _, err := c.RecordResult(bg, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
						t.Fatal(err)
					}
					continue
				}
				waiting++ // abandoned: must time out
			}
		}
		if waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks still waiting after restart", waiting)
		}
		task, ok, err := c.ClaimNext(bg, "crash", "drainer", 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if _, err := c.RecordResult(bg, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for id := range rec.status {
		h, err := c.History(bg, id)
		if err != nil {
			t.Fatal(err)
		}
		if claims := countClaims(h); claims > 1 {
			t.Fatalf("task %s claimed %d times", id, claims)
		}
	}
}

// traffic schedules tasks (some delayed), claims them with claims/next and
// reports results; one in five claimed runs is abandoned with a 1s timeout
// to stand for an executor that vanished.
func traffic(ctx context.Context, c *api.Client, worker int, rec *acked) error {
	for i := 0; ctx.Err() == nil; i++ {
		req := api.ScheduleRequest{Queue: "crash", Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: fmt.Sprintf("w%d-%d", worker, i)}}}}
		timeout := 3600
		if i%5 == 0 {
			timeout = 1
		}
		req.TimeoutSeconds = &timeout
		if i%7 == 0 {
			d := 1.5
			req.DelaySeconds = &d
		}
		task, _, err := c.Schedule(ctx, req)
		if err != nil {
			return ignoreCrash(err)
		}
		rec.set(task.ID, task.Status)
		claimed, ok, err := c.ClaimNext(ctx, "crash", fmt.Sprintf("w%d", worker), 50*time.Millisecond)
		if err != nil {
			return ignoreCrash(err)
		}
		if !ok {
			continue
		}
		rec.set(claimed.ID, claimed.Status)
		if claimed.TimeoutSeconds == 1 {
			continue // abandoned: must time out after the restart
		}
		done, err := c.RecordResult(ctx, claimed.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true})
		if err != nil {
			return ignoreCrash(err)
		}
		rec.set(done.ID, done.Status)
	}
	return nil
}

// ignoreCrash treats the errors of a killed server as the end of traffic.
func ignoreCrash(err error) error {
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		return err
	}
	return nil
}

// countClaims counts the Claimed events of a task's history.
func countClaims(h api.History) int {
	n := 0
	for _, ev := range h.Events {
		if ev.Type == "Claimed" {
			n++
		}
	}
	return n
}
