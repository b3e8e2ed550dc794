package replay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/replay"
)

// Roles a task plays in TestVerifyRealTraffic.
const (
	roleSucceed       = "succeed"
	roleDelayedCancel = "delayed-cancel" // delayed an hour, canceled while scheduled
	roleQueuedCancel  = "queued-cancel"  // canceled before anyone claims it
	roleDelayed       = "delayed"        // released after a short delay, then run
	roleMail          = "mail"           // mail before and during the run, read by a check
	roleFail          = "fail"           // reports a failure with effects
	roleCancelRunning = "cancel-running" // canceled while an executor runs it
	roleTimeout       = "timeout"        // claimed with timeoutSeconds 1 and abandoned
)

func role(i int) string {
	switch {
	case i == 5:
		return roleTimeout
	case i%20 == 0:
		return roleDelayedCancel
	case i%20 == 10:
		return roleQueuedCancel
	case i%10 == 1:
		return roleDelayed
	case i%10 == 2:
		return roleMail
	case i%10 == 3:
		return roleFail
	case i%10 == 4:
		return roleCancelRunning
	}
	return roleSucceed
}

func text(s string) events.Message {
	return events.Message{Content: []events.ContentPart{{Type: "text", Text: s}}}
}

// TestVerifyRealTraffic drives 300 tasks through a real node — roots and
// children, delayed releases, claims/next, results, cancels, mailbox
// messages and reads, a timeout, an admission rejection — and checks that
// the verifier finds the log it wrote clean.
func TestVerifyRealTraffic(t *testing.T) {
	t.Parallel()
	r := testnode.Start(t, func(c *node.Config) {
		c.Admission = scheduler.Admission{PerCustomer: map[string]scheduler.Quota{"limited": {MaxActiveRoots: 1}}}
	})
	svc, op, ctx := r.Service, scheduler.Operator, context.Background()
	const total, roots, queue = 300, 240, "verify"

	taskIDs := make([]string, total)
	index := map[string]int{}
	var mu sync.Mutex
	schedule := func(i int) error {
		req := scheduler.ScheduleRequest{CustomerID: fmt.Sprintf("c%d", i%3), Queue: queue, Message: text(fmt.Sprintf("task %d", i))}
		if i >= roots {
			req.ParentID = taskIDs[i-roots]
			req.CustomerID = fmt.Sprintf("c%d", (i-roots)%3)
		}
		switch role(i) {
		case roleDelayedCancel:
			d := 3600.0
			req.DelaySeconds = &d
		case roleDelayed:
			d := 0.3
			req.DelaySeconds = &d
		case roleTimeout:
			one := 1
			req.TimeoutSeconds = &one
		}
		st, created, err := svc.Schedule(ctx, op, req)
		if err != nil || !created {
			return fmt.Errorf("schedule %d: created %v, %v (task %s %s, %d events, last seq %d)", i, created, err, st.TaskID, st.Status, st.Version, st.LastSeq)
		}
		mu.Lock()
		taskIDs[i], index[st.TaskID] = st.TaskID, i
		mu.Unlock()
		return nil
	}
	// Roots first, then children under them (every parent still live).
	for _, span := range [][2]int{{0, roots}, {roots, total}} {
		var g errgroup.Group
		g.SetLimit(8)
		for i := span[0]; i < span[1]; i++ {
			g.Go(func() error { return schedule(i) })
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	// Admission: the second active root of "limited" is rejected.
	if _, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{CustomerID: "limited", Queue: "limited", Message: text("first")}); err != nil {
		t.Fatal(err)
	}
	var rejected *scheduler.AdmissionError
	if _, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{CustomerID: "limited", Queue: "limited", Message: text("second")}); !errors.As(err, &rejected) {
		t.Fatalf("second root of limited: got %v, want an admission rejection", err)
	}

	// Cancels before any claim, and mail to tasks not yet running.
	expectClaims := 0
	for i, id := range taskIDs {
		switch role(i) {
		case roleDelayedCancel, roleQueuedCancel:
			if _, err := svc.Cancel(ctx, op, id, "not needed"); err != nil {
				t.Fatalf("cancel %d: %v", i, err)
			}
			continue
		case roleMail:
			if _, _, err := svc.AppendMail(ctx, op, id, text("before the run")); err != nil {
				t.Fatalf("mail %d: %v", i, err)
			}
		}
		expectClaims++
	}

	// Executors: claims/next until no task waits, every claimable task
	// claimed once; a child whose parent ended first is canceled
	// (ancestor_terminal) by the claim that finds it instead.
	waiting := func() int {
		n := 0
		for _, st := range []aggregate.Status{aggregate.StatusScheduled, aggregate.StatusQueued} {
			n += len(r.Engine.List(projections.Filter{Status: st, Queue: queue}, "", total))
		}
		return n
	}
	var claimed atomic.Int64
	var timedOutID atomic.Value
	var g errgroup.Group
	deadline := time.Now().Add(60 * time.Second)
	for w := range 4 {
		g.Go(func() error {
			executor := fmt.Sprintf("exec-%d", w)
			for waiting() > 0 {
				if time.Now().After(deadline) {
					return fmt.Errorf("%d of at most %d claims, %d tasks waiting after 60s", claimed.Load(), expectClaims, waiting())
				}
				st, ok, err := svc.ClaimNext(ctx, op, queue, executor, 200*time.Millisecond)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				claimed.Add(1)
				mu.Lock()
				i := index[st.TaskID]
				mu.Unlock()
				d := st.Claim.DeliveryID
				switch role(i) {
				case roleTimeout:
					timedOutID.Store(st.TaskID)
					// What it did before it was abandoned stays on the task.
					if _, err := svc.ReportEffects(ctx, op, st.TaskID, d, []events.Effect{{Kind: "comment", Ref: "c-0"}}); err != nil && !errors.Is(err, aggregate.ErrTerminal) {
						return err
					}
					continue // abandoned: the alarm times it out
				case roleCancelRunning:
					_, err = svc.Cancel(ctx, op, st.TaskID, "changed my mind")
				case roleFail:
					if _, err = svc.ReportEffects(ctx, op, st.TaskID, d, []events.Effect{{Kind: "comment", Ref: "c-1"}, {Kind: "branch", Ref: "fix"}}); err != nil {
						return err
					}
					_, err = svc.RecordResult(ctx, op, st.TaskID, d, events.Result{
						Error: "tests failed", Effects: []events.Effect{{Kind: "comment", Ref: "c-1", Uncertain: true}},
					})
				case roleMail:
					if _, _, err = svc.AppendMail(ctx, op, st.TaskID, text("during the run")); err != nil {
						return err
					}
					var c scheduler.CheckResult
					if c, err = svc.Check(ctx, op, st.TaskID, d); err != nil {
						return err
					}
					// A child whose parent finished is told to stop; it
					// still gets its messages and reports.
					if c.ShouldStop && c.Reason != api.ReasonAncestorTerminal || len(c.Messages) != 2 {
						return fmt.Errorf("check %s: stop %v (%s), %d messages, want 2", st.TaskID, c.ShouldStop, c.Reason, len(c.Messages))
					}
					fallthrough
				default:
					_, err = svc.RecordResult(ctx, op, st.TaskID, d, events.Result{Success: true, Summary: "done " + st.TaskID,
						Effects: []events.Effect{{Kind: "pull_request", Ref: "#1", URL: "https://example.com/pr/1"}}})
				}
				if err != nil {
					return fmt.Errorf("task %d (%s): %w", i, role(i), err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	id, _ := timedOutID.Load().(string)
	if id == "" {
		t.Fatal("the timeout task was never claimed")
	}
	testnode.Eventually(t, "task with timeoutSeconds 1 timed out", func() bool {
		st, err := r.Store.Load(ctx, id)
		return err == nil && st.Status == aggregate.StatusTimedOut
	})
	r.Stop()

	js, err := jetstream.New(r.NC)
	if err != nil {
		t.Fatal(err)
	}
	msgs, last := streamState(t, js, r.NS.Stream)
	var progressed atomic.Uint64
	report, err := verifyLog(ctx, logOf(js, r.NS), func(seq, last uint64) { progressed.Store(seq) })
	if err != nil {
		t.Fatal(err)
	}
	if !report.Clean() {
		for _, v := range report.Violations {
			t.Errorf("violation: %+v", v)
		}
		t.FailNow()
	}
	if uint64(report.Events) != msgs || report.LastSeq != last || progressed.Load() != last {
		t.Fatalf("report covers %d events up to %d (progress %d); stream has %d up to %d", report.Events, report.LastSeq, progressed.Load(), msgs, last)
	}
	if report.Tasks != total+2 {
		t.Fatalf("report counts %d tasks, want %d", report.Tasks, total+2)
	}
	// The traffic really produced every kind of event the node writes
	// (delivery retries and exhaustion are too hard to provoke here).
	_, evs := readAll(t, js, r.NS.Stream)
	seen := map[events.Type]int{}
	for _, ev := range evs {
		seen[ev.Type()]++
	}
	for _, typ := range []events.Type{
		events.TypeTaskScheduled, events.TypeAdmissionRejected, events.TypeDeliveryPending, events.TypeReadyPublished,
		events.TypeClaimed, events.TypeTimedOut, events.TypeResultRecorded, events.TypeCanceled,
		events.TypeMailboxAppended, events.TypeMailboxRead,
	} {
		if seen[typ] == 0 {
			t.Errorf("traffic wrote no %s event (saw %v)", typ, seen)
		}
	}
}

// plantLog builds a log on a fresh stream: real tasks written through the
// store, and raw messages published straight to the stream around it.
type plantLog struct {
	t     *testing.T
	ns    testnats.Namespace
	store *store.Store
	js    jetstream.JetStream
	now   time.Time // the store's clock; tests move it
	mu    sync.Mutex
}

func newPlantLog(t *testing.T) *plantLog {
	t.Helper()
	p := &plantLog{t: t, ns: testnats.NewNamespace(t), now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	st, err := store.Open(context.Background(), testnats.Conn(t), store.Config{
		Stream: p.ns.Stream, Subjects: p.ns.Subjects, CacheSize: -1, Now: p.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p.store, p.js = st, st.JetStream()
	return p
}

func (p *plantLog) clock() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.now
}

func (p *plantLog) advance(d time.Duration) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.now = p.now.Add(d)
	return p.now
}

// exec runs cmd on task id through the store.
func (p *plantLog) exec(id string, cmd aggregate.Command) (aggregate.State, []events.Event) {
	p.t.Helper()
	p.advance(time.Millisecond)
	st, evs, err := p.store.Execute(context.Background(), id, "", cmd)
	if err != nil {
		p.t.Fatalf("%T on %s: %v", cmd, id, err)
	}
	return st, evs
}

// scheduled schedules a new root task of customer cust.
func (p *plantLog) scheduled(cust string) aggregate.State {
	id := events.NewID()
	st, _ := p.exec(id, aggregate.Schedule{TaskID: id, CustomerID: cust, Spec: events.TaskSpec{
		RootID: id, Queue: "q", TimeoutSeconds: 60, Message: text("planted"),
	}})
	return st
}

// queued schedules, releases and publishes a task.
func (p *plantLog) queued(cust string) aggregate.State {
	st := p.scheduled(cust)
	st, _ = p.exec(st.TaskID, aggregate.ReleaseDue{DeliveryID: events.NewID()})
	st, _ = p.exec(st.TaskID, aggregate.MarkReadyPublished{DeliveryID: st.Delivery.ID, ReadySeq: 1})
	return st
}

// running queues a task and claims it.
func (p *plantLog) running(cust string) aggregate.State {
	st := p.queued(cust)
	st, _ = p.exec(st.TaskID, aggregate.Claim{DeliveryID: st.Delivery.ID, ExecutorID: "exec-1"})
	return st
}

// retrying schedules a task of cust with retry policy r, and releases,
// publishes and claims it.
func (p *plantLog) retrying(cust string, r *events.RetryPolicy) aggregate.State {
	id := events.NewID()
	st, _ := p.exec(id, aggregate.Schedule{TaskID: id, CustomerID: cust, Spec: events.TaskSpec{
		RootID: id, Queue: "q", TimeoutSeconds: 60, Message: text("planted"), Retry: r,
	}})
	return p.claim(st)
}

// claim releases, publishes and claims a scheduled task that is due.
func (p *plantLog) claim(st aggregate.State) aggregate.State {
	st, _ = p.exec(st.TaskID, aggregate.ReleaseDue{DeliveryID: events.NewID()})
	st, _ = p.exec(st.TaskID, aggregate.MarkReadyPublished{DeliveryID: st.Delivery.ID, ReadySeq: 1})
	st, _ = p.exec(st.TaskID, aggregate.Claim{DeliveryID: st.Delivery.ID, ExecutorID: "exec-1"})
	return st
}

// encode builds the bytes of an event for task st with the given number,
// linked to st's last event.
func (p *plantLog) encode(st aggregate.State, number int, data events.Payload) []byte {
	p.t.Helper()
	b, err := events.Encode(events.Event{
		ID: events.NewID(), TaskID: st.TaskID, CustomerID: st.CustomerID, Number: number, At: p.advance(time.Millisecond), Actor: "planter",
		Prev: st.LastHash, Data: data,
	})
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

// plant publishes data on subject without any header and returns its
// stream sequence.
func (p *plantLog) plant(subject string, data []byte) uint64 {
	p.t.Helper()
	ack, err := p.js.Publish(context.Background(), subject, data)
	if err != nil {
		p.t.Fatal(err)
	}
	return ack.Sequence
}

func (p *plantLog) subject(st aggregate.State) string {
	return p.ns.Subjects.Event(st.CustomerID, st.TaskID)
}

// craft encodes an envelope the way the codec's wire does, with a
// version and type of the caller's choosing.
func craft(t *testing.T, typ string, version int, taskID, cust string, number int) []byte {
	t.Helper()
	data, err := msgpack.Marshal(map[string]any{"reason": "from the future"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := msgpack.Marshal(map[string]any{
		"id": events.NewID(), "t": typ, "v": version, "task": taskID, "cust": cust, "n": number,
		"at": time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), "actor": "future", "data": msgpack.RawMessage(data),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVerifyReportsEachViolation plants one violation of every kind next
// to clean tasks and checks that each is reported once, at its sequence
// and task, and that nothing is reported for the clean tasks.
func TestVerifyReportsEachViolation(t *testing.T) {
	t.Parallel()
	p := newPlantLog(t)

	// Clean tasks covering the transitions the planted ones do not.
	clean := p.running("acme")
	clean, _ = p.exec(clean.TaskID, aggregate.AppendMail{Message: events.Message{ID: "m1", Content: text("more").Content}})
	clean, _ = p.exec(clean.TaskID, aggregate.ReadMail{Cursor: 1})
	clean, _ = p.exec(clean.TaskID, aggregate.ReportEffects{DeliveryID: clean.Claim.DeliveryID, Effects: []events.Effect{{Kind: "comment", Ref: "c-1"}}})
	clean, _ = p.exec(clean.TaskID, aggregate.SaveRun{DeliveryID: clean.Claim.DeliveryID, Revision: 1, Digest: strings.Repeat("0a", 32), Size: 2})
	p.exec(clean.TaskID, aggregate.RecordResult{DeliveryID: clean.Claim.DeliveryID, Result: events.Result{Success: true, Summary: "ok"}})
	retried := p.scheduled("acme")
	retried, _ = p.exec(retried.TaskID, aggregate.ReleaseDue{DeliveryID: events.NewID()})
	retried, _ = p.exec(retried.TaskID, aggregate.RetryDelivery{DeliveryID: retried.Delivery.ID, NextAt: p.clock().Add(time.Second), Error: "nats: timeout"})
	p.exec(retried.TaskID, aggregate.ExhaustDelivery{DeliveryID: retried.Delivery.ID, Reason: "gave up"})
	releasedID := events.NewID() // released in its TaskScheduled, then published and claimed
	released, _ := p.exec(releasedID, aggregate.Schedule{TaskID: releasedID, CustomerID: "acme", Spec: events.TaskSpec{RootID: releasedID, Queue: "q", TimeoutSeconds: 60},
		DeliveryID: events.NewID(), NextAt: p.clock().Add(time.Second)})
	released, _ = p.exec(releasedID, aggregate.MarkReadyPublished{DeliveryID: released.Delivery.ID, ReadySeq: 3})
	p.exec(releasedID, aggregate.Claim{DeliveryID: released.Delivery.ID, ExecutorID: "exec-1"})
	republished := p.queued("acme")
	p.exec(republished.TaskID, aggregate.RepublishReady{DeliveryID: republished.Delivery.ID, LostSeq: 1, ReadySeq: 12})
	rejectedID := events.NewID()
	p.exec(rejectedID, aggregate.Reject{TaskID: rejectedID, CustomerID: "acme", Spec: events.TaskSpec{RootID: rejectedID, Queue: "q", TimeoutSeconds: 60}, Reason: "quota"})
	readLate := p.scheduled("beta")
	p.exec(readLate.TaskID, aggregate.AppendMail{Message: events.Message{ID: "m1", Content: text("late").Content}})
	p.exec(readLate.TaskID, aggregate.Cancel{Reason: "stop"})
	p.exec(readLate.TaskID, aggregate.ReadMail{Cursor: 1}) // a check after the cancel still reads
	expired := p.running("beta")
	p.advance(2 * time.Minute)
	p.exec(expired.TaskID, aggregate.TimeOut{})
	// Three attempts: a failure retried, a timeout retried, a success.
	again := p.retrying("beta", &events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: 1, MaxBackoffSeconds: 5, On: []string{"failed", "timed_out"}})
	again, _ = p.exec(again.TaskID, aggregate.RecordResult{DeliveryID: again.Claim.DeliveryID, Result: events.Result{Error: "flaky", Effects: []events.Effect{{Kind: "comment"}}}})
	p.advance(time.Second)
	again = p.claim(again)
	p.advance(2 * time.Minute)
	again, _ = p.exec(again.TaskID, aggregate.TimeOut{})
	p.advance(2 * time.Second)
	again = p.claim(again)
	p.exec(again.TaskID, aggregate.RecordResult{DeliveryID: again.Claim.DeliveryID, Result: events.Result{Success: true}})
	child := p.scheduled("beta")
	childID := events.NewID()
	p.exec(childID, aggregate.Schedule{TaskID: childID, CustomerID: "beta", Spec: events.TaskSpec{RootID: child.TaskID, ParentID: child.TaskID, Queue: "q", TimeoutSeconds: 60}})

	// A clean retry, with labels, of a finished task.
	finished := p.scheduled("beta")
	finished, _ = p.exec(finished.TaskID, aggregate.Cancel{Reason: "retry me"})
	retrySpec, err := aggregate.RetrySpec(finished)
	if err != nil {
		t.Fatal(err)
	}
	retryID := events.NewID()
	retrySpec.RootID, retrySpec.Labels = retryID, map[string]string{"repo": "example/storefront"}
	p.exec(retryID, aggregate.Schedule{TaskID: retryID, CustomerID: "beta", Spec: retrySpec})

	var want []replay.Violation
	expect := func(seq uint64, taskID, kind string) {
		want = append(want, replay.Violation{Seq: events.Position(seq), TaskID: taskID, Kind: kind})
	}

	// (a) Garbage bytes on a real task's subject.
	a := p.scheduled("acme")
	expect(p.plant(p.subject(a), []byte("\xc1 definitely not an event")), a.TaskID, replay.Undecodable)
	// (b) Well-formed envelopes of an unknown version and an unknown type.
	b := p.scheduled("acme")
	expect(p.plant(p.subject(b), craft(t, "Canceled", 3, b.TaskID, b.CustomerID, b.Version+1)), b.TaskID, replay.Undecodable)
	expect(p.plant(p.subject(b), craft(t, "TaskArchived", 1, b.TaskID, b.CustomerID, b.Version+1)), b.TaskID, replay.Undecodable)
	// (c) A second Claimed with the token already consumed.
	c := p.running("acme")
	expect(p.plant(p.subject(c), p.encode(c, c.Version+1, events.Claimed{DeliveryID: c.Claim.DeliveryID, ExecutorID: "exec-2", Deadline: c.Deadline})), c.TaskID, replay.TokenReused)
	// (d) A Claimed with a token that is not the queued task's.
	d := p.queued("acme")
	expect(p.plant(p.subject(d), p.encode(d, d.Version+1, events.Claimed{DeliveryID: "not-the-token", ExecutorID: "exec-2", Deadline: p.clock().Add(time.Minute)})), d.TaskID, replay.StaleClaim)
	// (e) A lifecycle event after the result.
	e := p.running("acme")
	e, _ = p.exec(e.TaskID, aggregate.RecordResult{DeliveryID: e.Claim.DeliveryID, Result: events.Result{Success: true}})
	expect(p.plant(p.subject(e), p.encode(e, e.Version+1, events.Canceled{Reason: "too late"})), e.TaskID, replay.AfterTerminal)
	// (f) A skipped event number, reported once: the next event follows
	// the one that skipped.
	f := p.scheduled("acme")
	skipped := p.encode(f, f.Version+2, events.MailboxAppended{Index: 1, Message: events.Message{ID: "g1", CreatedAt: p.clock(), Content: text("gap").Content}})
	expect(p.plant(p.subject(f), skipped), f.TaskID, replay.Gap)
	f.LastHash = events.HashOf(skipped)
	p.plant(p.subject(f), p.encode(f, f.Version+3, events.MailboxAppended{Index: 2, Message: events.Message{ID: "g2", CreatedAt: p.clock(), Content: text("gap").Content}}))
	// (g) ReadyPublished for a task that is already running.
	g := p.running("beta")
	expect(p.plant(p.subject(g), p.encode(g, g.Version+1, events.ReadyPublished{DeliveryID: g.Claim.DeliveryID})), g.TaskID, replay.IllegalEvent)
	// (g2) ReadyRepublished for a task that is still scheduled.
	g2 := p.scheduled("beta")
	g2, _ = p.exec(g2.TaskID, aggregate.ReleaseDue{DeliveryID: events.NewID()})
	expect(p.plant(p.subject(g2), p.encode(g2, g2.Version+1, events.ReadyRepublished{DeliveryID: g2.Delivery.ID, ReadySeq: 4})), g2.TaskID, replay.IllegalEvent)
	// (g3) EffectsReported under a token that is not the claim's.
	g3 := p.running("beta")
	expect(p.plant(p.subject(g3), p.encode(g3, g3.Version+1, events.EffectsReported{DeliveryID: "not-the-token", Effects: []events.Effect{{Kind: "comment", At: p.clock()}}})), g3.TaskID, replay.IllegalEvent)
	// (g4) RunSaved skipping a revision, and under another token.
	g4 := p.running("beta")
	g4, _ = p.exec(g4.TaskID, aggregate.SaveRun{DeliveryID: g4.Claim.DeliveryID, Revision: 1, Digest: strings.Repeat("0b", 32), Size: 2})
	expect(p.plant(p.subject(g4), p.encode(g4, g4.Version+1, events.RunSaved{DeliveryID: g4.Claim.DeliveryID, Revision: 3, Digest: strings.Repeat("0c", 32), Size: 2})), g4.TaskID, replay.IllegalEvent)
	g5 := p.running("beta")
	expect(p.plant(p.subject(g5), p.encode(g5, g5.Version+1, events.RunSaved{DeliveryID: "not-the-token", Revision: 1, Digest: strings.Repeat("0c", 32), Size: 2})), g5.TaskID, replay.IllegalEvent)
	// (h) A valid event of one task stored on another task's subject.
	h, other := p.scheduled("beta"), p.scheduled("beta")
	expect(p.plant(p.subject(other), p.encode(h, h.Version+1, events.Canceled{Reason: "misfiled"})), h.TaskID, replay.WrongSubject)
	// (i) A TimedOut before the running deadline.
	i := p.running("beta")
	expect(p.plant(p.subject(i), p.encode(i, i.Version+1, events.TimedOut{Deadline: i.Deadline})), i.TaskID, replay.IllegalEvent)
	// (i2) Retries the policy does not allow: a RetryScheduled due before
	// its backoff, a failure recorded as final with attempts left, and a
	// retry past maxAttempts.
	policy := &events.RetryPolicy{MaxAttempts: 2, BackoffSeconds: 10, MaxBackoffSeconds: 60, On: []string{"failed"}}
	soon := p.retrying("beta", policy)
	expect(p.plant(p.subject(soon), p.encode(soon, soon.Version+1, events.RetryScheduled{
		Attempt: 2, NextAt: p.clock(), Cause: "failed", DeliveryID: soon.Claim.DeliveryID, Result: &events.Result{Error: "x"},
	})), soon.TaskID, replay.IllegalEvent)
	final := p.retrying("beta", policy)
	expect(p.plant(p.subject(final), p.encode(final, final.Version+1, events.ResultRecorded{DeliveryID: final.Claim.DeliveryID, Result: events.Result{Error: "x"}})), final.TaskID, replay.IllegalEvent)
	past := p.retrying("beta", policy)
	past, _ = p.exec(past.TaskID, aggregate.RecordResult{DeliveryID: past.Claim.DeliveryID, Result: events.Result{Error: "x"}})
	p.advance(10 * time.Second)
	past = p.claim(past)
	expect(p.plant(p.subject(past), p.encode(past, past.Version+1, events.RetryScheduled{
		Attempt: 3, NextAt: p.clock().Add(time.Hour), Cause: "timed_out", Deadline: past.Deadline,
	})), past.TaskID, replay.IllegalEvent)
	// (i3) A ClaimLost for a heartbeat that was not yet due, after a
	// release the verifier accepts.
	lost := p.queued("beta")
	lost, _ = p.exec(lost.TaskID, aggregate.Claim{DeliveryID: lost.Delivery.ID, ExecutorID: "exec-1", HeartbeatSeconds: 30})
	lost, _ = p.exec(lost.TaskID, aggregate.LoseClaim{DeliveryID: lost.Claim.DeliveryID, Reason: events.ClaimLostReleased, Note: "shutdown"})
	lost = p.claim(lost)
	expect(p.plant(p.subject(lost), p.encode(lost, lost.Version+1, events.ClaimLost{
		DeliveryID: lost.Claim.DeliveryID, ExecutorID: "exec-1", Reason: events.ClaimLostHeartbeat, Attempt: 3,
	})), lost.TaskID, replay.IllegalEvent)
	// (j) An event id used before.
	jID := events.NewID()
	j, jEvs := p.exec(jID, aggregate.Schedule{TaskID: jID, CustomerID: "beta", Spec: events.TaskSpec{RootID: jID, Queue: "q", TimeoutSeconds: 60}})
	dup, err := events.Encode(events.Event{ID: jEvs[0].ID, TaskID: j.TaskID, CustomerID: j.CustomerID, Number: 2, At: p.advance(time.Millisecond), Prev: j.LastHash, Data: events.Canceled{Reason: "same id"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(p.plant(p.subject(j), dup), j.TaskID, replay.DuplicateEvent)
	// (k) Events of tasks that were never scheduled.
	ghost := aggregate.State{TaskID: events.NewID(), CustomerID: "beta"}
	expect(p.plant(p.subject(ghost), p.encode(ghost, 1, events.Canceled{Reason: "who?"})), ghost.TaskID, replay.NoCreation)
	reader := aggregate.State{TaskID: events.NewID(), CustomerID: "beta"}
	expect(p.plant(p.subject(reader), p.encode(reader, 1, events.MailboxRead{Cursor: 1})), reader.TaskID, replay.NoCreation)
	// (l) An event whose prev is not its predecessor's hash.
	l := p.scheduled("beta")
	l.LastHash = events.HashOf([]byte("some other event"))
	expect(p.plant(p.subject(l), p.encode(l, l.Version+1, events.Canceled{Reason: "relinked"})), l.TaskID, replay.BrokenLink)
	// (m) A TaskScheduled that releases a task whose runAt is still ahead.
	m := aggregate.State{TaskID: events.NewID(), CustomerID: "beta"}
	early := events.TaskScheduled{Spec: events.TaskSpec{RootID: m.TaskID, Queue: "q", TimeoutSeconds: 60, RunAt: p.clock().Add(time.Hour)},
		DeliveryID: events.NewID(), NextAt: p.clock()}
	expect(p.plant(p.subject(m), p.encode(m, 1, early)), m.TaskID, replay.IllegalEvent)
	// (n) Retries of a live task, of another customer's task and of a
	// task the log does not hold; (a clean retry is above).
	retry := func(of aggregate.State, cust string) uint64 {
		spec := of.Spec
		spec.ParentID, spec.RequestID, spec.RelatedTaskID, spec.RetryOf = "", "", of.TaskID, of.TaskID
		id := events.NewID()
		spec.RootID = id
		st, _ := p.exec(id, aggregate.Schedule{TaskID: id, CustomerID: cust, Spec: spec})
		expect(uint64(st.LastSeq), id, replay.BadRetry)
		return uint64(st.LastSeq)
	}
	retry(p.scheduled("beta"), "beta")
	retry(expired, "acme")
	retry(aggregate.State{TaskID: events.NewID(), Spec: events.TaskSpec{Queue: "q", TimeoutSeconds: 60}}, "beta")
	// A v1 event (no prev) is accepted as the start of a chain, and a v2
	// event after it links to its bytes: nothing to report.
	old := p.scheduled("beta")
	v1, err := msgpack.Marshal(map[string]any{
		"id": events.NewID(), "t": "MailboxAppended", "v": 1, "task": old.TaskID, "cust": old.CustomerID, "n": old.Version + 1, "at": p.advance(time.Millisecond),
		"data": map[string]any{"index": 1, "message": map[string]any{"id": "v1-mail", "createdAt": p.clock(), "content": []map[string]any{{"type": "text", "text": "v1"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.plant(p.subject(old), v1)
	old.LastHash = events.HashOf(v1)
	p.plant(p.subject(old), p.encode(old, old.Version+2, events.Canceled{Reason: "after a v1 event"}))

	msgs, last := streamState(t, p.js, p.ns.Stream)
	report, err := verifyLog(context.Background(), logOf(p.js, p.ns), nil)
	if err != nil {
		t.Fatal(err)
	}
	if report.Clean() {
		t.Fatal("a log with planted violations verified clean")
	}
	if uint64(report.Events) != msgs || report.LastSeq != last {
		t.Fatalf("report covers %d events up to %d; stream has %d up to %d", report.Events, report.LastSeq, msgs, last)
	}
	got := make([]replay.Violation, len(report.Violations))
	for n, v := range report.Violations {
		if v.Detail == "" {
			t.Errorf("violation without detail: %+v", v)
		}
		got[n] = replay.Violation{Seq: v.Seq, TaskID: v.TaskID, Kind: v.Kind}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("violations:\n got %+v\nwant %+v\nfull report: %+v", got, want, report.Violations)
	}
	details := map[events.Position]string{}
	for _, v := range report.Violations {
		details[v.Seq] = v.Detail
	}
	for n, sub := range []string{"", "unknown schema version", "unknown event type"} {
		if !strings.Contains(details[want[n].Seq], sub) {
			t.Errorf("undecodable seq %d: detail %q does not mention %q", want[n].Seq, details[want[n].Seq], sub)
		}
	}
}

// TestVerifyChecksTheLogsEnd feeds a verifier messages directly: a skipped
// sequence is missing, and a saved chain head beyond the end, or at a
// message that is not the saved one, is reported.
func TestVerifyChecksTheLogsEnd(t *testing.T) {
	t.Parallel()
	subjects := events.DefaultSubjects
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var msgs [][]byte
	var prev events.Hash
	for n, p := range []events.Payload{
		events.TaskScheduled{Spec: events.TaskSpec{RootID: "t1", Queue: "q", TimeoutSeconds: 60, RunAt: at, Message: events.Message{CreatedAt: at}}},
		events.MailboxAppended{Index: 1, Message: events.Message{ID: "m1", CreatedAt: at, Content: text("one").Content}},
		events.MailboxAppended{Index: 2, Message: events.Message{ID: "m2", CreatedAt: at, Content: text("two").Content}},
	} {
		b, err := events.Encode(events.Event{ID: events.NewID(), TaskID: "t1", CustomerID: "c1", Number: n + 1, At: at, Prev: prev, Data: p})
		if err != nil {
			t.Fatal(err)
		}
		msgs, prev = append(msgs, b), events.HashOf(b)
	}
	verify := func(seqs []uint64, head eventlog.Head) []string {
		v := replay.NewVerifier(subjects)
		v.ExpectHead(head.Pos, head.Hash)
		for _, seq := range seqs {
			v.Add(events.Position(seq), subjects.Event("c1", "t1"), msgs[seq-1])
		}
		var kinds []string
		for _, viol := range v.Report().Violations {
			kinds = append(kinds, viol.Kind)
		}
		return kinds
	}
	tail := eventlog.Head{Pos: 3, Hash: events.HashOf(msgs[2])}
	for _, tt := range []struct {
		name string
		seqs []uint64
		head eventlog.Head
		want []string
	}{
		{"Clean", []uint64{1, 2, 3}, tail, nil},
		{"NoHead", []uint64{1, 2, 3}, eventlog.Head{}, nil},
		{"DeletedEvent", []uint64{1, 3}, tail, []string{replay.Missing, replay.Gap, replay.BrokenLink, replay.IllegalEvent}},
		{"CutTail", []uint64{1, 2}, tail, []string{replay.Truncated}},
		{"OtherHead", []uint64{1, 2, 3}, eventlog.Head{Pos: 3, Hash: events.HashOf(msgs[1])}, []string{replay.HeadMismatch}},
		{"HeadDeleted", []uint64{1, 2, 4}, eventlog.Head{Pos: 3, Hash: events.HashOf(msgs[2])}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.name == "HeadDeleted" {
				// Sequence 4 carries the third event: 3 is missing, and so
				// is the message of the head saved there.
				v := replay.NewVerifier(subjects)
				v.ExpectHead(tt.head.Pos, tt.head.Hash)
				for i, seq := range tt.seqs {
					v.Add(events.Position(seq), subjects.Event("c1", "t1"), msgs[i])
				}
				var kinds []string
				for _, viol := range v.Report().Violations {
					kinds = append(kinds, viol.Kind)
				}
				if want := []string{replay.Missing, replay.HeadMismatch}; !slices.Equal(kinds, want) {
					t.Fatalf("violations %v, want %v", kinds, want)
				}
				return
			}
			if got := verify(tt.seqs, tt.head); !slices.Equal(got, tt.want) {
				t.Fatalf("violations %v, want %v", got, tt.want)
			}
		})
	}
}
