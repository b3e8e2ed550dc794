package scheduler

import (
	"context"
	"fmt"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// ClaimOption is a per-call choice of a claim (service.ClaimOption).
type ClaimOption = service.ClaimOption

// Renewal is the answer to a heartbeat (service.Renewal).
type Renewal = service.Renewal

// claimOf returns the claim (without its token) that executorID makes
// with opts, checking the ids (queue only when not "") and the heartbeat
// interval before any wait.
func claimOf(queue, executorID string, opts []ClaimOption) (aggregate.Claim, error) {
	if queue != "" {
		if err := validIDs("queue", queue); err != nil {
			return aggregate.Claim{}, err
		}
	}
	if err := validIDs("executorId", executorID); err != nil {
		return aggregate.Claim{}, err
	}
	hb := api.Claiming(opts).HeartbeatSeconds
	if hb != 0 && (hb < events.MinHeartbeatSeconds || hb > events.MaxHeartbeatSeconds) {
		return aggregate.Claim{}, invalid("heartbeatSeconds must be 0 (none) or %d..%d", events.MinHeartbeatSeconds, events.MaxHeartbeatSeconds)
	}
	return aggregate.Claim{ExecutorID: executorID, HeartbeatSeconds: hb}, nil
}

// Heartbeat renews the heartbeat of task id's claim under deliveryID
// (POST /v1/tasks/{id}/heartbeat): the claim is held until one interval
// from now, never past the running deadline. It appends nothing: the
// renewal lives in the projections (projections.Engine.Renew; this
// process's, and the others' through Config.Renewed), and only a missed
// heartbeat is an event (ClaimLost, by the alarm). A
// heartbeat racing the alarm's ClaimLost may be answered and the claim
// still be lost; the next heartbeat or write then hears it. Errors:
// aggregate.ErrNotFound (no such task for p), ErrClaimLost (the claim
// under deliveryID was lost or released), ErrTerminal, ErrTokenMismatch
// (not running under deliveryID), ErrInvalid (a claim without
// heartbeats), ErrUnavailable.
func (s *claims) Heartbeat(ctx context.Context, p Principal, id, deliveryID string) (Renewal, error) {
	if err := validIDs("task id", id, "deliveryId", deliveryID); err != nil {
		return Renewal{}, err
	}
	if err := s.authorize(ctx, p, id); err != nil {
		return Renewal{}, err
	}
	for range 2 { // the views may not show the claim yet: ask the log, wait for them once
		if exp, ok := s.views.Renew(id, deliveryID, s.store.Now()); ok {
			if s.renewed != nil {
				s.renewed(id, deliveryID)
			}
			st, _ := s.applied.Task(id)
			return Renewal{ExpiresAt: exp, Deadline: st.Deadline}, nil
		}
		st, err := s.get(ctx, p, id)
		if err != nil {
			return Renewal{}, err
		}
		if err := heldWithHeartbeat(st, deliveryID); err != nil {
			return Renewal{}, err
		}
		if err := s.waitApplied(ctx, st.LastSeq); err != nil {
			return Renewal{}, err
		}
	}
	return Renewal{}, s.unavailable(fmt.Errorf("the projections do not show task %s's claim", id))
}

// heldWithHeartbeat says why st is not running under deliveryID with
// heartbeats, nil when it is.
func heldWithHeartbeat(st aggregate.State, deliveryID string) error {
	if err := runningUnder(st, deliveryID); err != nil {
		return err
	}
	if st.Claim.HeartbeatSeconds == 0 {
		return invalid("the claim of task %s has no heartbeat (claim with heartbeatSeconds)", st.TaskID)
	}
	return nil
}

// Release hands task id's claim under deliveryID back at once (POST
// /v1/tasks/{id}/release), reason saying why (at most
// events.MaxReasonBytes): ClaimLost with reason released, and the task
// is released again with a new token, claimable by any executor. The
// attempt is recorded but not charged against the retry policy (up to
// events.MaxFreeReleases releases of a task). Errors as Heartbeat's, and
// ErrInvalid for a reason too long.
func (s *claims) Release(ctx context.Context, p Principal, id, deliveryID, reason string) (aggregate.State, error) {
	if err := validIDs("deliveryId", deliveryID); err != nil {
		return aggregate.State{}, err
	}
	return s.execute(ctx, p, id, "", aggregate.LoseClaim{DeliveryID: deliveryID, Reason: events.ClaimLostReleased, Note: reason}, nil)
}
