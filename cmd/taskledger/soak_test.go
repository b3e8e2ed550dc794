package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// soakQueue is the queue of the soak's tasks; soakAbandonTimeout is the
// run timeout of the tasks whose claimer walks away; soakAttempts is the
// retry policy's maxAttempts of the retrying tasks; soakKeys and
// soakKeyLimit are the concurrency keys of the keyed tasks and their
// limit; soakSchedule is the periodic schedule firing into soakQueue.
const (
	soakQueue          = "soak"
	soakAbandonTimeout = 2
	soakAttempts       = 3
	soakKeys           = 3
	soakKeyLimit       = 2
	soakSchedule       = "soak-every-second"
)

// TestSoakKillNine runs a mixed load against `taskledger serve` and kills
// the server with SIGKILL every SOAK_KILL_EVERY (default 4s) for
// SOAK_SECONDS (default 30), restarting it on the same data each time.
// Clients retry every request the kill cut off with the same requestId,
// message id or delivery token, and record what the server acknowledged.
// At the end the log must verify clean offline, every acknowledged write
// must be in it (tasks, claims with their token, results and cancels with
// their outcome, mailbox messages at their index) and nothing may be there
// twice (a message id in a mailbox, a Claimed in a task attempt). Some
// tasks retry on failure and some share a concurrency key (replay verify
// checks a key never has more holders than its limit), and a periodic
// schedule fires every second through the kills: each fired instant must
// have exactly one task.
func TestSoakKillNine(t *testing.T) {
	t.Parallel()
	duration := envDuration(t, "SOAK_SECONDS", 30*time.Second)
	every := envDuration(t, "SOAK_KILL_EVERY", 4*time.Second)
	bin := taskledgerBinary(t)
	data, addr := t.TempDir(), freeAddr(t)

	var curMu sync.Mutex
	cur := mustLaunch(t, bin, data, addr)
	t.Cleanup(func() {
		curMu.Lock()
		defer curMu.Unlock()
		cur.kill()
	})
	c := api.NewClient("http://"+addr, "")
	c.HTTP.Timeout = 30 * time.Second
	led := newSoakLedger()
	if _, _, err := c.CreateSchedule(context.Background(), api.ScheduleCreateRequest{ID: soakSchedule, Every: "1s",
		Overlap: events.OverlapAllow, Task: api.ScheduleTask{Queue: soakQueue, Message: soakMessage("periodic"), Labels: map[string]string{"kind": "periodic"}}}); err != nil {
		t.Fatal(err)
	}

	loadCtx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	var load errgroup.Group
	for w := range 4 {
		g := &soakGen{c: c, led: led, w: w, r: rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))}
		load.Go(func() error { return g.run(loadCtx) })
	}
	load.Go(func() error { return soakClaimNext(loadCtx, c, led) })

	// Kill -9 at every tick of SOAK_KILL_EVERY and restart, until the
	// time is up; the last tick leaves the server some time to serve.
	start := time.Now()
	end := start.Add(duration)
	for k := 1; start.Add(time.Duration(k) * every).Before(end.Add(-every / 4)); k++ {
		curMu.Lock()
		p := cur
		curMu.Unlock()
		select {
		case <-time.After(time.Until(start.Add(time.Duration(k) * every))):
		case <-p.done:
			stopLoad()
			load.Wait()
			t.Fatalf("the server exited by itself: %v\n%s", p.cmd.ProcessState, p.out)
		}
		p.kill()
		led.kills.Add(1)
		next, err := launch(bin, data, addr)
		if err != nil {
			stopLoad()
			load.Wait()
			t.Fatalf("restart after kill %d: %v", led.kills.Load(), err)
		}
		curMu.Lock()
		cur = next
		curMu.Unlock()
	}
	for time.Now().Before(end) {
		time.Sleep(time.Until(end))
	}
	stopLoad()
	if err := load.Wait(); err != nil {
		t.Fatalf("load: %v", err)
	}

	// Stop cleanly, verify the log offline, serve again and compare the
	// log with what was acknowledged.
	curMu.Lock()
	err := cur.stop()
	curMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	rep, verr := verifyLog(bin, data)
	led.violations = len(rep.Violations)
	srv := mustLaunch(t, bin, data, addr)
	curMu.Lock()
	cur = srv
	curMu.Unlock()
	tasks := led.check(t, srv.client)
	led.checkSchedule(t, srv.client)
	led.report(t, rep.Events, tasks)
	if verr != nil {
		t.Fatal(verr)
	}
}

