package reactors_test

import (
	"context"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/reactors"
)

// hbClaimed schedules a task with two attempts, waits for the alarm to
// queue it, and claims it with a heartbeat of hb seconds.
func (p *alProc) hbClaimed(hb int) aggregate.State {
	p.t.Helper()
	id := events.NewID()
	spec := events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: 600,
		Retry: &events.RetryPolicy{MaxAttempts: 2, On: []string{events.RetryOnFailed}}}
	if _, _, err := p.store.Execute(context.Background(), id, "", aggregate.Schedule{TaskID: id, CustomerID: "cust", Spec: spec}); err != nil {
		p.t.Fatal(err)
	}
	p.waitStatus(id, aggregate.StatusQueued)
	s, _ := p.engine.Task(id)
	claimed := p.exec(id, aggregate.Claim{DeliveryID: s.Delivery.ID, ExecutorID: "w1", HeartbeatSeconds: hb})
	p.waitStatus(id, aggregate.StatusRunning)
	return claimed
}

// lost returns the task's ClaimLost events.
func (p *alProc) lost(id string) []events.Event {
	var out []events.Event
	for _, ev := range p.history(id) {
		if ev.Type() == events.TypeClaimLost {
			out = append(out, ev)
		}
	}
	return out
}

func TestAlarmHeartbeat(t *testing.T) {
	t.Parallel()

	t.Run("Missed", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		p.startAlarm(reactors.AlarmConfig{}, nil)
		claimed := p.hbClaimed(1)
		alEventually(t, "claim lost and the task queued again", func() bool {
			s, _ := p.engine.Task(claimed.TaskID)
			return s.Status == aggregate.StatusQueued && s.Attempt() == 2
		})
		lost := p.lost(claimed.TaskID)
		if len(lost) != 1 {
			t.Fatalf("%d ClaimLost events", len(lost))
		}
		cl := lost[0].Data.(events.ClaimLost)
		if cl.Reason != events.ClaimLostHeartbeat || cl.DeliveryID != claimed.Claim.DeliveryID || cl.Attempt != 2 || lost[0].At.Before(claimed.HeartbeatDue()) {
			t.Fatalf("ClaimLost %+v at %v, claim made at %v", cl, lost[0].At, claimed.StartedAt)
		}
		s, _ := p.engine.Task(claimed.TaskID)
		if s.Delivery.ID == "" || s.Delivery.ID == claimed.Claim.DeliveryID {
			t.Fatalf("queued again with token %q, the lost one was %q", s.Delivery.ID, claimed.Claim.DeliveryID)
		}
	})

	t.Run("Renewed", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		p.startAlarm(reactors.AlarmConfig{}, nil)
		claimed := p.hbClaimed(1)
		until := time.Now().Add(3 * time.Second)
		var last time.Time
		for time.Now().Before(until) {
			last = time.Now()
			if _, ok := p.engine.Renew(claimed.TaskID, claimed.Claim.DeliveryID, last); !ok {
				t.Fatalf("renewal refused; history %v", alTypes(p.history(claimed.TaskID)))
			}
			time.Sleep(200 * time.Millisecond) // the executor's heartbeat period, not a synchronisation
		}
		if n := len(p.lost(claimed.TaskID)); n != 0 || p.status(claimed.TaskID) != aggregate.StatusRunning {
			t.Fatalf("renewed claim: %d ClaimLost, status %s", n, p.status(claimed.TaskID))
		}
		p.waitStatus(claimed.TaskID, aggregate.StatusQueued)
		if lost := p.lost(claimed.TaskID); len(lost) != 1 || lost[0].At.Before(last.Add(time.Second)) {
			t.Fatalf("after the last renewal at %v: %+v", last, lost)
		}
	})

	t.Run("RestartGrace", func(t *testing.T) {
		t.Parallel()
		p := alStart(t, testnats.NewNamespace(t))
		p.startAlarm(reactors.AlarmConfig{}, nil) // queues the task
		claimed := p.hbClaimed(2)
		// A second process starts its alarm after the claim's heartbeat
		// was due as the log knows it (its renewals are not in the log):
		// the claim is lost no earlier than one interval after that start.
		// The first process's alarm keeps the claim's renewals in its
		// own projections, and those are renewed, as an executor would.
		q := alStart(t, p.ns)
		stop := make(chan struct{})
		renewed := make(chan struct{})
		go func() {
			defer close(renewed)
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
					p.engine.Renew(claimed.TaskID, claimed.Claim.DeliveryID, time.Now())
				}
			}
		}()
		alEventually(t, "heartbeat due in the log passed", func() bool { return time.Now().After(claimed.HeartbeatDue().Add(500 * time.Millisecond)) })
		started := time.Now()
		q.startAlarm(reactors.AlarmConfig{}, nil)
		p.waitStatus(claimed.TaskID, aggregate.StatusQueued)
		close(stop)
		<-renewed
		lost := p.lost(claimed.TaskID)
		if len(lost) != 1 || lost[0].At.Before(started.Add(2*time.Second)) {
			t.Fatalf("the new process's alarm started at %v; ClaimLost %+v", started, lost)
		}
	})
}
