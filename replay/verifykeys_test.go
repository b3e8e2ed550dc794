package replay_test

import (
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/replay"
)

// keyLog builds a log by hand, chaining each subject's events, for the
// verifier's concurrency checks.
type keyLog struct {
	t       *testing.T
	v       *replay.Verifier
	seq     uint64
	numbers map[string]int
	prev    map[string]events.Hash
	at      time.Time
}

const keyCust = "cust"

func newKeyLog(t *testing.T) *keyLog {
	return &keyLog{t: t, v: replay.NewVerifier(events.DefaultSubjects), numbers: map[string]int{}, prev: map[string]events.Hash{},
		at: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (l *keyLog) add(id string, p events.Payload) {
	l.t.Helper()
	l.numbers[id]++
	ev := events.Event{ID: events.NewID(), TaskID: id, CustomerID: keyCust, Number: l.numbers[id], At: l.at, Prev: l.prev[id], Data: p}
	b, err := events.Encode(ev)
	if err != nil {
		l.t.Fatal(err)
	}
	l.prev[id] = events.HashOf(b)
	subject := events.DefaultSubjects.Event(keyCust, id)
	if events.KeyEvent(ev.Type()) {
		subject = events.DefaultSubjects.Key(keyCust, id)
	}
	l.seq++
	l.v.Add(events.Position(l.seq), subject, b)
}

func (l *keyLog) schedule(task, key string, limit int) {
	l.add(task, events.TaskScheduled{Spec: events.TaskSpec{RootID: task, Queue: "q", RunAt: l.at, TimeoutSeconds: 60,
		Concurrency: &events.Concurrency{Key: key, Limit: limit}}})
}

func (l *keyLog) acquire(task, key string, limit int) {
	l.add(events.KeyID(keyCust, key), events.SlotAcquired{Key: key, TaskID: task, Limit: limit})
}

func (l *keyLog) releaseSlot(task, key, status string) {
	l.add(events.KeyID(keyCust, key), events.SlotReleased{Key: key, TaskID: task, Status: status})
}

// scheduleRetried schedules task with a retry policy of two attempts.
func (l *keyLog) scheduleRetried(task, key string, limit int) {
	l.add(task, events.TaskScheduled{Spec: events.TaskSpec{RootID: task, Queue: "q", RunAt: l.at, TimeoutSeconds: 60,
		Concurrency: &events.Concurrency{Key: key, Limit: limit},
		Retry:       &events.RetryPolicy{MaxAttempts: 2, MaxBackoffSeconds: 60, On: []string{events.RetryOnFailed}}}})
}

// run releases task under delivery and claims it.
func (l *keyLog) run(task, delivery string) {
	l.add(task, events.DeliveryPending{DeliveryID: delivery, Attempt: 1, NextAt: l.at})
	l.add(task, events.ReadyPublished{DeliveryID: delivery})
	l.add(task, events.Claimed{DeliveryID: delivery, ExecutorID: "w", Deadline: l.at.Add(time.Minute)})
}

// retry fails task's running attempt under delivery, to attempt 2.
func (l *keyLog) retry(task, delivery string) {
	l.add(task, events.RetryScheduled{Attempt: 2, NextAt: l.at, Cause: events.RetryOnFailed, DeliveryID: delivery, Result: &events.Result{Error: "flaky"}})
}

func (l *keyLog) kinds() []string {
	var out []string
	for _, v := range l.v.Report().Violations {
		out = append(out, v.Kind)
	}
	return out
}

func TestVerifyConcurrency(t *testing.T) {
	t.Parallel()
	const key = "repo:x"
	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		l := newKeyLog(t)
		l.schedule("a", key, 1)
		l.schedule("b", key, 1)
		l.acquire("a", key, 1)
		l.add("a", events.DeliveryPending{DeliveryID: "d1", Attempt: 1, NextAt: l.at})
		l.add("a", events.Canceled{})
		l.releaseSlot("a", key, "canceled")
		l.acquire("b", key, 1)
		l.add("b", events.DeliveryPending{DeliveryID: "d2", Attempt: 1, NextAt: l.at})
		if k := l.kinds(); len(k) != 0 {
			t.Fatalf("violations %v", l.v.Report().Violations)
		}
	})
	t.Run("CleanRetry", func(t *testing.T) {
		t.Parallel()
		l := newKeyLog(t)
		l.scheduleRetried("a", key, 1)
		l.schedule("b", key, 1)
		l.acquire("a", key, 1)
		l.run("a", "d1")
		l.retry("a", "d1")
		l.releaseSlot("a", key, "scheduled") // its first attempt's slot, for the backoff
		l.acquire("b", key, 1)
		l.add("b", events.DeliveryPending{DeliveryID: "d2", Attempt: 1, NextAt: l.at})
		l.add("b", events.Canceled{})
		l.releaseSlot("b", key, "canceled")
		l.add(events.KeyID(keyCust, key), events.SlotAcquired{Key: key, TaskID: "a", Limit: 1, Attempt: 2})
		l.run("a", "d3")
		l.add("a", events.ResultRecorded{DeliveryID: "d3", Result: events.Result{Success: true}})
		l.add(events.KeyID(keyCust, key), events.SlotReleased{Key: key, TaskID: "a", Status: "succeeded", Attempt: 2})
		if k := l.kinds(); len(k) != 0 {
			t.Fatalf("violations %v", l.v.Report().Violations)
		}
	})
	t.Run("CleanRetryKeepingItsSlot", func(t *testing.T) { // as logged before retries gave slots back
		t.Parallel()
		l := newKeyLog(t)
		l.scheduleRetried("a", key, 1)
		l.acquire("a", key, 1)
		l.run("a", "d1")
		l.retry("a", "d1")
		l.run("a", "d2")
		l.add("a", events.ResultRecorded{DeliveryID: "d2", Result: events.Result{Success: true}})
		l.releaseSlot("a", key, "succeeded")
		if k := l.kinds(); len(k) != 0 {
			t.Fatalf("violations %v", l.v.Report().Violations)
		}
	})
	for _, tc := range []struct {
		name  string
		build func(l *keyLog)
	}{
		{"ReleasedWithoutSlot", func(l *keyLog) {
			l.schedule("a", key, 1)
			l.add("a", events.DeliveryPending{DeliveryID: "d1", Attempt: 1, NextAt: l.at})
		}},
		{"PastTheLimit", func(l *keyLog) {
			l.schedule("a", key, 1)
			l.schedule("b", key, 1)
			l.acquire("a", key, 1)
			l.acquire("b", key, 1)
		}},
		{"SlotGivenBackWhileLive", func(l *keyLog) {
			l.schedule("a", key, 1)
			l.acquire("a", key, 1)
			l.releaseSlot("a", key, "")
		}},
		{"SlotGivenBackWhileRunningTheNextAttempt", func(l *keyLog) {
			l.scheduleRetried("a", key, 1)
			l.acquire("a", key, 1)
			l.run("a", "d1")
			l.retry("a", "d1")
			l.run("a", "d2") // released with its first attempt's slot (before retries gave slots back)
			l.releaseSlot("a", key, "scheduled")
		}},
		{"SlotOfTheCurrentAttemptGivenBack", func(l *keyLog) {
			l.scheduleRetried("a", key, 1)
			l.acquire("a", key, 1)
			l.run("a", "d1")
			l.retry("a", "d1")
			l.releaseSlot("a", key, "scheduled")
			l.add(events.KeyID(keyCust, key), events.SlotAcquired{Key: key, TaskID: "a", Limit: 1, Attempt: 2})
			l.add(events.KeyID(keyCust, key), events.SlotReleased{Key: key, TaskID: "a", Status: "scheduled", Attempt: 2})
		}},
		{"SlotForAnAttemptNotReached", func(l *keyLog) {
			l.scheduleRetried("a", key, 1)
			l.add(events.KeyID(keyCust, key), events.SlotAcquired{Key: key, TaskID: "a", Limit: 1, Attempt: 2})
		}},
		{"SlotForAnUnknownTask", func(l *keyLog) {
			l.acquire("ghost", key, 1)
		}},
		{"SlotOfAnotherKey", func(l *keyLog) {
			l.schedule("a", "repo:y", 1)
			l.acquire("a", key, 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newKeyLog(t)
			tc.build(l)
			if k := l.kinds(); !slices.Equal(k, []string{replay.Concurrency}) {
				t.Fatalf("violations %v, want one %s", l.v.Report().Violations, replay.Concurrency)
			}
		})
	}
	t.Run("KeyEventOnATaskSubject", func(t *testing.T) {
		t.Parallel()
		l := newKeyLog(t)
		l.schedule("a", key, 1)
		ev := events.Event{ID: events.NewID(), TaskID: events.KeyID(keyCust, key), CustomerID: keyCust, Number: 1, At: l.at,
			Data: events.SlotAcquired{Key: key, TaskID: "a", Limit: 1}}
		b, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		l.v.Add(2, events.DefaultSubjects.Event(keyCust, ev.TaskID), b)
		if k := l.kinds(); !slices.Equal(k, []string{replay.WrongSubject}) {
			t.Fatalf("violations %v", l.v.Report().Violations)
		}
	})
}
