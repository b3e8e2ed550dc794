package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// TestCrashPoints kills the server (a binary built with -tags crashpoints)
// at each interruption point of the delivery pipeline while clients
// schedule, claim (claims/next and POST /claim) and report, restarts it on
// the same data and checks that the log is clean (replay verify), that no
// acknowledged write was lost or moved backwards, that the interrupted
// request resolves on retry, that every waiting task is still delivered,
// that abandoned runs time out, and that no token was claimed twice.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "crashpoints")
	for _, point := range crashpoint.All {
		t.Run(crashSubtestName(point), func(t *testing.T) {
			t.Parallel()
			crashAt(t, bin, point)
		})
	}
}

// crashSubtestName turns "claim-received" into "ClaimReceived".
func crashSubtestName(point string) string {
	var b strings.Builder
	for _, part := range strings.Split(point, "-") {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

// The queue and the run timeouts of the crash traffic: every run times out
// by itself soon after the restart unless someone reports it, so nothing
// the crash cut off can stay running.
const (
	cpQueue          = "cp"
	cpTimeout        = 5 // seconds; a run that is reported
	cpAbandonTimeout = 1 // seconds; a run claimed and never reported
)

// cpPending is a request the crash cut off: its answer never came.
type cpPending struct {
	op, taskID, requestID, token, executor string
}

// cpLedger records, client-side, what the server acknowledged.
type cpLedger struct {
	mu        sync.Mutex
	status    map[string]string // task → last acknowledged status
	requests  map[string]string // requestId → task
	claims    map[string]string // task → acknowledged delivery token
	abandoned map[string]bool   // acknowledged claims never reported
	pending   []cpPending
}

func newCPLedger() *cpLedger {
	return &cpLedger{status: map[string]string{}, requests: map[string]string{}, claims: map[string]string{}, abandoned: map[string]bool{}}
}

func (l *cpLedger) set(id, status string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status[id] = status
}

func (l *cpLedger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.status)
}

func crashAt(t *testing.T, bin, point string) {
	data, addr := t.TempDir(), freeAddr(t)
	srv := mustLaunch(t, bin, data, addr, "TASKLEDGER_CRASH_AT="+point, "TASKLEDGER_CRASH_AFTER=10")
	led := newCPLedger()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var g errgroup.Group
	for w := range 3 {
		g.Go(func() error { return cpTraffic(ctx, srv.client, w, led) })
	}
	select {
	case <-srv.done:
	case <-time.After(30 * time.Second):
		stop()
		g.Wait()
		t.Fatalf("the server did not crash at %s within 30s (%d tasks acknowledged)\n%s", point, led.len(), srv.out)
	}
	stop()
	if err := g.Wait(); err != nil {
		t.Fatalf("traffic: %v\n%s", err, srv.out)
	}
	if !srv.killedBySIGKILL() {
		t.Fatalf("the server exited with %v, not by SIGKILL\n%s", srv.cmd.ProcessState, srv.out)
	}
	if !strings.Contains(srv.out.String(), "crashpoint: killing the process at "+point) {
		t.Fatalf("the server died without passing the crash point\n%s", srv.out)
	}
	t.Logf("crashed at %s with %d tasks acknowledged, %d requests cut off", point, led.len(), len(led.pending))

	// Recover, stop cleanly and verify the log offline; then serve again.
	srv = mustLaunch(t, bin, data, addr)
	srv.mustStop(t)
	mustVerify(t, bin, data)
	srv = mustLaunch(t, bin, data, addr)
	c := srv.client
	bg := context.Background()

	// (b) Nothing acknowledged is lost or moved backwards.
	for id, want := range led.status {
		got, err := c.Get(bg, id)
		if err != nil {
			t.Fatalf("acknowledged task %s (%s) after restart: %v", id, want, err)
		}
		if rank[got.Status] < rank[want] || rank[want] == 3 && got.Status != want {
			t.Fatalf("task %s moved from acknowledged %s to %s", id, want, got.Status)
		}
	}
	// (c) The cut-off requests resolve when retried as a client would.
	for _, p := range led.pending {
		cpResolve(t, c, led, p)
	}
	// (c) Every waiting task is delivered and claimed, every abandoned
	// run times out.
	cpDrain(t, c)
	tasks := listAll(t, c)
	byID := map[string]api.Task{}
	for _, task := range tasks {
		byID[task.ID] = task
		if task.Status != "succeeded" && task.Status != "timed_out" {
			t.Errorf("task %s ended %s (%s), want succeeded or timed_out", task.ID, task.Status, task.Reason)
		}
	}
	for id := range led.abandoned {
		if got := byID[id].Status; got != "timed_out" {
			t.Errorf("abandoned run %s ended %q, want timed_out", id, got)
		}
	}
	// (e) Nothing lost: every acknowledged task is listed.
	if len(tasks) < len(led.status) {
		t.Errorf("%d tasks listed, fewer than the %d acknowledged", len(tasks), len(led.status))
	}
	for id := range led.status {
		if _, ok := byID[id]; !ok {
			t.Errorf("acknowledged task %s is not listed", id)
		}
	}
	// (d) No token claimed twice; acknowledged claims are the logged ones.
	for _, task := range tasks {
		claims := claimedEvents(t, c, task.ID)
		if len(claims) > 1 {
			t.Errorf("task %s claimed %d times: %v", task.ID, len(claims), claims)
		}
		if tok, ok := led.claims[task.ID]; ok && (len(claims) != 1 || claims[0].DeliveryID != tok) {
			t.Errorf("task %s: acknowledged claim of token %s, log has %v", task.ID, tok, claims)
		}
	}
	srv.mustStop(t)
	mustVerify(t, bin, data)
}

// cpTraffic schedules tasks (some delayed), claims them through
// claims/next or through POST /claim with the delivery id read by GET,
// reports results, retries every third finished task (manual retry, with
// a request id), and leaves every fifth run abandoned with a 1s timeout.
// It returns when ctx ends or the server stops answering; a request cut
// off by the crash is recorded as pending.
func cpTraffic(ctx context.Context, c *api.Client, worker int, led *cpLedger) error {
	executor := fmt.Sprintf("w%d", worker)
	for i := 0; ctx.Err() == nil; i++ {
		reqID := fmt.Sprintf("cp-w%d-%d", worker, i)
		timeout := cpTimeout
		if i%5 == 0 {
			timeout = cpAbandonTimeout
		}
		req := api.ScheduleRequest{RequestID: reqID, Queue: cpQueue, TimeoutSeconds: &timeout,
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: reqID}}}}
		if i%6 == 0 {
			d := 1.0
			req.DelaySeconds = &d
		}
		task, _, err := c.Schedule(ctx, req)
		if err != nil {
			return cpCutOff(led, err, cpPending{op: "schedule", requestID: reqID})
		}
		led.mu.Lock()
		led.status[task.ID], led.requests[reqID] = task.Status, task.ID
		led.mu.Unlock()

		var claimed api.Task
		if i%2 == 0 {
			var ok bool
			claimed, ok, err = c.ClaimNext(ctx, cpQueue, executor, 100*time.Millisecond)
			if err != nil {
				return cpCutOff(led, err, cpPending{op: "claims/next"})
			}
			if !ok {
				continue
			}
		} else {
			ready, ok, err := awaitClaimable(ctx, c, task.ID, 2*time.Second)
			if err != nil {
				return cpCutOff(led, err, cpPending{op: "get", taskID: task.ID})
			}
			if !ok {
				continue // delayed, or claims/next took it
			}
			claimed, err = c.Claim(ctx, task.ID, ready.Delivery.ID, executor)
			if isConflict(err) {
				continue // a claims/next claimer won the race
			}
			if err != nil {
				return cpCutOff(led, err, cpPending{op: "claim", taskID: task.ID, token: ready.Delivery.ID, executor: executor})
			}
		}
		led.mu.Lock()
		led.status[claimed.ID], led.claims[claimed.ID] = claimed.Status, claimed.Claim.DeliveryID
		if claimed.TimeoutSeconds == cpAbandonTimeout {
			led.abandoned[claimed.ID] = true
		}
		led.mu.Unlock()
		if claimed.TimeoutSeconds == cpAbandonTimeout {
			continue // the executor vanished: the run must time out
		}
		done, err := c.RecordResult(ctx, claimed.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true, Summary: claimed.ID})
		if isConflict(err) {
			continue // timed out first
		}
		if err != nil {
			return cpCutOff(led, err, cpPending{op: "result", taskID: claimed.ID, token: claimed.Claim.DeliveryID})
		}
		led.set(done.ID, done.Status)
		if i%3 == 1 { // a manual retry of the finished task: a new task on the queue
			retryID := "retry-" + reqID
			retry, _, err := c.RetryTask(ctx, done.ID, api.RetryTaskRequest{RequestID: retryID})
			if err != nil {
				return cpCutOff(led, err, cpPending{op: "retry", taskID: done.ID, requestID: retryID})
			}
			led.mu.Lock()
			led.status[retry.ID], led.requests[retryID] = retry.Status, retry.ID
			led.mu.Unlock()
		}
	}
	return nil
}