// envDuration reads a duration from env: a number of seconds or a Go
// duration ("4s"); def when unset.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second))
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want seconds or a duration", name, v)
	}
	return d
}

// soakClaim is an acknowledged claim.
type soakClaim struct{ token, executor string }

// soakOutcome is an acknowledged result or cancel.
type soakOutcome struct{ status, summary, reason string }

// soakMail is an acknowledged mailbox message.
type soakMail struct {
	taskID string
	index  int
}

// soakLedger records, client-side, every write the server acknowledged.
// It is safe for concurrent use.
type soakLedger struct {
	mu        sync.Mutex
	requests  map[string]string // requestId → task (acknowledged schedules)
	parent    map[string]string // requestId → parent task ("" for a root)
	tasks     []string          // acknowledged tasks, in order
	roots     []string
	parents   []string               // roots held back (runAt far ahead) to take children
	children  map[string]int         // root → acknowledged children
	unclaimed []string               // acknowledged tasks nobody claimed yet
	claims    map[string][]soakClaim // acknowledged claims of each task, one per attempt
	outcomes  map[string]soakOutcome // acknowledged results and cancels
	canceling map[string]bool        // roots a cancel was sent for
	abandoned map[string]bool        // claimed runs never reported
	mail      map[string]soakMail    // message id → where it was accepted
	mailIDs   []string

	schedules, children2, scheduleReplays, childrenRefused     atomic.Int64
	claimsWon, claimsLost, claimsRecovered, claimsNext         atomic.Int64
	results, resultsRefused, cancels, cancelsRefused, messages atomic.Int64
	mailReplays, mailRefused, retries, kills                   atomic.Int64
	retrying, keyed, attemptsFailed                            atomic.Int64
	violations, fires                                          int
}

func newSoakLedger() *soakLedger {
	return &soakLedger{
		requests: map[string]string{}, parent: map[string]string{}, children: map[string]int{},
		claims: map[string][]soakClaim{}, outcomes: map[string]soakOutcome{}, canceling: map[string]bool{},
		abandoned: map[string]bool{}, mail: map[string]soakMail{},
	}
}

// soakDo sends a request until it gets an answer from a live server: a
// transport error or a 503 means the server is being killed or restarted,
// so the same request (same requestId, message id or token) goes again.
// retried says whether an earlier attempt may have reached the server.
func (l *soakLedger) do(ctx context.Context, call func(ctx context.Context) error) (retried bool, err error) {
	for {
		err = call(ctx)
		if err == nil || ctx.Err() != nil || !serverDown(err) {
			return retried, err
		}
		retried = true
		l.retries.Add(1)
		select {
		case <-ctx.Done():
			return retried, ctx.Err()
		case <-time.After(time.Duration(20+rand.IntN(80)) * time.Millisecond):
		}
	}
}

// serverDown reports whether err is no answer at all, or a 503.
func serverDown(err error) bool {
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		return apiErr.Status == http.StatusServiceUnavailable
	}
	return err != nil
}

// conflictReason returns the reason of a 409 answer, or "".
func conflictReason(err error) string {
	var apiErr *api.Error
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict {
		return apiErr.Reason
	}
	return ""
}

// soakGen is one load generator.
type soakGen struct {
	c   *api.Client
	led *soakLedger
	w   int
	n   int
	r   *rand.Rand
}

func (g *soakGen) run(ctx context.Context) error {
	for ctx.Err() == nil {
		g.n++
		var err error
		switch op := g.r.IntN(20); {
		case op < 6:
			err = g.scheduleRoot(ctx)
		case op < 8:
			err = g.scheduleChild(ctx)
		case op < 13:
			err = g.claimTwice(ctx)
		case op < 14:
			err = g.cancelRoot(ctx)
		case op < 18:
			err = g.appendMail(ctx)
		default:
			err = g.replay(ctx)
		}
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("worker %d: %w", g.w, err)
		}
	}
	return nil
}

