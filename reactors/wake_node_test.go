package reactors_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// lateness records the lateness of the alarm's successful actions by
// timer queue (AlarmConfig.Observe).
type lateness struct {
	mu   sync.Mutex
	late map[projections.Timer][]time.Duration
}

func (l *lateness) observe(t projections.Timer, d time.Duration, err error) {
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.late[t] = append(l.late[t], d)
}

func (l *lateness) of(t projections.Timer) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.late[t]...)
}

// TestAlarmWaiterOnFullKeyDelaysNothing is the release bug as a user met
// it, on a whole node over HTTP: a due task waiting for a slot of a full
// concurrency key was the Release queue's earliest item, in the past, and
// the alarm slept past every later release until something unrelated
// woke it (minutes, up to its hour). With such a waiter in place, a
// delayed release, a running deadline, a schedule's fire, the republish
// of a lost notification and a child's report must each happen on time.
func TestAlarmWaiterOnFullKeyDelaysNothing(t *testing.T) {
	t.Parallel()
	late := &lateness{late: map[projections.Timer][]time.Duration{}}
	n := testnode.Start(t, func(c *node.Config) {
		c.Alarm.Observe = late.observe
		// Long enough that C's notification is gone before its first
		// check, so that check republishes it (a check that finds it
		// postpones the next and is not observed).
		c.Alarm.RepublishAfter = 2 * time.Second
	})
	ctx := context.Background()
	c := n.Client
	text := func(s string) events.Message {
		return events.Message{ID: events.NewID(), Content: []events.ContentPart{{Type: "text", Text: s}}}
	}
	schedule := func(r api.ScheduleRequest) api.Task {
		t.Helper()
		if r.Message.ID == "" {
			r.Message = text("work")
		}
		task, _, err := c.Schedule(ctx, r)
		if err != nil {
			t.Fatalf("schedule: %v", err)
		}
		return task
	}
	claim := func(queue string) api.Task {
		t.Helper()
		task, ok, err := c.ClaimNext(ctx, queue, "w", 5*time.Second)
		if err != nil || !ok {
			t.Fatalf("claim on %s: ok %v, %v", queue, ok, err)
		}
		return task
	}
	status := func(id string) string {
		task, err := c.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return string(task.Status)
	}
	waitStatus := func(id, want string) {
		t.Helper()
		testnode.Eventually(t, "task "+id+" "+want, func() bool { return status(id) == want })
	}
	seconds := func(s int) *int { return &s }

	// A holds k1's only slot; B is due and waits for it.
	key := &events.Concurrency{Key: "k1", Limit: 1}
	a := schedule(api.ScheduleRequest{Queue: "deploy", Concurrency: key})
	b := schedule(api.ScheduleRequest{Queue: "deploy", Concurrency: key})
	if got := claim("deploy"); got.ID != a.ID {
		t.Fatalf("claimed %s, want A %s", got.ID, a.ID)
	}
	testnode.Eventually(t, "B waiting for k1", func() bool {
		k, err := c.Concurrency(ctx, "k1", "")
		return err == nil && len(k.Waiters) == 1 && k.Waiters[0].TaskID == b.ID
	})

	// A delayed release on another queue, with nothing else due: only the
	// alarm's own timer can release it.
	delay := 0.5
	cTask := schedule(api.ScheduleRequest{Queue: "other", DelaySeconds: &delay})
	waitStatus(cTask.ID, "queued")
	// A running deadline.
	d := schedule(api.ScheduleRequest{Queue: "short", TimeoutSeconds: seconds(1)})
	claim("short")
	// A schedule's fire.
	if _, _, err := c.CreateSchedule(ctx, api.ScheduleCreateRequest{ID: "tick", Every: "1s", Task: api.ScheduleTask{Queue: "ticks", Message: text("tick")}}); err != nil {
		t.Fatal(err)
	}
	// A child's report to its running parent.
	p := schedule(api.ScheduleRequest{Queue: "parents"})
	claim("parents")
	child := schedule(api.ScheduleRequest{Queue: "children", ParentID: p.ID})
	ch := claim("children")
	if _, err := c.RecordResult(ctx, child.ID, api.ResultRequest{DeliveryID: ch.Claim.DeliveryID, Success: true}); err != nil {
		t.Fatal(err)
	}

	// A republish check: C's notification is lost from the ready stream.
	testnode.Eventually(t, "C's notification stored", func() bool {
		s, _ := n.Engine.Task(cTask.ID)
		return s.Delivery.ReadySeq != 0
	})
	s, _ := n.Engine.Task(cTask.ID)
	ready, err := jetstream.New(n.NC)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ready.Stream(ctx, n.NS.ReadyStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.DeleteMsg(ctx, s.Delivery.ReadySeq); err != nil {
		t.Fatal(err)
	}
	waitStatus(d.ID, "timed_out")
	timers := []projections.Timer{projections.Release, projections.Expire, projections.Fire, projections.Republish, projections.Report}
	for _, tm := range timers {
		testnode.Eventually(t, "an action of the "+tm.String()+" queue", func() bool { return len(late.of(tm)) > 0 })
	}
	// The bug's lateness was the alarm's idle wait (an hour) or the next
	// unrelated event; a second covers a loaded machine's scheduling.
	const bound = time.Second
	for _, tm := range timers {
		l := late.of(tm)
		t.Logf("%s lateness: %v", tm, l)
		for _, d := range l {
			if d > bound {
				t.Errorf("%s acted %v late (at most %v)", tm, d, bound)
			}
		}
	}
	if s := status(b.ID); s != "scheduled" {
		t.Fatalf("B is %s, want scheduled: k1 is still held by A", s)
	}
}