// cpCutOff ends a traffic worker on a failed request: a request the crash
// cut off is recorded as pending; an error answer is a failure.
func cpCutOff(led *cpLedger, err error, p cpPending) error {
	var apiErr *api.Error
	if errors.As(err, &apiErr) && apiErr.Status != http.StatusServiceUnavailable {
		return fmt.Errorf("%s %s: %w", p.op, p.taskID+p.requestID, err)
	}
	// The traffic stops only once the server is dead, so whatever failed
	// was cut off by the crash (or never reached the server, which the
	// retry cannot tell apart either).
	led.mu.Lock()
	led.pending = append(led.pending, p)
	led.mu.Unlock()
	return nil
}

// awaitClaimable polls GET until task id has a claimable delivery token.
// ok is false when it has none within wait (not due yet, or claimed).
func awaitClaimable(ctx context.Context, c *api.Client, id string, wait time.Duration) (api.Task, bool, error) {
	deadline := time.Now().Add(wait)
	for {
		task, err := c.Get(ctx, id)
		if err != nil {
			return task, false, err
		}
		if task.Status != "scheduled" && task.Status != "queued" {
			return task, false, nil
		}
		if task.Delivery != nil {
			return task, true, nil
		}
		if time.Now().After(deadline) {
			return task, false, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cpResolve retries a request the crash cut off, as its client would, and
// checks the answer is consistent with the log: the write happened once
// or not at all.
func cpResolve(t *testing.T, c *api.Client, led *cpLedger, p cpPending) {
	t.Helper()
	bg := context.Background()
	switch p.op {
	case "schedule":
		// The same requestId names the same task whether or not the first
		// attempt was stored.
		timeout := cpTimeout
		task, created, err := c.Schedule(bg, api.ScheduleRequest{RequestID: p.requestID, Queue: cpQueue, TimeoutSeconds: &timeout,
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: p.requestID}}}})
		if err != nil {
			t.Fatalf("retrying schedule %s: %v", p.requestID, err)
		}
		t.Logf("cut-off schedule %s retried: task %s, created by the retry %v", p.requestID, task.ID, created)
		led.set(task.ID, task.Status)
	case "retry":
		// As for schedule: the retry's requestId names one new task.
		task, created, err := c.RetryTask(bg, p.taskID, api.RetryTaskRequest{RequestID: p.requestID})
		if err != nil || task.RetryOf != p.taskID {
			t.Fatalf("retrying the retry %s of %s: %+v %v", p.requestID, p.taskID, task, err)
		}
		t.Logf("cut-off retry %s retried: task %s, created by the retry %v", p.requestID, task.ID, created)
		led.set(task.ID, task.Status)
	case "claim":
		task, err := c.Get(bg, p.taskID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case task.Status == "running" && task.Claim != nil && task.Claim.DeliveryID == p.token && task.Claim.ExecutorID != p.executor:
			// Another executor's claim of the same token won (the workers
			// race for tasks): the retry must be refused.
			t.Logf("cut-off claim of %s lost to %s", p.taskID, task.Claim.ExecutorID)
			if _, err := c.Claim(bg, p.taskID, p.token, p.executor); !isConflict(err) {
				t.Fatalf("retrying the cut-off claim of %s after %s won: %v, want a conflict", p.taskID, task.Claim.ExecutorID, err)
			}
		case task.Status == "running" && task.Claim != nil && task.Claim.DeliveryID == p.token:
			// The claim was stored: the executor learns it and reports.
			t.Logf("cut-off claim of %s was stored; reporting", p.taskID)
			cpReport(t, c, p.taskID, p.token)
		case (task.Status == "scheduled" || task.Status == "queued") && task.Delivery != nil && task.Delivery.ID == p.token:
			// Not stored: the same token is still claimable.
			t.Logf("cut-off claim of %s was not stored; claiming again", p.taskID)
			if _, err := c.Claim(bg, p.taskID, p.token, p.executor); err != nil {
				t.Fatalf("retrying the cut-off claim of %s: %v", p.taskID, err)
			}
			cpReport(t, c, p.taskID, p.token)
		case task.Status == "timed_out" || task.Status == "succeeded":
		default:
			t.Fatalf("task %s after a cut-off claim of %s: %s, claim %+v, delivery %+v", p.taskID, p.token, task.Status, task.Claim, task.Delivery)
		}
	case "result":
		task, err := c.Get(bg, p.taskID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case task.Status == "running" && task.Claim != nil && task.Claim.DeliveryID == p.token:
			t.Logf("cut-off result of %s was not stored; reporting again", p.taskID)
			cpReport(t, c, p.taskID, p.token)
		case task.Status == "succeeded" && task.Result != nil && task.Result.Summary == p.taskID:
			// Stored before the crash: a retry is refused as terminal.
			t.Logf("cut-off result of %s was stored", p.taskID)
			_, err := c.RecordResult(bg, p.taskID, api.ResultRequest{DeliveryID: p.token, Success: true, Summary: p.taskID})
			if !isConflict(err) {
				t.Fatalf("repeated result of %s: %v, want a conflict", p.taskID, err)
			}
		case task.Status == "timed_out":
		default:
			t.Fatalf("task %s after a cut-off result: %s, claim %+v", p.taskID, task.Status, task.Claim)
		}
	}
}

