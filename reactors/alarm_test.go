package reactors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/delivery"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testlog"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/reactors"
)

// Helpers of the alarm tests start with "al" so the package's other test
// files may define their own.

// alProc is one scheduler process as far as the alarm is concerned: its
// own connection, store, projection engine and alarm on a shared stream.
type alProc struct {
	t      *testing.T
	ns     testnats.Namespace
	store  *store.Store
	engine *projections.Engine
	ready  delivery.Publisher
}

// alStart opens a store on ns (with the changes opts make to its
// configuration) and runs a projection engine on it until the test ends.
// The alarm is started separately (startAlarm).
func alStart(t *testing.T, ns testnats.Namespace, opts ...func(*store.Config)) *alProc {
	t.Helper()
	ctx := context.Background()
	cfg := store.Config{Stream: ns.Stream, Subjects: ns.Subjects}
	for _, o := range opts {
		o(&cfg)
	}
	st, err := store.Open(ctx, testnats.Conn(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ready, err := delivery.EnsureStream(ctx, st.JetStream(), ns.ReadyStream, ns.Subjects, 1)
	if err != nil {
		t.Fatal(err)
	}
	eng := mustEngine(projections.Config{Log: eventlog.Log{JS: st.JetStream(), Stream: ns.Stream, Subjects: ns.Subjects}, Logger: alLogger(t)})
	alGo(t, "engine", eng.Run)
	alEventually(t, "engine caught up", eng.CaughtUp)
	return &alProc{t: t, ns: ns, store: st, engine: eng, ready: delivery.Publisher{JS: st.JetStream(), Subjects: ns.Subjects, Stream: ready}}
}

// startAlarm runs an alarm with cfg and pub (the real publisher if nil)
// until the test ends; it stops before the engine it reads.
func (p *alProc) startAlarm(cfg reactors.AlarmConfig, pub reactors.Publisher) {
	p.t.Helper()
	if pub == nil {
		pub = p.ready
	}
	cfg.Logger = alLogger(p.t)
	cfg.Store, cfg.Projection, cfg.Publisher = p.store, p.engine, pub
	alarm, err := reactors.NewAlarm(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	alGo(p.t, "alarm", alarm.Run)
}

// alGo runs fn until the test ends and checks it stopped only then.
func alGo(t *testing.T, what string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s stopped with %v", what, err)
		}
	})
}

func alLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)
}

// alEventually polls cond until it holds (testnode.Eventually).
var alEventually = testnode.Eventually

// alSpec describes a task to schedule through the store.
type alSpec struct {
	customer string
	parent   *aggregate.State
	runAt    time.Time // zero: now
	timeout  int       // seconds; zero: 60
	labels   map[string]string
}

func (p *alProc) schedule(s alSpec) aggregate.State {
	p.t.Helper()
	id := events.NewID()
	if s.customer == "" {
		s.customer = "cust"
	}
	if s.timeout == 0 {
		s.timeout = 60
	}
	spec := events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: s.timeout, RunAt: s.runAt, Labels: s.labels}
	if s.parent != nil {
		spec.ParentID, spec.RootID = s.parent.TaskID, s.parent.Spec.RootID
	}
	st, _, err := p.store.Execute(context.Background(), id, "", aggregate.Schedule{TaskID: id, CustomerID: s.customer, Spec: spec})
	if err != nil {
		p.t.Fatalf("schedule: %v", err)
	}
	return st
}

func (p *alProc) exec(id string, cmd aggregate.Command) aggregate.State {
	p.t.Helper()
	st, _, err := p.store.Execute(context.Background(), id, "w1", cmd)
	if err != nil {
		p.t.Fatalf("%T on %s: %v", cmd, id, err)
	}
	return st
}

func (p *alProc) status(id string) aggregate.Status {
	s, _ := p.engine.Task(id)
	return s.Status
}

func (p *alProc) waitStatus(id string, want aggregate.Status) {
	p.t.Helper()
	alEventually(p.t, fmt.Sprintf("task %s %s", id, want), func() bool { return p.status(id) == want })
}

