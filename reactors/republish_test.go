package reactors_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/delivery"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/reactors"
)

// checks counts the liveness checks of each task's notification.
type checks struct {
	reactors.Publisher
	mu sync.Mutex
	n  map[string]int
}

func (c *checks) ReadyStored(ctx context.Context, s aggregate.State) (bool, error) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[s.TaskID]++
	c.mu.Unlock()
	return c.Publisher.ReadyStored(ctx, s)
}

func (c *checks) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func (p *alProc) readyStream() jetstream.Stream {
	p.t.Helper()
	rs, err := p.store.JetStream().Stream(context.Background(), p.ns.ReadyStream)
	if err != nil {
		p.t.Fatal(err)
	}
	return rs
}

// readyNotes returns the notifications the ready stream holds, by task.
func (p *alProc) readyNotes() map[string][]events.ReadyNotification {
	p.t.Helper()
	rs := p.readyStream()
	info, err := rs.Info(context.Background())
	if err != nil {
		p.t.Fatal(err)
	}
	out := map[string][]events.ReadyNotification{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		msg, err := rs.GetMsg(context.Background(), seq)
		if err != nil {
			continue // deleted
		}
		n, err := events.UnmarshalReady(msg.Data, msg.Header.Get(events.ContentTypeHeader))
		if err != nil {
			p.t.Fatal(err)
		}
		out[n.TaskID] = append(out[n.TaskID], n)
	}
	return out
}

// A queued task whose notification vanished from the ready stream gets it
// back, with the same token; one whose notification is still there is
// checked but not published again.
func TestAlarmRepublishesLostNotifications(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	pub := &checks{Publisher: p.ready}
	p.startAlarm(reactors.AlarmConfig{RepublishAfter: 50 * time.Millisecond}, pub)
	lost, kept := p.schedule(alSpec{}), p.schedule(alSpec{})
	p.waitStatus(lost.TaskID, aggregate.StatusQueued)
	p.waitStatus(kept.TaskID, aggregate.StatusQueued)
	lostSt, _ := p.engine.Task(lost.TaskID)
	if lostSt.Delivery.ReadySeq == 0 {
		t.Fatalf("queued task without its ready sequence: %+v", lostSt.Delivery)
	}
	if err := p.readyStream().DeleteMsg(context.Background(), lostSt.Delivery.ReadySeq); err != nil {
		t.Fatal(err)
	}

	alEventually(t, "lost notification republished", func() bool {
		return alCount(p.history(lost.TaskID), events.TypeReadyRepublished) == 1
	})
	h := p.history(lost.TaskID)
	re := h[len(h)-1].Data.(events.ReadyRepublished)
	if re.DeliveryID != lostSt.Delivery.ID || re.LostSeq != lostSt.Delivery.ReadySeq || re.ReadySeq == 0 || re.ReadySeq == re.LostSeq {
		t.Fatalf("ReadyRepublished = %+v, want delivery %s at a new sequence", re, lostSt.Delivery.ID)
	}
	if got := p.status(lost.TaskID); got != aggregate.StatusQueued {
		t.Fatalf("republished task is %s, want queued", got)
	}
	// Checked twice more: each check found it, so nothing more is published.
	alEventually(t, "republished and kept notifications checked again", func() bool {
		return pub.of(lost.TaskID) >= 3 && pub.of(kept.TaskID) >= 3
	})
	if n := alCount(p.history(lost.TaskID), events.TypeReadyRepublished); n != 1 {
		t.Fatalf("lost notification republished %d times, want 1", n)
	}
	if n := alCount(p.history(kept.TaskID), events.TypeReadyRepublished); n != 0 {
		t.Fatalf("live notification republished %d times", n)
	}
	notes := p.readyNotes()
	if got := notes[lost.TaskID]; len(got) != 1 || got[0].DeliveryID != lostSt.Delivery.ID {
		t.Fatalf("ready stream holds %+v for the lost task, want one notification with delivery %s", got, lostSt.Delivery.ID)
	}
	if got := notes[kept.TaskID]; len(got) != 1 {
		t.Fatalf("ready stream holds %d notifications for the kept task, want 1", len(got))
	}

	// A claim settles it: a claimed task is not checked any more.
	p.exec(lost.TaskID, aggregate.Claim{DeliveryID: lostSt.Delivery.ID, ExecutorID: "w1"})
	p.waitStatus(lost.TaskID, aggregate.StatusRunning)
	before, keptBefore := pub.of(lost.TaskID), pub.of(kept.TaskID)
	alEventually(t, "kept notification checked twice more", func() bool { return pub.of(kept.TaskID) >= keptBefore+2 })
	if after := pub.of(lost.TaskID); after > before+1 { // one check may have been under way
		t.Fatalf("running task checked %d more times", after-before)
	}
}