// cpReport reports a run's result; a run that timed out meanwhile is fine.
func cpReport(t *testing.T, c *api.Client, id, token string) {
	t.Helper()
	_, err := c.RecordResult(context.Background(), id, api.ResultRequest{DeliveryID: token, Success: true, Summary: id})
	if err == nil {
		return
	}
	if task, gerr := c.Get(context.Background(), id); isConflict(err) && gerr == nil && task.Status == "timed_out" {
		return
	}
	t.Fatalf("reporting %s: %v", id, err)
}

// cpDrain claims (claims/next) and finishes every task still waiting, and
// waits for every run nobody reports to time out. A notification a
// claimer took but never acknowledged before the crash comes back after
// the consumer's ack wait (30s), so the drain allows for that.
func cpDrain(t *testing.T, c *api.Client) {
	t.Helper()
	bg := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		waiting := 0
		var sample []string
		for _, task := range listAll(t, c) {
			switch task.Status {
			case "scheduled", "queued", "running":
				waiting++
				if len(sample) < 5 {
					sample = append(sample, fmt.Sprintf("%s:%s delivery=%+v claim=%+v", task.ID, task.Status, task.Delivery, task.Claim))
				}
			}
		}
		if waiting == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks still waiting 60s after the restart, e.g. %v", waiting, sample)
		}
		task, ok, err := c.ClaimNext(bg, cpQueue, "drainer", 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			cpReport(t, c, task.ID, task.Claim.DeliveryID)
		}
	}
}

