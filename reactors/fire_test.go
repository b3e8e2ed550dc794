package reactors_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/reactors"
)

// earlyFirer is a Firer whose log never has anything due: each call
// answers that nothing is due until an hour from now, as the service
// does when the projections were early. It counts the calls and signals
// each on calls.
type earlyFirer struct {
	mu    sync.Mutex
	n     int
	calls chan int
}

func (f *earlyFirer) FireSchedule(context.Context, string, string) (events.Position, time.Time, error) {
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	select {
	case f.calls <- n:
	default:
	}
	return 0, time.Now().Add(time.Hour), nil
}

func (f *earlyFirer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// TestAlarmFireNotDue: when the log has nothing due of a schedule the
// projections show due, the alarm waits for the log's next instant rather
// than firing again at once (a busy loop); a change of the schedule in the
// projections ends that wait.
func TestAlarmFireNotDue(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	ctx := context.Background()
	spec := events.ScheduleSpec{Cron: "* * * * * *", Timezone: "UTC", Overlap: events.OverlapSkip, Catchup: events.CatchupOne,
		Task: events.TaskSpec{Queue: "q", TimeoutSeconds: 60}}
	create := func(spec events.ScheduleSpec) {
		t.Helper()
		if _, _, err := p.store.ExecuteSchedule(ctx, "cust", "s1", "", aggregate.CreateSchedule{ID: "s1", CustomerID: "cust", Spec: spec}); err != nil {
			t.Fatal(err)
		}
	}
	create(spec) // due within a second, every second
	f := &earlyFirer{calls: make(chan int, 1)}
	p.startAlarm(reactors.AlarmConfig{Schedules: f}, nil)
	wait := func(want int) {
		t.Helper()
		for {
			select {
			case n := <-f.calls:
				if n >= want {
					return
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("FireSchedule called %d times, want %d", f.count(), want)
			}
		}
	}
	wait(1)
	// Rounds of the alarm go by: a task is scheduled, released and
	// published. Fired again at once, the schedule would have been fired
	// many times by then.
	x := p.schedule(alSpec{})
	p.waitStatus(x.TaskID, aggregate.StatusQueued)
	if n := f.count(); n != 1 {
		t.Fatalf("FireSchedule called %d times while the log had nothing due, want 1", n)
	}
	spec.Cron = "*/2 * * * * *"
	create(spec) // ScheduleUpdated: the wait ends, the schedule is fired when due
	wait(2)
}