func (p *alProc) history(id string) []events.Event {
	p.t.Helper()
	h, err := p.store.History(context.Background(), id)
	if err != nil {
		p.t.Fatal(err)
	}
	return h
}

func alTypes(h []events.Event) []events.Type {
	out := make([]events.Type, len(h))
	for i, ev := range h {
		out[i] = ev.Type()
	}
	return out
}

func alCount(h []events.Event, typ events.Type) int {
	n := 0
	for _, ev := range h {
		if ev.Type() == typ {
			n++
		}
	}
	return n
}

// alSettled: the engine applied the whole log and nothing is due on the
// release, delivery or report timers.
func (p *alProc) settled() bool {
	info, err := p.store.Stream().Info(context.Background())
	if err != nil {
		p.t.Fatal(err)
	}
	if p.engine.Applied() != info.State.LastSeq {
		return false
	}
	for _, tm := range []projections.Timer{projections.Release, projections.Deliver, projections.Report} {
		if len(p.engine.Due(tm, time.Now(), 1, nil)) > 0 {
			return false
		}
	}
	return true
}

// flaky fails the first failures publishes of every task, then hands the
// rest to next (if next is nil it fails forever).
type flaky struct {
	failures int
	next     reactors.Publisher // nil: every publish fails

	mu    sync.Mutex
	calls map[string]int
}

var errPublish = errors.New("ready stream unavailable")

func (f *flaky) PublishReady(ctx context.Context, s aggregate.State, msgID string) (uint64, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[s.TaskID]++
	n := f.calls[s.TaskID]
	f.mu.Unlock()
	if n <= f.failures || f.next == nil {
		return 0, errPublish
	}
	return f.next.PublishReady(ctx, s, msgID)
}

func (f *flaky) ReadyStored(ctx context.Context, s aggregate.State) (bool, error) {
	if f.next == nil {
		return false, errPublish
	}
	return f.next.ReadyStored(ctx, s)
}