// listAll returns every task, following the pages.
func listAll(t *testing.T, c *api.Client) []api.Task {
	t.Helper()
	var all []api.Task
	after := ""
	for {
		l, err := c.List(context.Background(), api.ListOptions{Limit: api.MaxListLimit, After: after})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, l.Tasks...)
		if l.Next == "" {
			return all
		}
		after = l.Next
	}
}

// claimedEvent is the payload of a Claimed event as the history shows it.
type claimedEvent struct {
	DeliveryID string `json:"deliveryId"`
	ExecutorID string `json:"executorId"`
}

// claimedEvents returns the Claimed events of a task's history.
func claimedEvents(t *testing.T, c *api.Client, id string) []claimedEvent {
	t.Helper()
	h, err := c.History(context.Background(), id)
	if err != nil {
		t.Fatalf("history of %s: %v", id, err)
	}
	var out []claimedEvent
	for _, ev := range h.Events {
		if ev.Type != "Claimed" {
			continue
		}
		var ce claimedEvent
		if err := remarshal(ev.Data, &ce); err != nil {
			t.Fatalf("task %s: Claimed data %v: %v", id, ev.Data, err)
		}
		out = append(out, ce)
	}
	return out
}

func remarshal(in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// isConflict reports whether err is a 409 answer.
func isConflict(err error) bool {
	var apiErr *api.Error
	return errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict
}

// serveProc is a `taskledger serve` child process whose exit the test
// observes: done closes once it has exited.
type serveProc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	out    *tailBuffer
	client *api.Client
}

