package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// hbTask schedules a task on queue with maxAttempts attempts and claims
// it as executor with heartbeats every hb seconds.
func hbTask(t *testing.T, b *bundle, queue, executor string, maxAttempts, hb int) api.Task {
	t.Helper()
	q := queuedTask(t, b, api.ScheduleRequest{Queue: queue, Message: text("", "beat"), Retry: &api.RetryRequest{MaxAttempts: &maxAttempts}})
	task, err := b.client.Claim(context.Background(), q.ID, q.Delivery.ID, executor, api.WithHeartbeat(hb))
	if err != nil {
		t.Fatalf("claim %s: %v", q.ID, err)
	}
	if task.Claim == nil || task.Claim.HeartbeatSeconds != hb {
		t.Fatalf("claimed task %+v, want a claim with heartbeat %d", task.Claim, hb)
	}
	return task
}

// lostEvents returns the ClaimLost entries of a task's history.
func lostEvents(t *testing.T, b *bundle, id string) []api.Event {
	t.Helper()
	h, err := b.client.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []api.Event
	for _, e := range h.Events {
		if e.Type == string(events.TypeClaimLost) {
			out = append(out, e)
		}
	}
	return out
}

// lateWrites: every write of a lost claim's executor is 409 claim_lost.
func lateWrites(t *testing.T, b *bundle, id, deliveryID string) {
	t.Helper()
	ctx := context.Background()
	_, err := b.client.RecordResult(ctx, id, api.ResultRequest{DeliveryID: deliveryID, Success: true, Summary: "late"})
	apiError(t, err, http.StatusConflict, "claim_lost")
	_, err = b.client.ReportEffects(ctx, id, deliveryID, []events.Effect{{Kind: "comment", Ref: "late"}})
	apiError(t, err, http.StatusConflict, "claim_lost")
	_, err = b.client.Heartbeat(ctx, id, deliveryID)
	apiError(t, err, http.StatusConflict, "claim_lost")
	_, err = b.client.Release(ctx, id, deliveryID, "late")
	apiError(t, err, http.StatusConflict, "claim_lost")
	_, err = b.client.SaveRun(ctx, id, api.RunSave{DeliveryID: deliveryID, Run: api.RunState{Phase: "late"}})
	apiError(t, err, http.StatusConflict, "claim_lost")
	_, err = b.client.Check(ctx, id, deliveryID)
	apiError(t, err, http.StatusConflict, "claim_lost")
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("RenewedThenMissed", func(t *testing.T) {
		t.Parallel()
		// Renewed for longer than the 3 s interval, every 250 ms: a margin
		// a loaded CI machine's stalls fit in.
		task := hbTask(t, b, "hb-renew", "w1", 2, 3)
		token := task.Claim.DeliveryID
		for until := time.Now().Add(4 * time.Second); time.Now().Before(until); {
			rn, err := b.client.Heartbeat(ctx, task.ID, token)
			if err != nil {
				t.Fatalf("heartbeat: %v", err)
			}
			if !rn.ExpiresAt.After(time.Now()) || rn.ExpiresAt.After(rn.Deadline) {
				t.Fatalf("renewal %+v", rn)
			}
			time.Sleep(250 * time.Millisecond) // the executor's heartbeat period, not a synchronisation
		}
		if got, _ := b.client.Get(ctx, task.ID); got.Status != "running" || len(lostEvents(t, b, task.ID)) != 0 {
			t.Fatalf("a renewed claim: %s, history %v", got.Status, historyTypes(t, b, task.ID))
		}
		again := b.waitStatus(t, task.ID, "queued")
		if again.Attempt != 2 || again.Delivery == nil || again.Delivery.ID == token || len(again.Attempts) != 1 || again.Attempts[0].Outcome != "claim_lost" {
			t.Fatalf("after the missed heartbeat: %+v", again)
		}
		lost := lostEvents(t, b, task.ID)
		if len(lost) != 1 || lost[0].Detail == "" {
			t.Fatalf("ClaimLost events %+v", lost)
		}
		lateWrites(t, b, task.ID, token)
		next, err := b.client.Claim(ctx, task.ID, again.Delivery.ID, "w2", api.WithHeartbeat(5))
		if err != nil || next.Claim.ExecutorID != "w2" {
			t.Fatalf("second executor's claim: %+v, %v", next.Claim, err)
		}
	})

	t.Run("NoAttemptLeft", func(t *testing.T) {
		t.Parallel()
		task := hbTask(t, b, "hb-last", "w1", 1, 1)
		done := b.waitStatus(t, task.ID, "timed_out")
		if done.Reason != "heartbeat missed" || len(lostEvents(t, b, task.ID)) != 1 {
			t.Fatalf("timed out: %+v, history %v", done, historyTypes(t, b, task.ID))
		}
		_, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true})
		apiError(t, err, http.StatusConflict, "claim_lost")
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		plain := runningTask(t, b, api.ScheduleRequest{Queue: "hb-plain", Message: text("", "x")})
		_, err := b.client.Heartbeat(ctx, plain.ID, plain.Claim.DeliveryID)
		apiError(t, err, http.StatusBadRequest, "")
		_, err = b.client.Heartbeat(ctx, plain.ID, "not-the-token")
		apiError(t, err, http.StatusConflict, "token_mismatch")
		a := rawDo(t, b, http.MethodPost, "/v1/claims/next", `{"queue":"hb-plain","executorId":"w1","heartbeatSeconds":3601}`)
		requireErrorBody(t, a, http.StatusBadRequest, "invalid_argument")
		a = rawDo(t, b, http.MethodPost, "/v1/claims", `{"queue":"hb-plain","executorId":"w1","heartbeatSeconds":-1}`)
		requireErrorBody(t, a, http.StatusBadRequest, "invalid_argument")
		q := queuedTask(t, b, api.ScheduleRequest{Queue: "hb-plain", Message: text("", "y")})
		_, err = b.client.Claim(ctx, q.ID, q.Delivery.ID, "w1", api.WithHeartbeat(3601))
		apiError(t, err, http.StatusBadRequest, "")
	})
}