func (f *flaky) callsFor(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func TestAlarmDelivery(t *testing.T) {
	t.Parallel()

	t.Run("RetriesThenPublishes", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		pub := &flaky{failures: 2, next: p.ready}
		p.startAlarm(reactors.AlarmConfig{RetryBase: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond}, pub)
		// The publish that succeeds works from the projection's state,
		// which must still carry the labels.
		task := p.schedule(alSpec{labels: map[string]string{"repo": "example/storefront"}})
		p.waitStatus(task.TaskID, aggregate.StatusQueued)

		h := p.history(task.TaskID)
		want := []events.Type{events.TypeTaskScheduled, events.TypeDeliveryPending, events.TypeDeliveryRetryScheduled,
			events.TypeDeliveryRetryScheduled, events.TypeReadyPublished}
		if got := alTypes(h); !slices.Equal(got, want) {
			t.Fatalf("history = %v, want %v", got, want)
		}
		pending := h[1].Data.(events.DeliveryPending)
		if pending.Attempt != 1 || pending.DeliveryID == "" {
			t.Fatalf("DeliveryPending = %+v", pending)
		}
		for i, ev := range h[2:4] {
			r := ev.Data.(events.DeliveryRetryScheduled)
			if r.DeliveryID != pending.DeliveryID || r.Attempt != i+2 || r.Error != errPublish.Error() {
				t.Fatalf("retry %d = %+v, want delivery %s attempt %d", i, r, pending.DeliveryID, i+2)
			}
			// Decided after the event before it was written: due no earlier.
			// (Its own At is stamped at the append, which on a loaded
			// machine can come well after the decision.)
			if prev := h[1+i].At; r.NextAt.Before(prev) {
				t.Fatalf("retry %d due at %v, before the event it follows (%v)", i, r.NextAt, prev)
			}
		}
		if got := h[4].Data.(events.ReadyPublished).DeliveryID; got != pending.DeliveryID {
			t.Fatalf("ReadyPublished for %s, want %s", got, pending.DeliveryID)
		}
		if n := pub.callsFor(task.TaskID); n != 3 {
			t.Fatalf("publisher called %d times, want 3", n)
		}

		// The notification on the ready stream carries the same token.
		rs, err := p.store.JetStream().Stream(context.Background(), p.ns.ReadyStream)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := rs.GetLastMsgForSubject(context.Background(), p.ns.Subjects.Ready("q"))
		if err != nil {
			t.Fatal(err)
		}
		if ct := msg.Header.Get(events.ContentTypeHeader); ct != events.ContentTypeMsgpack {
			t.Fatalf("notification published as %q, want %s", ct, events.ContentTypeMsgpack)
		}
		n, err := events.UnmarshalReady(msg.Data, msg.Header.Get(events.ContentTypeHeader))
		if err != nil {
			t.Fatal(err)
		}
		if n.TaskID != task.TaskID || n.DeliveryID != pending.DeliveryID || n.CustomerID != "cust" || n.Queue != "q" ||
			n.Labels["repo"] != "example/storefront" || len(n.Labels) != 1 {
			t.Fatalf("notification = %+v", n)
		}
	})

	t.Run("Exhausted", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		pub := &flaky{failures: 1 << 30}
		p.startAlarm(reactors.AlarmConfig{MaxDeliveryAttempts: 3, RetryBase: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond}, pub)
		task := p.schedule(alSpec{})
		p.waitStatus(task.TaskID, aggregate.StatusFailed)

		st, err := p.store.Load(context.Background(), task.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status != aggregate.StatusFailed || !strings.Contains(st.Reason, errPublish.Error()) {
			t.Fatalf("exhausted task: status %s reason %q", st.Status, st.Reason)
		}
		h := p.history(task.TaskID)
		want := []events.Type{events.TypeTaskScheduled, events.TypeDeliveryPending, events.TypeDeliveryRetryScheduled,
			events.TypeDeliveryRetryScheduled, events.TypeDeliveryExhausted}
		if got := alTypes(h); !slices.Equal(got, want) {
			t.Fatalf("history = %v, want %v", got, want)
		}
		if ex := h[4].Data.(events.DeliveryExhausted); ex.Attempts != 3 || ex.DeliveryID != st.Delivery.ID {
			t.Fatalf("DeliveryExhausted = %+v", ex)
		}
		if n := pub.callsFor(task.TaskID); n != 3 {
			t.Fatalf("publisher called %d times, want 3", n)
		}
		alEventually(t, "nothing left to deliver", p.settled)
		if n := p.engine.TimerLen(projections.Deliver); n != 0 {
			t.Fatalf("Deliver queue holds %d after exhaustion", n)
		}
	})
}

