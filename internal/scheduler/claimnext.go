package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/crashpoint"
)

// MaxWait is the longest long poll of ClaimNext.
const MaxWait = api.MaxWaitSeconds * time.Second

// dispatchers holds one dispatcher per queue, each on the queue's durable
// pull consumer of the ready stream, which every claimer of the queue in
// any process shares.
type dispatchers struct {
	mu sync.Mutex
	m  map[string]*dispatcher
}

func (s *Service) dispatcher(ctx context.Context, queue string) (*dispatcher, error) {
	s.dispatchers.mu.Lock()
	defer s.dispatchers.mu.Unlock()
	if d, ok := s.dispatchers.m[queue]; ok {
		return d, nil
	}
	c, err := s.cfg.JS.CreateOrUpdateConsumer(ctx, s.cfg.ReadyStream, executor.ReadyConsumerConfig(s.cfg.Subjects, queue, s.cfg.AckWait))
	if err != nil {
		return nil, fmt.Errorf("ready consumer for %s: %w", queue, err)
	}
	d := newDispatcher(c, s.cfg.Logger)
	s.dispatchers.m[queue] = d
	return d, nil
}

// Waiting returns how many claimers wait on queue in this process.
func (s *Service) Waiting(queue string) int {
	s.dispatchers.mu.Lock()
	d := s.dispatchers.m[queue]
	s.dispatchers.mu.Unlock()
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiters.Len()
}

// minWait is the shortest long poll: enough for one pull to find a
// notification that is already there.
const minWait = 20 * time.Millisecond

// ClaimNext waits up to wait (at least minWait, at most MaxWait) for a
// ready notification on queue and claims its task for executorID. ok is
// false when nothing could be claimed in time. Notifications are
// at-least-once: one whose token is stale (the task was claimed, canceled
// or re-released) is dropped and the wait goes on. A customer principal
// claims only its own tasks; others' stay queued. Service.Close ends the
// wait at once.
func (s *Service) ClaimNext(ctx context.Context, p Principal, queue, executorID string, wait time.Duration) (st aggregate.State, ok bool, err error) {
	if err := validIDs("queue", queue, "executorId", executorID); err != nil {
		return st, false, err
	}
	d, err := s.dispatcher(ctx, queue)
	if err != nil {
		return st, false, s.unavailable(err)
	}
	// The deadline and shutdown end the wait, never a claim under way:
	// that runs on the caller's ctx until its answer.
	waitCtx, cancel := context.WithTimeout(ctx, min(max(wait, minWait), MaxWait))
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)()
	for {
		msg, n, err := d.next(waitCtx, p.customerFilter())
		switch {
		case err != nil && waitCtx.Err() != nil:
			return st, false, nil // waited in vain
		case err != nil:
			return st, false, s.unavailable(err)
		}
		if st, ok, err = s.claimNotified(ctx, msg, n, executorID); ok || err != nil {
			return st, ok, err
		}
	}
}

// claimNotified claims the task of notification n for executorID and
// settles msg: acknowledged once claimed or stale, handed back when the
// log could not answer.
func (s *Service) claimNotified(ctx context.Context, msg jetstream.Msg, n events.ReadyNotification, executorID string) (aggregate.State, bool, error) {
	crashpoint.Hit(crashpoint.ClaimReceived)
	st, _, err := s.cfg.Store.Execute(ctx, n.TaskID, executorID, aggregate.Claim{DeliveryID: n.DeliveryID, ExecutorID: executorID})
	switch {
	case err == nil:
		crashpoint.Hit(crashpoint.Claimed)
		msg.Ack()
		return st, true, s.settle(ctx, st)
	case errors.Is(err, aggregate.ErrNotClaimable), errors.Is(err, aggregate.ErrTokenMismatch), errors.Is(err, aggregate.ErrNotFound):
		msg.Ack() // stale notification: the task moved on
		return st, false, nil
	default:
		msg.Nak()
		return st, false, s.unavailable(err)
	}
}