func soakMessage(text string) events.Message {
	return events.Message{Content: []events.ContentPart{{Type: "text", Text: text}}}
}

func (g *soakGen) scheduleRoot(ctx context.Context) error {
	req := api.ScheduleRequest{RequestID: fmt.Sprintf("s%d-%d", g.w, g.n), Queue: soakQueue, Message: soakMessage("root")}
	if g.r.IntN(2) == 0 { // labeled specs in the log the kills cut through
		req.Labels = map[string]string{"worker": strconv.Itoa(g.w), "kind": "root"}
	}
	if g.r.IntN(5) == 0 {
		// A parent: due in an hour, so it stays live to take children,
		// mail and a cancel.
		d := 3600.0
		req.DelaySeconds = &d
	} else if g.r.IntN(8) == 0 {
		d := 0.5
		req.DelaySeconds = &d
	}
	if g.r.IntN(10) == 0 {
		timeout := soakAbandonTimeout
		req.TimeoutSeconds = &timeout
	}
	if req.DelaySeconds == nil || *req.DelaySeconds < 60 {
		if g.r.IntN(4) == 0 {
			req.Retry = &api.RetryRequest{MaxAttempts: new(soakAttempts), BackoffSeconds: new(1), MaxBackoffSeconds: new(1)}
			g.led.retrying.Add(1)
		}
		if g.r.IntN(4) == 0 {
			req.Concurrency = &events.Concurrency{Key: fmt.Sprintf("soak-%d", g.r.IntN(soakKeys)), Limit: soakKeyLimit}
			g.led.keyed.Add(1)
		}
	}
	return g.schedule(ctx, req)
}

func (g *soakGen) scheduleChild(ctx context.Context) error {
	l := g.led
	l.mu.Lock()
	pool := l.parents
	if len(pool) == 0 || g.r.IntN(5) == 0 {
		pool = l.roots
	}
	if len(pool) == 0 {
		l.mu.Unlock()
		return g.scheduleRoot(ctx)
	}
	root := pool[g.r.IntN(len(pool))]
	l.mu.Unlock()
	req := api.ScheduleRequest{RequestID: fmt.Sprintf("c%d-%d", g.w, g.n), ParentID: root, Queue: soakQueue, Message: soakMessage("child")}
	return g.schedule(ctx, req)
}

func (g *soakGen) schedule(ctx context.Context, req api.ScheduleRequest) error {
	var task api.Task
	_, err := g.led.do(ctx, func(ctx context.Context) (err error) {
		task, _, err = g.c.Schedule(ctx, req)
		return err
	})
	if req.ParentID != "" && conflictReason(err) == "parent_terminal" {
		g.led.childrenRefused.Add(1)
		return nil
	}
	if err != nil {
		return fmt.Errorf("schedule %s: %w", req.RequestID, err)
	}
	l := g.led
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests[req.RequestID], l.parent[req.RequestID] = task.ID, req.ParentID
	l.tasks = append(l.tasks, task.ID)
	if req.DelaySeconds != nil && *req.DelaySeconds > 60 {
		l.parents = append(l.parents, task.ID)
	} else {
		l.unclaimed = append(l.unclaimed, task.ID)
	}
	if req.ParentID == "" {
		l.roots = append(l.roots, task.ID)
		l.schedules.Add(1)
	} else {
		l.children[req.ParentID]++
		l.children2.Add(1)
	}
	return nil
}