func TestAlarmTimers(t *testing.T) {
	t.Parallel()

	t.Run("DelayedRelease", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		var mu sync.Mutex
		var late []time.Duration
		// The Deliver queue waits an hour: only the release's own
		// publish can queue the task.
		p.startAlarm(reactors.AlarmConfig{ReadyGrace: time.Hour, Observe: func(tm projections.Timer, d time.Duration, err error) {
			if tm == projections.Release && err == nil {
				mu.Lock()
				late = append(late, d)
				mu.Unlock()
			}
		}}, nil)
		runAt := time.Now().Add(300 * time.Millisecond)
		task := p.schedule(alSpec{runAt: runAt})
		st, err := p.store.Load(context.Background(), task.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		// Only meaningful if the load answered before runAt; a stalled
		// machine skips the check rather than flake.
		if time.Now().Before(runAt) && (st.Status != aggregate.StatusScheduled || st.Delivery.ID != "") {
			t.Fatalf("released before runAt: %s delivery %q", st.Status, st.Delivery.ID)
		}
		p.waitStatus(task.TaskID, aggregate.StatusQueued)
		h := p.history(task.TaskID)
		if got := alTypes(h); !slices.Equal(got, []events.Type{events.TypeTaskScheduled, events.TypeDeliveryPending, events.TypeReadyPublished}) {
			t.Fatalf("history = %v", got)
		}
		if due := h[0].Data.(events.TaskScheduled).Spec.RunAt; h[1].At.Before(due) {
			t.Fatalf("released at %v, before runAt %v", h[1].At, due)
		}
		if next := h[1].Data.(events.DeliveryPending).NextAt; next.Sub(h[1].At) < 59*time.Minute {
			t.Fatalf("delivery due %v after the release, want the grace (1h)", next.Sub(h[1].At))
		}
		mu.Lock()
		t.Logf("release lateness: %v", late)
		mu.Unlock()
	})

	t.Run("RunningDeadline", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		p.startAlarm(reactors.AlarmConfig{}, nil)
		task := p.schedule(alSpec{timeout: 1})
		p.waitStatus(task.TaskID, aggregate.StatusQueued)
		s, _ := p.engine.Task(task.TaskID)
		claimed := p.exec(task.TaskID, aggregate.Claim{DeliveryID: s.Delivery.ID, ExecutorID: "w1"})
		p.waitStatus(task.TaskID, aggregate.StatusTimedOut)
		h := p.history(task.TaskID)
		last := h[len(h)-1]
		to, ok := last.Data.(events.TimedOut)
		if !ok || !to.Deadline.Equal(claimed.Deadline) || last.At.Before(claimed.Deadline) {
			t.Fatalf("last event %s %+v at %v, want TimedOut for deadline %v", last.Type(), last.Data, last.At, claimed.Deadline)
		}
		if n := alCount(h, events.TypeTimedOut); n != 1 {
			t.Fatalf("%d TimedOut events", n)
		}
		alEventually(t, "expire queue empty", func() bool { return p.engine.TimerLen(projections.Expire) == 0 })
	})
}

