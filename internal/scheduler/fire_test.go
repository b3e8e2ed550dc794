package scheduler_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// readCounter is a ScheduleStore that counts the calls that read a
// schedule from the log.
type readCounter struct {
	*store.Store
	reads atomic.Int32
}

func (r *readCounter) LoadSchedule(ctx context.Context, customerID, id string) (aggregate.ScheduleState, error) {
	r.reads.Add(1)
	return r.Store.LoadSchedule(ctx, customerID, id)
}

func (r *readCounter) ExecuteSchedule(ctx context.Context, customerID, id, actor string, cmd aggregate.Command) (aggregate.ScheduleState, []events.Event, error) {
	r.reads.Add(1)
	return r.Store.ExecuteSchedule(ctx, customerID, id, actor, cmd)
}

// TestFireScheduleFromTheViews: an on-time fire is decided on the schedule
// as the projections hold it (folded from the log, so with its chain's
// last hash) and appended without reading the schedule from the log; the
// fire and its run's task are in the log, and a second call, with the
// projections caught up, finds nothing due. (No alarm runs here: the
// test's service is the only one firing.)
func TestFireScheduleFromTheViews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)
	var now atomic.Pointer[time.Time]
	now.Store(&t0)
	clock := func() time.Time { return *now.Load() }
	ns := testnats.NewNamespace(t)
	st, err := store.Open(ctx, testnats.Conn(t), store.Config{Stream: ns.Stream, Subjects: ns.Subjects, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	views, err := projections.New(projections.Config{Log: eventlog.Log{JS: st.JetStream(), Stream: ns.Stream, Subjects: ns.Subjects}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- views.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	reads := &readCounter{Store: st}
	svc, err := scheduler.New(scheduler.Config{Store: st, Views: views, ScheduleStore: reads, Schedules: views, JS: st.JetStream(), Subjects: ns.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)

	spec := events.ScheduleSpec{Every: "1h", Timezone: "UTC", Overlap: events.OverlapSkip, Catchup: events.CatchupOne,
		Task: events.TaskSpec{Queue: "default", TimeoutSeconds: 60}}
	created, _, err := st.ExecuteSchedule(ctx, "acme", "hourly", "", aggregate.CreateSchedule{ID: "hourly", CustomerID: "acme", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	held := func(seq events.Position) func() bool {
		return func() bool { sc, ok := views.Schedule("acme", "hourly"); return ok && sc.State.LastSeq == seq }
	}
	testnode.Eventually(t, "the projections hold the schedule", held(created.LastSeq))
	due := created.Next()
	now.Store(&due)

	reads.reads.Store(0)
	seq, next, err := svc.FireSchedule(ctx, "acme", "hourly")
	if err != nil || !next.IsZero() {
		t.Fatalf("FireSchedule: next %v (%v)", next, err)
	}
	if n := reads.reads.Load(); n != 0 {
		t.Fatalf("an on-time fire read the schedule from the log %d times, want 0", n)
	}
	fired, err := st.LoadSchedule(ctx, "acme", "hourly")
	if err != nil || fired.LastRun.TaskID == "" || !fired.LastRun.At.Equal(due) || fired.Version != 2 {
		t.Fatalf("the log's schedule after the fire: %+v (%v)", fired, err)
	}
	if task, err := st.Load(ctx, fired.LastRun.TaskID); err != nil || !task.Exists() || seq < task.LastSeq {
		t.Fatalf("the run's task %+v (%v), FireSchedule's seq %d", task, err, seq)
	}
	testnode.Eventually(t, "the projections hold the fire", held(fired.LastSeq))
	if _, next, err := svc.FireSchedule(ctx, "acme", "hourly"); err != nil || !next.Equal(fired.Next()) {
		t.Fatalf("fired again at once: next %v (%v), want %v", next, err, fired.Next())
	}
}