// claimTwice reads a task's delivery token and has two claimers POST
// /claim with it at once; at most one may win. The winner reports a
// result, or walks away when the task's timeout says it is abandoned.
func (g *soakGen) claimTwice(ctx context.Context) error {
	l := g.led
	l.mu.Lock()
	if len(l.unclaimed) == 0 {
		l.mu.Unlock()
		return g.scheduleRoot(ctx)
	}
	i := g.r.IntN(len(l.unclaimed))
	id := l.unclaimed[i]
	l.unclaimed[i] = l.unclaimed[len(l.unclaimed)-1]
	l.unclaimed = l.unclaimed[:len(l.unclaimed)-1]
	l.mu.Unlock()

	var task api.Task
	if _, err := l.do(ctx, func(ctx context.Context) (err error) {
		task, err = g.c.Get(ctx, id)
		return err
	}); err != nil {
		return fmt.Errorf("get %s: %w", id, err)
	}
	switch {
	case task.Status != "scheduled" && task.Status != "queued":
		return nil // claimed through claims/next, or canceled
	case task.Delivery == nil:
		l.mu.Lock()
		l.unclaimed = append(l.unclaimed, id) // not due yet
		l.mu.Unlock()
		return nil
	}
	token := task.Delivery.ID
	type answer struct {
		executor string
		task     api.Task
		retried  bool
		err      error
	}
	var answers [2]answer
	var wg sync.WaitGroup
	for k := range answers {
		answers[k].executor = fmt.Sprintf("x%d-%d-%d", g.w, g.n, k)
		wg.Go(func() {
			a := &answers[k]
			a.retried, a.err = l.do(ctx, func(ctx context.Context) (err error) {
				a.task, err = g.c.Claim(ctx, id, token, a.executor)
				return err
			})
		})
	}
	wg.Wait()
	winner := -1
	for k, a := range answers {
		switch {
		case a.err == nil && winner >= 0:
			return fmt.Errorf("task %s: token %s claimed by both %s and %s", id, token, answers[winner].executor, a.executor)
		case a.err == nil:
			winner = k
			l.claimsWon.Add(1)
		case conflictReason(a.err) != "":
			l.claimsLost.Add(1)
		case ctx.Err() != nil:
			return nil
		default:
			return fmt.Errorf("claim %s: %w", id, a.err)
		}
	}
	if winner < 0 {
		// A claim the kill cut off may have been stored: the log says whom
		// the token went to. That claimer carries on, unacknowledged.
		for _, a := range answers {
			if !a.retried {
				continue
			}
			if _, err := l.do(ctx, func(ctx context.Context) (err error) {
				task, err = g.c.Get(ctx, id)
				return err
			}); err != nil {
				return nil
			}
			if task.Claim != nil && task.Claim.DeliveryID == token && task.Claim.ExecutorID == a.executor {
				l.claimsRecovered.Add(1)
				return soakFinish(ctx, g.c, l, task, g.r.IntN(4) != 0)
			}
		}
		return nil
	}
	task = answers[winner].task
	l.mu.Lock()
	l.claims[id] = append(l.claims[id], soakClaim{token: token, executor: answers[winner].executor})
	l.mu.Unlock()
	return soakFinish(ctx, g.c, l, task, g.r.IntN(4) != 0)
}

// soakFinish reports the result of a claimed run, or abandons it when its
// timeout marks it as one whose executor walks away. A failure with
// attempts left is acknowledged as a retry, not an outcome: the task goes
// back to scheduled and claims/next takes its next attempt.
func soakFinish(ctx context.Context, c *api.Client, l *soakLedger, task api.Task, success bool) error {
	if task.TimeoutSeconds == soakAbandonTimeout {
		l.mu.Lock()
		l.abandoned[task.ID] = true
		l.mu.Unlock()
		return nil
	}
	req := api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: success, Summary: "res-" + task.ID}
	if !success {
		req.Error = "failed on purpose"
	}
	_, err := l.do(ctx, func(ctx context.Context) error {
		_, err := c.RecordResult(ctx, task.ID, req)
		return err
	})
	switch {
	case err == nil && !success && task.Attempt < task.MaxAttempts:
		l.attemptsFailed.Add(1)
	case err == nil:
		status := "succeeded"
		if !success {
			status = "failed"
		}
		l.mu.Lock()
		l.outcomes[task.ID] = soakOutcome{status: status, summary: req.Summary}
		l.mu.Unlock()
		l.results.Add(1)
	case conflictReason(err) != "":
		// Canceled meanwhile, or stored by a cut-off attempt.
		l.resultsRefused.Add(1)
	case ctx.Err() != nil:
	default:
		return fmt.Errorf("result %s: %w", task.ID, err)
	}
	return nil
}