// launch starts `bin serve` on data and addr with env added to the
// environment (minus any crash point of the test's own), and waits until
// it answers. It may be called from any goroutine.
func launch(bin, data, addr string, env ...string) (*serveProc, error) {
	return launchFlags(bin, data, addr, nil, env...)
}

// launchFlags is launch with serve flags added.
func launchFlags(bin, data, addr string, flags []string, env ...string) (*serveProc, error) {
	args := append([]string{"serve", "--data", data, "--http", addr, "--log-format", "json", "--log-level", "warn"}, flags...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(childEnv(), env...)
	out := &tailBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &serveProc{cmd: cmd, done: make(chan struct{}), out: out, client: api.NewClient("http://"+addr, "")}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := p.client.List(ctx, api.ListOptions{Limit: 1})
		cancel()
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("server on %s exited while starting: %v\n%s", addr, cmd.ProcessState, out)
		default:
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("server on %s not ready: %v\n%s", addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mustLaunch is launch that fails the test, and kills the process when
// the test ends.
func mustLaunch(t *testing.T, bin, data, addr string, env ...string) *serveProc {
	t.Helper()
	p, err := launch(bin, data, addr, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	return p
}

// childEnv is the test's environment without crash point settings.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TASKLEDGER_") {
			env = append(env, kv)
		}
	}
	return env
}

// kill sends SIGKILL (if the process still runs) and waits for the exit.
func (p *serveProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits for a clean exit.
func (p *serveProc) stop() error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		p.kill()
		return fmt.Errorf("server did not stop within 90s of SIGTERM\n%s", p.out)
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("server stopped with %v\n%s", p.cmd.ProcessState, p.out)
	}
	return nil
}

func (p *serveProc) mustStop(t *testing.T) {
	t.Helper()
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
}

// mustCrashAt waits up to 30s for the process to die of SIGKILL at the
// crash point, failing the test otherwise.
func (p *serveProc) mustCrashAt(t *testing.T, point string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not crash at %s within 30s\n%s", point, p.out)
	}
	if !p.killedBySIGKILL() || !strings.Contains(p.out.String(), "crashpoint: killing the process at "+point) {
		t.Fatalf("the server exited with %v, not at the crash point %s\n%s", p.cmd.ProcessState, point, p.out)
	}
}