func TestAlarmTwoProcesses(t *testing.T) {
	t.Parallel()
	ns := testnats.NewNamespace(t)
	a, b := alStart(t, ns), alStart(t, ns)
	var stale atomic.Int64
	observe := func(_ projections.Timer, _ time.Duration, err error) {
		if errors.Is(err, aggregate.ErrStale) {
			stale.Add(1)
		}
	}
	a.startAlarm(reactors.AlarmConfig{Observe: observe}, nil)
	b.startAlarm(reactors.AlarmConfig{Observe: observe}, nil)

	var tasks []string
	for i := range 100 {
		p := a
		if i%2 == 1 {
			p = b
		}
		tasks = append(tasks, p.schedule(alSpec{customer: fmt.Sprintf("c%d", i%4)}).TaskID)
	}
	for _, id := range tasks {
		a.waitStatus(id, aggregate.StatusQueued)
		b.waitStatus(id, aggregate.StatusQueued)
	}
	for _, id := range tasks {
		h := a.history(id)
		if n := alCount(h, events.TypeDeliveryPending); n != 1 {
			t.Errorf("task %s: %d DeliveryPending (%v)", id, n, alTypes(h))
		}
		if n := alCount(h, events.TypeReadyPublished); n > 1 {
			t.Errorf("task %s: %d ReadyPublished (%v)", id, n, alTypes(h))
		}
	}
	// Both alarms may publish a notification; the ready stream dedupes on
	// the delivery id.
	rs, err := a.store.JetStream().Stream(context.Background(), ns.ReadyStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := rs.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 100 {
		t.Errorf("ready stream holds %d notifications, want 100", info.State.Msgs)
	}
	t.Logf("duplicate actions answered stale: %d", stale.Load())
}

func TestAlarmFairness(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	const backlog = 2000
	var g errgroup.Group
	g.SetLimit(16)
	for range backlog {
		g.Go(func() error {
			id := events.NewID()
			_, _, err := p.store.Execute(context.Background(), id, "", aggregate.Schedule{TaskID: id, CustomerID: "A",
				Spec: events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 60}})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	bTask := p.schedule(alSpec{customer: "B"})
	// The backlog is in place before the alarm starts, as after a restart
	// or a burst: B's task is the last one due.
	alEventually(t, "backlog projected", func() bool { return p.engine.Applied() >= uint64(bTask.LastSeq) })
	p.startAlarm(reactors.AlarmConfig{}, nil)
	alEventually(t, "everything published", func() bool {
		return p.engine.QueueCounts()["q"][aggregate.StatusQueued] == backlog+1
	})

	// One pass over the log: the sequence of every ReadyPublished.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	last := p.engine.Applied()
	cons, err := p.store.JetStream().OrderedConsumer(ctx, p.ns.Stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	var aSeqs []uint64
	var bSeq uint64
	for seq := uint64(0); seq < last; {
		msg, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seq = meta.Sequence.Stream
		ev, err := events.Decode(msg.Data())
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type() != events.TypeReadyPublished {
			continue
		}
		if ev.CustomerID == "B" {
			bSeq = seq
		} else {
			aSeqs = append(aSeqs, seq)
		}
	}
	if bSeq == 0 || len(aSeqs) != backlog {
		t.Fatalf("found B's ReadyPublished at %d and %d of A's", bSeq, len(aSeqs))
	}
	before := 0
	for _, s := range aSeqs {
		if s < bSeq {
			before++
		}
	}
	t.Logf("B's notification went out after %d of A's %d", before, backlog)
	if bSeq > slices.Max(aSeqs) {
		t.Fatalf("B's ReadyPublished (seq %d) came after all of A's backlog (last %d)", bSeq, slices.Max(aSeqs))
	}
	if before > backlog/2 {
		t.Fatalf("B waited for %d of A's %d notifications", before, backlog)
	}
}

func TestAlarmChildReport(t *testing.T) {
	t.Parallel()

	t.Run("ReportedOnceWithTwoAlarms", func(t *testing.T) {
		t.Parallel()
		ns := testnats.NewNamespace(t)
		a, b := alStart(t, ns), alStart(t, ns)
		a.startAlarm(reactors.AlarmConfig{}, nil)
		b.startAlarm(reactors.AlarmConfig{}, nil)
		parent := a.schedule(alSpec{})
		var children []aggregate.State
		for range 10 {
			children = append(children, b.schedule(alSpec{parent: &parent}))
		}
		for i, c := range children {
			a.waitStatus(c.TaskID, aggregate.StatusQueued)
			if i%2 == 1 { // half finish without a claim (recovery path)
				a.exec(c.TaskID, aggregate.Cancel{Reason: "not needed"})
				continue
			}
			s, _ := a.engine.Task(c.TaskID)
			claim := a.exec(c.TaskID, aggregate.Claim{DeliveryID: s.Delivery.ID, ExecutorID: "w1"})
			a.exec(c.TaskID, aggregate.RecordResult{DeliveryID: claim.Claim.DeliveryID,
				Result: events.Result{Success: true, Summary: "found " + c.TaskID}})
		}
		for _, p := range []*alProc{a, b} {
			alEventually(t, "reports delivered", func() bool {
				s, _ := p.engine.Task(parent.TaskID)
				return len(s.MailIDs) == len(children) && p.engine.TimerLen(projections.Report) == 0 && p.settled()
			})
		}

		h := a.history(parent.TaskID)
		got := map[string]int{}
		for _, ev := range h {
			m, ok := ev.Data.(events.MailboxAppended)
			if !ok {
				continue
			}
			got[m.Message.ID]++
			if len(m.Message.Content) != 1 || m.Message.Content[0].Type != "child_result" {
				t.Fatalf("report %s content = %+v", m.Message.ID, m.Message.Content)
			}
			var r events.ChildResult
			if err := json.Unmarshal([]byte(m.Message.Content[0].Text), &r); err != nil {
				t.Fatal(err)
			}
			if m.Message.ID != events.ChildResultID(r.TaskID) {
				t.Fatalf("report %s is about %s", m.Message.ID, r.TaskID)
			}
			switch r.Status {
			case string(aggregate.StatusSucceeded):
				if r.Result == nil || r.Result.Summary != "found "+r.TaskID {
					t.Fatalf("report of %s: %+v", r.TaskID, r.Result)
				}
			case string(aggregate.StatusCanceled):
				if r.Reason != "not needed" {
					t.Fatalf("report of %s: reason %q", r.TaskID, r.Reason)
				}
			default:
				t.Fatalf("report of %s: status %s", r.TaskID, r.Status)
			}
		}
		for _, c := range children {
			if n := got["child-"+c.TaskID]; n != 1 {
				t.Errorf("child %s reported %d times", c.TaskID, n)
			}
		}
	})

	t.Run("NoReportToTerminalParent", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		p.startAlarm(reactors.AlarmConfig{}, nil)
		parent := p.schedule(alSpec{})
		// Due in an hour: a release of a task whose parent has ended
		// cancels it (ancestor_terminal), and the child must stay live.
		child := p.schedule(alSpec{parent: &parent, runAt: time.Now().Add(time.Hour)})
		grandchild := p.schedule(alSpec{parent: &child})
		p.exec(parent.TaskID, aggregate.Cancel{})
		p.exec(grandchild.TaskID, aggregate.RecordResult{Result: events.Result{Success: true}})
		alEventually(t, "grandchild's report to the live child", func() bool {
			s, _ := p.engine.Task(child.TaskID)
			return len(s.MailIDs) == 1
		})
		p.exec(child.TaskID, aggregate.Cancel{}) // its parent is already canceled
		alEventually(t, "quiet", p.settled)
		if s, _ := p.engine.Task(parent.TaskID); len(s.MailIDs) != 0 {
			t.Fatalf("terminal parent got mail %v", s.MailIDs)
		}
		if s, _ := p.engine.Task(child.TaskID); !slices.Equal(s.MailIDs, []string{"child-" + grandchild.TaskID}) {
			t.Fatalf("child mail = %v", s.MailIDs)
		}
	})
}

// gate blocks the publish of one task until opened; others pass through.
type gate struct {
	next    reactors.Publisher
	blocked string
	entered chan struct{} // closed when the blocked publish started
	open    chan struct{}
	once    sync.Once
}

func (g *gate) PublishReady(ctx context.Context, s aggregate.State, msgID string) (uint64, error) {
	if s.TaskID == g.blocked {
		g.once.Do(func() { close(g.entered) })
		select {
		case <-g.open:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return g.next.PublishReady(ctx, s, msgID)
}

func (g *gate) ReadyStored(ctx context.Context, s aggregate.State) (bool, error) {
	return g.next.ReadyStored(ctx, s)
}

// A due item whose action is still running must not blind the alarm to
// items that come due meanwhile.
func TestAlarmTimerArmedWhileBusy(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	x := p.schedule(alSpec{})
	g := &gate{next: p.ready, blocked: x.TaskID, entered: make(chan struct{}), open: make(chan struct{})}
	defer close(g.open)
	p.startAlarm(reactors.AlarmConfig{}, g)
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("blocked publish never started")
	}
	y := p.schedule(alSpec{runAt: time.Now().Add(200 * time.Millisecond)})
	p.waitStatus(y.TaskID, aggregate.StatusQueued)
	if s := p.status(x.TaskID); s != aggregate.StatusScheduled {
		t.Fatalf("blocked task is %s", s)
	}
}

// TestAlarmRepeatedFailuresLoggedOnce: while the ready stream refuses
// every publish, the retries of many tasks are one warning and counts,
// not a line per task per attempt.
func TestAlarmRepeatedFailuresLoggedOnce(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	var logs testlog.Buffer
	pub := &flaky{}
	cfg := reactors.AlarmConfig{RetryBase: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond,
		Repeats: ratelog.New(zerolog.New(&logs), time.Hour)}
	p.startAlarm(cfg, pub)
	const tasks = 20
	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = p.schedule(alSpec{}).TaskID
	}
	alEventually(t, "every task retried a few times", func() bool {
		for _, id := range ids {
			if pub.callsFor(id) < 3 {
				return false
			}
		}
		return true
	})
	if n := strings.Count(logs.String(), `"message":"ready publish failed`); n != 1 {
		t.Fatalf("%d log lines for %d tasks' failed publishes, want 1:\n%s", n, tasks, logs.String())
	}
}