// TestRelease hands claims back: the task is claimable again at once by
// another executor, the attempt is recorded as released and not charged
// (a task of one attempt is released twice and still succeeds), and the
// releaser's late writes are claim_lost.
func TestRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	task := hbTask(t, b, "release", "w1", 1, 30)
	tokens := []string{task.Claim.DeliveryID}
	for i, next := range []string{"w2", "w3"} {
		released, err := b.client.Release(ctx, task.ID, tokens[i], "shutting down")
		if err != nil || released.Status != "scheduled" {
			t.Fatalf("release %d: %+v, %v", i, released.Status, err)
		}
		got, ok, err := b.client.ClaimNext(ctx, "release", next, 5*time.Second, api.WithHeartbeat(30))
		if err != nil || !ok || got.ID != task.ID {
			t.Fatalf("claim after release %d: %v %v %v", i, got.ID, ok, err)
		}
		tokens = append(tokens, got.Claim.DeliveryID)
		lateWrites(t, b, task.ID, tokens[i])
	}
	done, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: tokens[2], Success: true, Summary: "third time"})
	if err != nil || done.Status != "succeeded" {
		t.Fatalf("result: %+v, %v", done.Status, err)
	}
	if done.Attempt != 3 || done.MaxAttempts != 1 || len(done.Attempts) != 3 || done.Attempts[0].Outcome != "released" ||
		done.Attempts[0].Error != "shutting down" || done.Attempts[1].ExecutorID != "w2" || done.Attempts[2].Outcome != "succeeded" {
		t.Fatalf("attempts of the released task: %+v", done.Attempts)
	}
	if n := len(lostEvents(t, b, task.ID)); n != 2 {
		t.Fatalf("%d ClaimLost events, want 2", n)
	}
	a := rawDo(t, b, http.MethodPost, "/v1/tasks/"+task.ID+"/release", `{"deliveryId":"`+tokens[2]+`"}`)
	requireErrorBody(t, a, http.StatusConflict, "conflict")
}

func fmt2(err error) string {
	if err == nil {
		return "200"
	}
	return err.Error()
}

