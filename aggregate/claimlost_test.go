package aggregate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

const hb = 5 // the heartbeat interval of the claims below, in seconds

// Histories with a heartbeat claim, with and without a retry policy.
var (
	beating     = with(queued, ev(claimedAt, events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline, HeartbeatSeconds: hb}))
	hbDue       = claimedAt.Add(hb * time.Second)
	lostFinal   = with(beating, ev(hbDue, events.ClaimLost{DeliveryID: d1, ExecutorID: exec1, Reason: events.ClaimLostHeartbeat}))
	hbRetrySpec = func() events.TaskSpec {
		s := spec()
		s.Retry = &events.RetryPolicy{MaxAttempts: 2, On: []string{events.RetryOnFailed}}
		return s
	}()
	retryQueue = []events.Event{
		ev(t0, events.TaskScheduled{Spec: hbRetrySpec}),
		ev(runAt, events.DeliveryPending{DeliveryID: d1, Attempt: 1, NextAt: runAt}),
		ev(runAt, events.ReadyPublished{DeliveryID: d1}),
	}
	retryBeating = with(retryQueue, ev(claimedAt, events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline, HeartbeatSeconds: hb}))
	lostRetried  = with(retryBeating, ev(hbDue, events.ClaimLost{DeliveryID: d1, ExecutorID: exec1, Reason: events.ClaimLostHeartbeat, Attempt: 2}))
	releasedOnce = with(beating, ev(hbDue, events.ClaimLost{DeliveryID: d1, ExecutorID: exec1, Reason: events.ClaimLostReleased, Note: "bye", Attempt: 2}))
)

func TestDecideClaimLost(t *testing.T) {
	t.Parallel()
	runDecide(t, []decideCase{
		{name: "ClaimWithHeartbeat", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1, HeartbeatSeconds: hb}, now: claimedAt,
			want: []events.Payload{events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline, HeartbeatSeconds: hb}}, wantStatus: aggregate.StatusRunning},
		{name: "HeartbeatTooLong", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1, HeartbeatSeconds: events.MaxHeartbeatSeconds + 1}, now: claimedAt, wantErr: aggregate.ErrInvalid},
		{name: "ClaimExpectingItsTenant", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1, CustomerID: custID, Queue: spec().Queue}, now: claimedAt,
			want: []events.Payload{events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline}}, wantStatus: aggregate.StatusRunning},
		{name: "ClaimForAnotherCustomer", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1, CustomerID: "cust-2"}, now: claimedAt, wantErr: aggregate.ErrWrongTenant},
		{name: "ClaimOnAnotherQueue", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1, Queue: "elsewhere"}, now: claimedAt, wantErr: aggregate.ErrWrongTenant},
		{name: "CancelForAncestorOfAnotherCustomer", given: queued, cmd: aggregate.CancelForAncestor{DeliveryID: d1, CustomerID: "cust-2"}, now: claimedAt, wantErr: aggregate.ErrWrongTenant},
		{name: "CancelForAncestorOnAnotherQueue", given: queued, cmd: aggregate.CancelForAncestor{DeliveryID: d1, Queue: "elsewhere"}, now: claimedAt, wantErr: aggregate.ErrWrongTenant},
		{name: "HeartbeatNegative", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1, HeartbeatSeconds: -1}, now: claimedAt, wantErr: aggregate.ErrInvalid},
		{name: "MissedWithoutAttemptsTimesOut", given: beating, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostHeartbeat}, now: hbDue,
			want: []events.Payload{events.ClaimLost{DeliveryID: d1, ExecutorID: exec1, Reason: events.ClaimLostHeartbeat}}, wantStatus: aggregate.StatusTimedOut},
		{name: "MissedWithAnAttemptLeftRetries", given: retryBeating, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostHeartbeat}, now: hbDue,
			want: []events.Payload{events.ClaimLost{DeliveryID: d1, ExecutorID: exec1, Reason: events.ClaimLostHeartbeat, Attempt: 2}}, wantStatus: aggregate.StatusScheduled},
		{name: "NotMissedBeforeOneInterval", given: beating, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostHeartbeat}, now: hbDue.Add(-time.Nanosecond), wantErr: aggregate.ErrStale},
		{name: "NoHeartbeatNothingMissed", given: running, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostHeartbeat}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReleaseIsFree", given: beating, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostReleased, Note: "bye"}, now: claimedAt,
			want: []events.Payload{events.ClaimLost{DeliveryID: d1, ExecutorID: exec1, Reason: events.ClaimLostReleased, Note: "bye", Attempt: 2}}, wantStatus: aggregate.StatusScheduled},
		{name: "ReleaseWithoutHeartbeat", given: running, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostReleased}, now: claimedAt,
			want: []events.Payload{events.ClaimLost{DeliveryID: d1, ExecutorID: exec1, Reason: events.ClaimLostReleased, Attempt: 2}}, wantStatus: aggregate.StatusScheduled},
		{name: "ReleaseNoteTooLong", given: beating, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostReleased, Note: strings.Repeat("n", events.MaxReasonBytes+1)}, now: claimedAt, wantErr: aggregate.ErrInvalid},
		{name: "UnknownReason", given: beating, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: "bored"}, now: claimedAt, wantErr: aggregate.ErrInvalid},
		{name: "ReleaseOtherToken", given: beating, cmd: aggregate.LoseClaim{DeliveryID: d2, Reason: events.ClaimLostReleased}, now: claimedAt, wantErr: aggregate.ErrTokenMismatch},
		{name: "ReleaseQueued", given: queued, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostReleased}, now: claimedAt, wantErr: aggregate.ErrTokenMismatch},
		{name: "LateResultAfterRetry", given: lostRetried, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, now: later, wantErr: aggregate.ErrClaimLost},
		{name: "LateResultAfterTimeOut", given: lostFinal, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, now: later, wantErr: aggregate.ErrClaimLost},
		{name: "LateEffectsAfterRelease", given: releasedOnce, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{{Kind: "comment"}}}, now: later, wantErr: aggregate.ErrClaimLost},
		{name: "LateReleaseAfterLoss", given: lostRetried, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostReleased}, now: later, wantErr: aggregate.ErrClaimLost},
		{name: "RacingHeartbeatAfterRelease", given: releasedOnce, cmd: aggregate.LoseClaim{DeliveryID: d1, Reason: events.ClaimLostHeartbeat}, now: later, wantErr: aggregate.ErrClaimLost},
		{name: "TimeOutAfterLossIsStale", given: lostRetried, cmd: aggregate.TimeOut{}, now: later, wantErr: aggregate.ErrStale},
	})
}