// The ready stream is gone for longer than the old budget (8 attempts)
// lasted: with the default budget every task is delivered once it is
// back, and none is exhausted.
func TestAlarmDeliveryOutlastsReadyStreamOutage(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	ctx := context.Background()
	if err := p.store.JetStream().DeleteStream(ctx, p.ns.ReadyStream); err != nil {
		t.Fatal(err)
	}
	var exhausted atomic.Int32
	p.startAlarm(reactors.AlarmConfig{
		RetryBase: time.Millisecond, RetryMax: 10 * time.Millisecond,
		Exhausted: func(aggregate.State) { exhausted.Add(1) },
	}, nil)
	var tasks []aggregate.State
	for range 5 {
		tasks = append(tasks, p.schedule(alSpec{}))
	}
	alEventually(t, "every delivery past its 12th attempt", func() bool {
		for _, task := range tasks {
			if s, _ := p.engine.Task(task.TaskID); s.Delivery.Attempt <= 12 {
				return false
			}
		}
		return true
	})
	if _, err := delivery.EnsureStream(ctx, p.store.JetStream(), p.ns.ReadyStream, p.ns.Subjects, 1); err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		p.waitStatus(task.TaskID, aggregate.StatusQueued)
	}
	if n := exhausted.Load(); n != 0 {
		t.Fatalf("%d deliveries exhausted", n)
	}
	if notes := p.readyNotes(); len(notes) != len(tasks) {
		t.Fatalf("ready stream holds notifications of %d tasks, want %d", len(notes), len(tasks))
	}
}

// A delivery that keeps failing past its budget fails the task, once,
// with the reason, and is reported to Exhausted.
func TestAlarmDeliveryBudgetSpent(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	var mu sync.Mutex
	var exhausted []string
	p.startAlarm(reactors.AlarmConfig{
		DeliveryBudget: 100 * time.Millisecond, RetryBase: 5 * time.Millisecond, RetryMax: time.Second,
		Exhausted: func(s aggregate.State) { mu.Lock(); exhausted = append(exhausted, s.TaskID); mu.Unlock() },
	}, &flaky{failures: 1 << 30})
	task := p.schedule(alSpec{})
	p.waitStatus(task.TaskID, aggregate.StatusFailed)
	h := p.history(task.TaskID)
	ex, ok := h[len(h)-1].Data.(events.DeliveryExhausted)
	if !ok || !strings.Contains(ex.Reason, errPublish.Error()) || ex.Attempts < 1 { // a loaded machine may fit one attempt in the budget
		t.Fatalf("last event %+v, want DeliveryExhausted after its attempts", h[len(h)-1].Data)
	}
	// The last retry was due no later than the budget's end, not a whole
	// RetryMax after it.
	first := h[1].Data.(events.DeliveryPending).NextAt
	for _, ev := range h {
		if r, ok := ev.Data.(events.DeliveryRetryScheduled); ok && r.NextAt.After(first.Add(100*time.Millisecond)) {
			t.Fatalf("retry due at %v, after the budget ends at %v", r.NextAt, first.Add(100*time.Millisecond))
		}
	}
	alEventually(t, "exhaustion reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(exhausted) == 1 })
	mu.Lock()
	defer mu.Unlock()
	if exhausted[0] != task.TaskID {
		t.Fatalf("Exhausted got %v, want [%s]", exhausted, task.TaskID)
	}
}

// Two processes that both find a notification lost publish one copy and
// record the loss once.
func TestAlarmRepublishTwoProcesses(t *testing.T) {
	t.Parallel()
	ns := testnats.NewNamespace(t)
	a, b := alStart(t, ns), alStart(t, ns)
	ca, cb := &checks{Publisher: a.ready}, &checks{Publisher: b.ready}
	a.startAlarm(reactors.AlarmConfig{RepublishAfter: 50 * time.Millisecond}, ca)
	b.startAlarm(reactors.AlarmConfig{RepublishAfter: 50 * time.Millisecond}, cb)
	task := a.schedule(alSpec{})
	a.waitStatus(task.TaskID, aggregate.StatusQueued)
	b.waitStatus(task.TaskID, aggregate.StatusQueued)
	st, _ := a.engine.Task(task.TaskID)
	if err := a.readyStream().DeleteMsg(context.Background(), st.Delivery.ReadySeq); err != nil {
		t.Fatal(err)
	}
	alEventually(t, "loss recorded", func() bool { return alCount(a.history(task.TaskID), events.TypeReadyRepublished) > 0 })
	before := ca.of(task.TaskID) + cb.of(task.TaskID)
	alEventually(t, "both processes checked again", func() bool {
		return ca.of(task.TaskID)+cb.of(task.TaskID) >= before+4
	})
	if n := alCount(a.history(task.TaskID), events.TypeReadyRepublished); n != 1 {
		t.Fatalf("loss recorded %d times, want 1", n)
	}
	if got := a.readyNotes()[task.TaskID]; len(got) != 1 {
		t.Fatalf("ready stream holds %d notifications of the task, want 1", len(got))
	}
}