// TestHeartbeatRacesExpiry heartbeats several claims in a tight loop
// across the moment their heartbeat falls due, then stops: however each
// race went, a claim is lost exactly once, never before one interval
// after the claim (the log's due time) nor one after a renewal that was
// answered, and once a heartbeat hears claim_lost no later one is
// answered.
func TestHeartbeatRacesExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const tasks = 4
	var wg sync.WaitGroup
	errs := make(chan error, tasks)
	for i := range tasks {
		task := hbTask(t, b, "hb-race", "w1", 2, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			token := task.Claim.DeliveryID
			// From just before the log's due time to well after it.
			time.Sleep(time.Until(task.StartedAt.Add(time.Second - time.Duration(10*i)*time.Millisecond)))
			var lastOK time.Time
			lostSeen := false
			for until := time.Now().Add(300 * time.Millisecond); time.Now().Before(until); {
				sent := time.Now()
				_, err := b.client.Heartbeat(ctx, task.ID, token)
				switch {
				case err == nil && lostSeen:
					errs <- errors.New("a heartbeat was answered after one heard claim_lost")
					return
				case err == nil:
					lastOK = sent
				case errors.Is(err, api.ErrClaimLost):
					lostSeen = true
				default:
					errs <- err
					return
				}
			}
			for deadline := time.Now().Add(30 * time.Second); ; {
				if got, err := b.client.Get(ctx, task.ID); err == nil && (got.Claim == nil || got.Claim.DeliveryID != token) {
					break
				}
				if time.Now().After(deadline) {
					errs <- errors.New("claim of " + task.ID + " never lost")
					return
				}
				time.Sleep(50 * time.Millisecond) // polling the claim's end, bounded above
			}
			if _, err := b.client.Heartbeat(ctx, task.ID, token); !errors.Is(err, api.ErrClaimLost) {
				errs <- errors.New("a heartbeat after the loss answered " + fmt2(err))
				return
			}
			lost := lostEvents(t, b, task.ID)
			switch {
			case len(lost) != 1:
				errs <- errors.New("want one ClaimLost of " + task.ID)
			case lost[0].At.Before(task.StartedAt.Add(time.Second)):
				errs <- errors.New("claim lost before its heartbeat was due")
			case !lastOK.IsZero() && !lostSeen && lost[0].At.Before(lastOK.Add(time.Second-50*time.Millisecond)):
				errs <- errors.New("claim lost within an interval of an answered renewal it did not race")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestHeartbeatTwoSchedulers runs two schedulers on one stream, each with
// its own projections and alarm: a claim made through one and renewed
// only through the other is held (every process renews its projections
// with the renewals the others announce), and lost once the renewals
// stop.
func TestHeartbeatTwoSchedulers(t *testing.T) {
	t.Parallel()
	a := setup(t)
	st := a.node.Store
	ns := testnats.Namespace{Stream: st.Config().Stream, ReadyStream: events.ReadyStreamName(st.Config().Stream), Subjects: st.Subjects()}
	b := testnode.Start(t, testnode.On(nil, ns))
	ctx := context.Background()
	task := hbTask(t, a, "hb-two", "w1", 2, 1)
	token := task.Claim.DeliveryID
	for until := time.Now().Add(3 * time.Second); time.Now().Before(until); {
		if _, err := b.Client.Heartbeat(ctx, task.ID, token); err != nil {
			t.Fatalf("heartbeat through the other scheduler: %v", err)
		}
		time.Sleep(250 * time.Millisecond) // the executor's heartbeat period, not a synchronisation
	}
	if got, _ := a.client.Get(ctx, task.ID); got.Status != "running" || len(lostEvents(t, a, task.ID)) != 0 {
		t.Fatalf("a claim renewed through the other scheduler: %s, history %v", got.Status, historyTypes(t, a, task.ID))
	}
	a.waitStatus(t, task.ID, "queued")
	if n := len(lostEvents(t, a, task.ID)); n != 1 {
		t.Fatalf("%d ClaimLost events once the renewals stopped, want 1", n)
	}
}