// TestApplyClaimLost: a lost claim is an attempt of the task's history,
// the task is released again with a new token, and a release is not
// charged against the retry policy.
func TestApplyClaimLost(t *testing.T) {
	t.Parallel()
	s := replay(releasedOnce)
	if s.Status != aggregate.StatusScheduled || s.Claim != (aggregate.Owner{}) || !s.DueAt().Equal(hbDue) {
		t.Fatalf("after a release: %+v", s)
	}
	if s.Attempt() != 2 || s.Charged() != 1 || !s.LostClaim(d1) || s.LostClaim(d2) {
		t.Fatalf("attempt %d charged %d, lost d1 %v", s.Attempt(), s.Charged(), s.LostClaim(d1))
	}
	if a := s.Attempts(); len(a) != 1 || a[0].Outcome != aggregate.OutcomeReleased || a[0].ExecutorID != exec1 || a[0].Error != "bye" {
		t.Fatalf("attempts %+v", a)
	}
	got, err := aggregate.Decide(s, aggregate.ReleaseDue{DeliveryID: d2}, hbDue)
	if err != nil || len(got) != 1 {
		t.Fatalf("release after the loss: %v %v", got, err)
	}
	if _, err := aggregate.Decide(s, aggregate.ReleaseDue{DeliveryID: d1}, hbDue); err == nil {
		t.Fatalf("the lost token was released again")
	}
	if f := replay(lostFinal); f.Status != aggregate.StatusTimedOut || f.Reason != aggregate.ReasonHeartbeat || !f.LostClaim(d1) {
		t.Fatalf("final loss: %+v", f)
	}
	if r := replay(lostRetried); r.Charged() != 2 || r.Attempts()[0].Outcome != aggregate.OutcomeClaimLost {
		t.Fatalf("a missed heartbeat is charged: %+v", r)
	}
}