// cancelRoot cancels a root that has acknowledged children.
func (g *soakGen) cancelRoot(ctx context.Context) error {
	l := g.led
	l.mu.Lock()
	var id string
	for range 10 {
		pool := l.parents
		if len(pool) == 0 || g.r.IntN(4) == 0 {
			pool = l.roots
		}
		if len(pool) == 0 {
			break
		}
		cand := pool[g.r.IntN(len(pool))]
		if l.children[cand] > 0 && !l.canceling[cand] {
			id = cand
			l.canceling[id] = true
			break
		}
	}
	l.mu.Unlock()
	if id == "" {
		return g.scheduleChild(ctx)
	}
	reason := "cancel-" + id
	_, err := l.do(ctx, func(ctx context.Context) error {
		_, err := g.c.Cancel(ctx, id, reason)
		return err
	})
	l.mu.Lock()
	if i := slices.Index(l.parents, id); i >= 0 && (err == nil || conflictReason(err) == "terminal") {
		l.parents = slices.Delete(l.parents, i, i+1) // ended: no more children
	}
	l.mu.Unlock()
	switch {
	case err == nil:
		l.mu.Lock()
		l.outcomes[id] = soakOutcome{status: "canceled", reason: reason}
		l.mu.Unlock()
		l.cancels.Add(1)
	case conflictReason(err) == "terminal":
		l.cancelsRefused.Add(1)
	case ctx.Err() != nil:
	default:
		return fmt.Errorf("cancel %s: %w", id, err)
	}
	return nil
}

// appendMail adds a message with a client-chosen id to a task's mailbox.
func (g *soakGen) appendMail(ctx context.Context) error {
	l := g.led
	l.mu.Lock()
	pool := l.parents
	if len(pool) == 0 || g.r.IntN(2) == 0 {
		pool = l.tasks
	}
	if len(pool) == 0 {
		l.mu.Unlock()
		return g.scheduleRoot(ctx)
	}
	id := pool[g.r.IntN(len(pool))]
	l.mu.Unlock()
	msg := soakMessage("mail")
	msg.ID = fmt.Sprintf("m%d-%d", g.w, g.n)
	var a api.MailAccepted
	_, err := l.do(ctx, func(ctx context.Context) (err error) {
		a, err = g.c.AppendMail(ctx, id, msg)
		return err
	})
	switch {
	case err == nil:
		if a.MessageID != msg.ID || a.Index < 1 {
			return fmt.Errorf("mailbox %s: message %s accepted as %+v", id, msg.ID, a)
		}
		l.mu.Lock()
		l.mail[msg.ID] = soakMail{taskID: id, index: a.Index}
		l.mailIDs = append(l.mailIDs, msg.ID)
		l.mu.Unlock()
		l.messages.Add(1)
	case conflictReason(err) == "terminal":
		l.mailRefused.Add(1)
	case ctx.Err() != nil:
	default:
		return fmt.Errorf("mailbox %s: %w", id, err)
	}
	return nil
}

// replay repeats an acknowledged schedule or mailbox message: the server
// must answer as the first time (same task; same index, even on a task
// that has become terminal).
func (g *soakGen) replay(ctx context.Context) error {
	l := g.led
	l.mu.Lock()
	var reqID, msgID string
	if len(l.mailIDs) > 0 && g.r.IntN(2) == 0 {
		msgID = l.mailIDs[g.r.IntN(len(l.mailIDs))]
	} else if n := len(l.requests); n > 0 {
		for reqID = range l.requests {
			break
		}
	}
	want, wantMail, parent := l.requests[reqID], l.mail[msgID], l.parent[reqID]
	l.mu.Unlock()
	switch {
	case msgID != "":
		msg := soakMessage("mail")
		msg.ID = msgID
		var a api.MailAccepted
		if _, err := l.do(ctx, func(ctx context.Context) (err error) {
			a, err = g.c.AppendMail(ctx, wantMail.taskID, msg)
			return err
		}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("repeated message %s: %w", msgID, err)
		}
		if a.Index != wantMail.index {
			return fmt.Errorf("repeated message %s: index %d, first accepted at %d", msgID, a.Index, wantMail.index)
		}
		l.mailReplays.Add(1)
	case reqID != "":
		req := api.ScheduleRequest{RequestID: reqID, ParentID: parent, Queue: soakQueue, Message: soakMessage("replay")}
		var task api.Task
		var created bool
		if _, err := l.do(ctx, func(ctx context.Context) (err error) {
			task, created, err = g.c.Schedule(ctx, req)
			return err
		}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("repeated schedule %s: %w", reqID, err)
		}
		if task.ID != want || created {
			return fmt.Errorf("repeated schedule %s: task %s created %v, first answer %s", reqID, task.ID, created, want)
		}
		l.scheduleReplays.Add(1)
	}
	return nil
}

