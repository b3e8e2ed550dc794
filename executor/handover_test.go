package executor_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/executor"
)

// TestKillNineHandOver kills an executor process (kill -9) holding a task
// whose claim has a heartbeat of 5 s, in the middle of its run (turn 1
// ended, the effect and turn 2 not begun), and starts another executor
// with a different id: it claims the task within 10 s of the kill and
// resumes the saved Run at turn 2 (turn 1 is not run again), the
// transcript records the hand-over, the history shows the ClaimLost,
// and the dead executor's late result is refused as claim_lost.
func TestKillNineHandOver(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	queue, calls := "handover", filepath.Join(t.TempDir(), "calls")
	dead := e.startKillChild(t, queue, "turn-end", calls, killExecutorEnv+"=exec-dead", killHeartbeatEnv+"=5")
	attempts := 3
	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("fix it"), Retry: &api.RetryRequest{MaxAttempts: &attempts}})
	if got := wkRecv(t, "child at turn-end", dead.at); got != "turn-end "+task.ID {
		t.Fatalf("child reached %q", got)
	}
	held, err := e.client.Get(ctx, task.ID)
	if err != nil || held.Claim == nil || held.Claim.ExecutorID != "exec-dead" || held.Claim.HeartbeatSeconds != 5 {
		t.Fatalf("task before the kill: %+v, %v", held.Claim, err)
	}
	dead.kill()
	killed := time.Now()
	e.startKillChild(t, queue, "-", calls, killExecutorEnv+"=exec-heir", killHeartbeatEnv+"=5")

	done := e.waitStatus(t, task.ID, "succeeded")
	if len(done.Attempts) != 2 || done.Attempts[0].Outcome != "claim_lost" || done.Attempts[0].ExecutorID != "exec-dead" ||
		done.Attempts[1].ExecutorID != "exec-heir" || done.Claim.ExecutorID != "exec-heir" {
		t.Fatalf("attempts %+v", done.Attempts)
	}
	if took := done.Attempts[1].StartedAt.Sub(killed); took > 10*time.Second {
		t.Fatalf("the heir claimed the task %v after the kill, want within 10s", took)
	}
	for typ, n := range map[string]int{"Claimed": 2, "ClaimLost": 1, "EffectsReported": 1, "ResultRecorded": 1} {
		if got := e.countEvents(t, task.ID, typ); got != n {
			t.Errorf("%d %s events, want %d", got, typ, n)
		}
	}
	if got, want := killCounts(t, calls), map[string]int{"turn1": 1, "tool": 1, "effect": 1, "turn2": 1}; !maps.Equal(got, want) {
		t.Errorf("calls %v, want %v: the heir resumes at turn 2", got, want)
	}
	d, ok := e.runOf(t, task.ID)
	handover := "handover-" + done.Claim.DeliveryID
	want := []string{"t1.i1", "t1.i2", "t1.c1", "t1.c1.result", "t1.end", handover, "t2.i1", "t2.end"}
	if !ok || d.Run.ExecutorID != "exec-heir" || d.Run.Turn != 2 || !slices.Equal(wkItemIDs(d.Run.Transcript), want) {
		t.Fatalf("final Run %+v (%v): want transcript %v", d.Run, ok, want)
	}
	if it := d.Run.Transcript[5]; it.Kind != api.ItemHandover || it.Turn != 1 || len(it.Content) != 1 {
		t.Fatalf("hand-over item %+v", it)
	}
	_, err = e.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: held.Claim.DeliveryID, Success: true, Summary: "late"})
	if !errors.Is(err, api.ErrClaimLost) {
		t.Fatalf("the dead executor's late result: %v, want claim_lost", err)
	}
}

// TestWorkerReleasesOnShutdown stops a worker (its context ends) while a
// run of a task with one attempt is in its second Turn: the worker
// releases the claim, the task is claimable again at once and the attempt
// is not charged, and a worker with another id resumes the Run at turn 2
// and finishes it.
func TestWorkerReleasesOnShutdown(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var turns []string
	inTurn2 := make(chan struct{}, 1)
	handler := func(ctx context.Context, run *executor.Run) (string, error) {
		by := run.Task.Claim.ExecutorID
		for k, text := range []string{"planned", "done"} {
			err := run.Turn(ctx, func(tn *executor.Turn) error {
				mu.Lock()
				turns = append(turns, fmt.Sprintf("turn %d by %s", k+1, by))
				mu.Unlock()
				if k == 1 && by == "exec-one" {
					inTurn2 <- struct{}{}
					return wkBlock(ctx)
				}
				_, err := tn.Record(ctx, api.TranscriptItem{Kind: api.ItemModelOutput, Content: wkText(text).Content})
				return err
			})
			if err != nil {
				return "", err
			}
		}
		return "handed over", nil
	}
	cfg := e.httpCfg("release-stop", "exec-one")
	cfg.KeepClaimsOnShutdown = false
	first := e.start(t, cfg, handler)
	task := e.schedule(t, api.ScheduleRequest{Queue: "release-stop", Message: wkText("two turns")})
	wkRecv(t, "turn 2 of the first worker", inTurn2)
	first.stop(t)
	released, err := e.client.Get(ctx, task.ID)
	if err != nil || released.Status == "running" || len(released.Attempts) != 1 || released.Attempts[0].Outcome != "released" {
		t.Fatalf("task after the stop: %+v, %v", released, err)
	}

	cfg.ExecutorID = "exec-two"
	e.start(t, cfg, handler)
	done := e.waitStatus(t, task.ID, "succeeded")
	if done.MaxAttempts != 1 || done.Attempt != 2 || done.Claim.ExecutorID != "exec-two" {
		t.Fatalf("finished task: attempt %d of %d, claim %+v", done.Attempt, done.MaxAttempts, done.Claim)
	}
	mu.Lock()
	got := slices.Clone(turns)
	mu.Unlock()
	if want := []string{"turn 1 by exec-one", "turn 2 by exec-one", "turn 2 by exec-two"}; !slices.Equal(got, want) {
		t.Fatalf("turns %v, want %v", got, want)
	}
	d, ok := e.runOf(t, task.ID)
	if !ok || d.Run.ExecutorID != "exec-two" || !slices.Contains(wkItemIDs(d.Run.Transcript), "handover-"+done.Claim.DeliveryID) {
		t.Fatalf("final Run %+v", d.Run)
	}
}
