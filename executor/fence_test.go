package executor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/executor"
)

// wkPartitioned is a scheduler whose heartbeats never get through (a
// network partition of the heartbeat path), while everything else does.
type wkPartitioned struct{ *api.Client }

func (wkPartitioned) Heartbeat(context.Context, string, string) (api.Renewal, error) {
	return api.Renewal{}, errors.New("connect: network is unreachable")
}

// TestHeartbeatFence: a run whose heartbeats do not get through stops
// itself (claim_lost) before the scheduler records its claim lost, so it
// never runs beside the executor the task is handed to; it reports
// nothing.
func TestHeartbeatFence(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	const queue = "fence"
	cfg := e.httpCfg(queue, "exec-fenced")
	cfg.API, cfg.HeartbeatSeconds, cfg.CheckInterval = wkPartitioned{e.client}, 2, time.Hour
	stopped := make(chan time.Time, 1)
	reason := make(chan string, 1)
	e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		<-ctx.Done()
		stopped <- time.Now()
		reason <- run.StopReason()
		return "", ctx.Err()
	})
	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("work")})
	at := wkRecv(t, "the fenced run's stop", stopped)
	if r := wkRecv(t, "its reason", reason); r != executor.ReasonClaimLost {
		t.Fatalf("run stopped with %q, want %q", r, executor.ReasonClaimLost)
	}
	done := e.waitStatus(t, task.ID, "timed_out")
	if done.Result != nil {
		t.Fatalf("fenced run reported %+v, want nothing", done.Result)
	}
	h, err := e.client.History(context.Background(), task.ID)
	if err != nil {
		t.Fatal(err)
	}
	var lost time.Time
	for _, ev := range h.Events {
		if ev.Type == "ClaimLost" {
			lost = ev.At
		}
	}
	if lost.IsZero() || !at.Before(lost) {
		t.Fatalf("run stopped at %v, claim lost at %v: want the run stopped first", at, lost)
	}
}
