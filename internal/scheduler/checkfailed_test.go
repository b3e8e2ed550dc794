package scheduler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
)

// downLog is the node's store with a log that fails every read and write
// while down is set.
type downLog struct {
	*store.Store
	down *atomic.Bool
}

var errLogDown = errors.New("the log is down")

func (d downLog) History(ctx context.Context, id string) ([]events.Event, error) {
	if d.down.Load() {
		return nil, errLogDown
	}
	return d.Store.History(ctx, id)
}

func (d downLog) Execute(ctx context.Context, id, actor string, cmd aggregate.Command) (aggregate.State, []events.Event, error) {
	if d.down.Load() {
		return aggregate.State{}, nil, errLogDown
	}
	return d.Store.Execute(ctx, id, actor, cmd)
}

// TestCheckFailedRecorded: a stop check that fails answers continue
// (check_failed) and is recorded on the task as a CheckFailed, at most one
// a minute; checks that fail while the log itself is down are recorded
// once it answers again, counted in one record.
func TestCheckFailedRecorded(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	down := &atomic.Bool{}
	svc, err := scheduler.New(scheduler.Config{
		Store: downLog{n.Store, down}, Views: n.Engine, JS: n.Store.JetStream(), Logger: zerolog.Nop(),
		Metrics: scheduler.NewMetrics(nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	st := running(t, n, acme, scheduler.ScheduleRequest{})
	checkFailed := func() []events.CheckFailed {
		var out []events.CheckFailed
		for _, ev := range history(t, n, st.TaskID) {
			if p, ok := ev.Data.(events.CheckFailed); ok {
				if ev.Actor == "" {
					t.Fatalf("CheckFailed without an actor: %+v", ev)
				}
				out = append(out, p)
			}
		}
		return out
	}

	down.Store(true)
	for range 3 {
		res, err := svc.Check(ctx, acme, st.TaskID, st.Claim.DeliveryID)
		if err != nil || res.ShouldStop || res.Reason != api.ReasonCheckFailed {
			t.Fatalf("check with the log down: %+v, %v; want continue, check_failed", res, err)
		}
	}
	if got := checkFailed(); len(got) != 0 {
		t.Fatalf("recorded %+v while the log was down", got)
	}

	down.Store(false)
	res, err := svc.Check(ctx, acme, st.TaskID, st.Claim.DeliveryID)
	if err != nil || res.Reason != api.ReasonActive {
		t.Fatalf("check with the log back: %+v, %v", res, err)
	}
	got := checkFailed()
	if len(got) != 1 || got[0].Failures != 3 || got[0].Error == "" || got[0].Since.IsZero() {
		t.Fatalf("records %+v, want one of the 3 failed checks", got)
	}

	// Another failure within the minute is not recorded yet: at most one
	// record a minute.
	down.Store(true)
	if res, _ := svc.Check(ctx, acme, st.TaskID, st.Claim.DeliveryID); res.Reason != api.ReasonCheckFailed {
		t.Fatalf("check: %+v, want check_failed", res)
	}
	down.Store(false)
	if res, _ := svc.Check(ctx, acme, st.TaskID, st.Claim.DeliveryID); res.Reason != api.ReasonActive {
		t.Fatalf("check: %+v, want active", res)
	}
	if got := checkFailed(); len(got) != 1 {
		t.Fatalf("records %+v, want still one within the minute", got)
	}
}