// soakClaimNext claims through claims/next and reports, as an executor.
func soakClaimNext(ctx context.Context, c *api.Client, l *soakLedger) error {
	r := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
	for i := 0; ctx.Err() == nil; i++ {
		executor := fmt.Sprintf("next-%d", i)
		var task api.Task
		var ok bool
		_, err := l.do(ctx, func(ctx context.Context) (err error) {
			task, ok, err = c.ClaimNext(ctx, soakQueue, executor, 200*time.Millisecond)
			return err
		})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("claims/next: %w", err)
		}
		if !ok {
			continue
		}
		l.claimsNext.Add(1)
		l.mu.Lock()
		l.claims[task.ID] = append(l.claims[task.ID], soakClaim{token: task.Claim.DeliveryID, executor: executor})
		l.mu.Unlock()
		if err := soakFinish(ctx, c, l, task, r.IntN(4) != 0); err != nil {
			return err
		}
	}
	return nil
}

// check compares the log, read through a freshly started server, with
// what was acknowledged, and returns the number of tasks listed.
func (l *soakLedger) check(t *testing.T, c *api.Client) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	bg := context.Background()

	// Abandoned runs time out, across the restarts too.
	deadline := time.Now().Add(30 * time.Second)
	for id := range l.abandoned {
		for {
			task, err := c.Get(bg, id)
			if err != nil {
				t.Fatalf("abandoned task %s: %v", id, err)
			}
			if rank[task.Status] == 3 {
				if _, acked := l.outcomes[id]; !acked && task.Status != "timed_out" && task.Status != "canceled" {
					t.Errorf("abandoned run %s ended %s, want timed_out", id, task.Status)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("abandoned run %s still %s", id, task.Status)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	tasks := listAll(t, c)
	if len(tasks) < len(l.requests) {
		t.Errorf("%d tasks listed, fewer than the %d acknowledged schedules", len(tasks), len(l.requests))
	}
	acked := map[string]bool{}
	for _, id := range l.requests {
		acked[id] = true
	}
	mailOf := map[string][]string{}
	for msgID, m := range l.mail {
		mailOf[m.taskID] = append(mailOf[m.taskID], msgID)
	}
	var g errgroup.Group
	g.SetLimit(8)
	for _, listed := range tasks {
		delete(acked, listed.ID)
		g.Go(func() error {
			l.checkTask(t, c, listed.ID, mailOf[listed.ID])
			return nil
		})
	}
	g.Wait()
	for id := range acked {
		t.Errorf("acknowledged task %s is not listed", id)
	}
	return len(tasks)
}

// checkTask checks one task against the ledger (read-only while check
// holds l.mu).
func (l *soakLedger) checkTask(t *testing.T, c *api.Client, id string, mailIDs []string) {
	bg := context.Background()
	task, err := c.Get(bg, id)
	if err != nil {
		t.Errorf("task %s: %v", id, err)
		return
	}
	if want, ok := l.outcomes[id]; ok {
		switch {
		case task.Status != want.status:
			t.Errorf("task %s: acknowledged %s, log says %s", id, want.status, task.Status)
		case want.summary != "" && (task.Result == nil || task.Result.Summary != want.summary):
			t.Errorf("task %s: acknowledged result %q, log has %+v", id, want.summary, task.Result)
		case want.reason != "" && task.Reason != want.reason:
			t.Errorf("task %s: acknowledged cancel %q, log has reason %q", id, want.reason, task.Reason)
		}
	}
	claims := claimedEvents(t, c, id)
	tokens := map[string]string{} // delivery token → executor, from the log
	for _, ce := range claims {
		if _, dup := tokens[ce.DeliveryID]; dup {
			t.Errorf("task %s: token %s claimed twice: %+v", id, ce.DeliveryID, claims)
		}
		tokens[ce.DeliveryID] = ce.ExecutorID
	}
	if len(claims) > max(1, task.MaxAttempts) || len(claims) > task.Attempt {
		t.Errorf("task %s claimed %d times in %d of %d attempts: %+v", id, len(claims), task.Attempt, task.MaxAttempts, claims)
	}
	for _, want := range l.claims[id] {
		if got, ok := tokens[want.token]; !ok || got != want.executor {
			t.Errorf("task %s: acknowledged claim %+v, log has %+v", id, want, claims)
		}
	}
	if task.Mailbox.Count == 0 && len(mailIDs) == 0 {
		return
	}
	mail, err := c.Mailbox(bg, id, 0)
	if err != nil {
		t.Errorf("mailbox %s: %v", id, err)
		return
	}
	at := map[string]int{}
	for i, m := range mail.Messages {
		if m.Index != i+1 {
			t.Errorf("mailbox %s: message %d has index %d", id, i+1, m.Index)
		}
		if _, dup := at[m.ID]; dup {
			t.Errorf("mailbox %s: message %s twice", id, m.ID)
		}
		at[m.ID] = m.Index
	}
	for _, msgID := range mailIDs {
		if got, want := at[msgID], l.mail[msgID].index; got != want {
			t.Errorf("mailbox %s: acknowledged message %s at %d, log has it at %d", id, msgID, want, got)
		}
	}
}

// checkSchedule pauses the soak's periodic schedule and checks its log:
// every fired instant once, each run's task in the log, as many runs as
// the schedule counts, and at least one.
func (l *soakLedger) checkSchedule(t *testing.T, c *api.Client) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.PauseSchedule(ctx, soakSchedule, api.ScheduleOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := c.ScheduleHistory(ctx, soakSchedule, api.ScheduleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	instants, tasks, runs := map[string]bool{}, map[string]bool{}, 0
	for _, e := range h.Events {
		if e.Type != string(events.TypeScheduleFired) {
			continue
		}
		var f struct {
			At     string `json:"at"`
			TaskID string `json:"taskId"`
		}
		if err := remarshal(e.Data, &f); err != nil {
			t.Fatalf("ScheduleFired %v: %v", e.Data, err)
		}
		if instants[f.At] || (f.TaskID != "" && tasks[f.TaskID]) {
			t.Errorf("schedule fired %s (task %s) twice", f.At, f.TaskID)
		}
		instants[f.At], tasks[f.TaskID] = true, true
		if f.TaskID == "" {
			continue // skipped
		}
		runs++
		if _, err := c.Get(ctx, f.TaskID); err != nil {
			t.Errorf("fire at %s: task %s: %v", f.At, f.TaskID, err)
		}
	}
	s, err := c.GetSchedule(ctx, soakSchedule, api.ScheduleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if runs == 0 || runs != s.RunCount {
		t.Errorf("schedule %s: %d runs with a task in its log, run count %d", soakSchedule, runs, s.RunCount)
	}
	l.fires = runs
}

// report prints the totals, to the test log and to stdout for `make soak`.
func (l *soakLedger) report(t *testing.T, events, tasks int) {
	line := fmt.Sprintf("soak: kills=%d schedules=%d children=%d (refused %d) scheduleReplays=%d "+
		"claimsWon=%d claimsLost=%d claimsRecovered=%d claimsNext=%d results=%d (refused %d) "+
		"cancels=%d (refused %d) messages=%d (refused %d) mailReplays=%d retries=%d retrying=%d attemptsFailed=%d keyed=%d fires=%d tasks=%d events=%d violations=%d",
		l.kills.Load(), l.schedules.Load(), l.children2.Load(), l.childrenRefused.Load(), l.scheduleReplays.Load(),
		l.claimsWon.Load(), l.claimsLost.Load(), l.claimsRecovered.Load(), l.claimsNext.Load(), l.results.Load(), l.resultsRefused.Load(),
		l.cancels.Load(), l.cancelsRefused.Load(), l.messages.Load(), l.mailRefused.Load(), l.mailReplays.Load(), l.retries.Load(),
		l.retrying.Load(), l.attemptsFailed.Load(), l.keyed.Load(), l.fires, tasks, events, l.violations)
	t.Log(line)
	fmt.Println(line)
}