// killedBySIGKILL reports whether the exited process died of SIGKILL.
func (p *serveProc) killedBySIGKILL() bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// verifyLog runs `replay verify --data data --json` on a stopped server's
// data and returns its report; err is set when verify failed to run or
// exited non-zero.
func verifyLog(bin, data string) (replay.Report, error) {
	cmd := exec.Command(bin, "replay", "verify", "--data", data, "--json")
	cmd.Env = childEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var rep replay.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return rep, fmt.Errorf("replay verify: %v; output %q; %v\n%s", runErr, stdout.String(), err, stderr.String())
	}
	if runErr != nil {
		return rep, fmt.Errorf("replay verify: %v: %d violations, e.g. %+v\n%s", runErr, len(rep.Violations), rep.Violations[:min(len(rep.Violations), 10)], stderr.String())
	}
	return rep, nil
}

func mustVerify(t *testing.T, bin, data string) replay.Report {
	t.Helper()
	rep, err := verifyLog(bin, data)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Clean() {
		t.Fatalf("replay verify exited 0 with %d violations", len(rep.Violations))
	}
	return rep
}

// tailBuffer keeps the last 256 KiB written to it; safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 256<<10; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// TestCrashPointFired kills the server (a crashpoints build) right after
// a schedule's ScheduleFired is appended and before the run's task is
// scheduled, restarts it on the same data and checks that the fired
// instant got its task exactly once, that every run has one task, and
// that the log verifies clean.
func TestCrashPointFired(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "crashpoints")
	data, addr := t.TempDir(), freeAddr(t)
	srv := mustLaunch(t, bin, data, addr, "TASKLEDGER_CRASH_AT="+crashpoint.Fired, "TASKLEDGER_CRASH_AFTER=2")
	ctx := context.Background()
	if _, _, err := srv.client.CreateSchedule(ctx, api.ScheduleCreateRequest{ID: "cp", Every: "1s", Overlap: events.OverlapAllow,
		Task: api.ScheduleTask{Queue: cpQueue}}); err != nil {
		t.Fatal(err)
	}
	srv.mustCrashAt(t, crashpoint.Fired)
	srv = mustLaunch(t, bin, data, addr)
	settledRuns := func(least int) func() bool {
		return func() bool {
			s, err := srv.client.GetSchedule(ctx, "cp", api.ScheduleOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range s.Runs {
				if r.TaskID != "" && r.Status == "" {
					return false
				}
			}
			return s.RunCount >= least
		}
	}
	testnode.Eventually(t, "three runs with their tasks after the restart", settledRuns(3))
	if _, err := srv.client.PauseSchedule(ctx, "cp", api.ScheduleOptions{}); err != nil {
		t.Fatal(err)
	}
	testnode.Eventually(t, "every run's task", settledRuns(0))
	s, err := srv.client.GetSchedule(ctx, "cp", api.ScheduleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := srv.client.ScheduleHistory(ctx, "cp", api.ScheduleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fires := 0
	for _, e := range h.Events {
		if e.Type != string(events.TypeScheduleFired) {
			continue
		}
		fires++
		taskID, _ := e.Data.(map[string]any)["taskId"].(string)
		if _, err := srv.client.Get(ctx, taskID); err != nil {
			t.Fatalf("fire %v has no task %s after the restart: %v", e.Data, taskID, err)
		}
		if n := len(historyOf(t, srv.client, taskID)); n == 0 {
			t.Fatalf("task %s has no events", taskID)
		}
	}
	if fires != s.RunCount {
		t.Fatalf("%d fires, %d runs", fires, s.RunCount)
	}
	srv.mustStop(t)
	mustVerify(t, bin, data)
}

// historyOf returns a task's events.
func historyOf(t *testing.T, c *api.Client, id string) []api.Event {
	t.Helper()
	h, err := c.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return h.Events
}
