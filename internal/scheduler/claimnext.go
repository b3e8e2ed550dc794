package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/crashpoint"
)

// MaxWait is the longest long poll of ClaimNext.
const MaxWait = api.MaxWaitSeconds * time.Second

// consumers caches one durable pull consumer per queue on the ready
// stream; every claimer of a queue, in any process, shares it.
type consumers struct {
	mu sync.Mutex
	m  map[string]jetstream.Consumer
}

func (s *Service) consumer(ctx context.Context, queue string) (jetstream.Consumer, error) {
	s.consumers.mu.Lock()
	defer s.consumers.mu.Unlock()
	if c, ok := s.consumers.m[queue]; ok {
		return c, nil
	}
	c, err := s.cfg.JS.CreateOrUpdateConsumer(ctx, s.cfg.ReadyStream, executor.ReadyConsumerConfig(s.cfg.Subjects, queue, s.cfg.AckWait))
	if err != nil {
		return nil, fmt.Errorf("ready consumer for %s: %w", queue, err)
	}
	s.consumers.m[queue] = c
	return c, nil
}

// ClaimNext waits up to wait for a ready notification on queue and claims
// its task for executorID. ok is false when nothing could be claimed in
// time. Notifications are at-least-once: one whose token is stale (the
// task was claimed, canceled or re-released) is dropped and the wait goes
// on. A customer principal claims only its own tasks; others' stay queued.
func (s *Service) ClaimNext(ctx context.Context, p Principal, queue, executorID string, wait time.Duration) (st aggregate.State, ok bool, err error) {
	if err := validIDs("queue", queue, "executorId", executorID); err != nil {
		return st, false, err
	}
	wait = min(max(wait, 0), MaxWait)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)()
	cons, err := s.consumer(ctx, queue)
	if err != nil {
		return st, false, s.unavailable(err)
	}
	deadline := time.Now().Add(wait)
	for {
		// Fetch is not context-aware, so wait in slices of at most
		// fetchSlice and look at ctx in between: a gone client or a
		// shutdown ends the poll within a slice, and no pulled
		// notification is ever abandoned unacknowledged.
		remaining := time.Until(deadline)
		var batch jetstream.MessageBatch
		if remaining < 10*time.Millisecond {
			batch, err = cons.FetchNoWait(1)
		} else {
			batch, err = cons.Fetch(1, jetstream.FetchMaxWait(min(remaining, fetchSlice)))
		}
		if err != nil {
			return st, false, s.unavailable(err)
		}
		for msg := range batch.Messages() {
			st, ok, err = s.claimNotified(ctx, p, msg, executorID)
			if ok || err != nil {
				return st, ok, err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			return st, false, s.unavailable(err)
		}
		if ctx.Err() != nil || time.Until(deadline) <= 0 {
			return st, false, nil
		}
	}
}

// fetchSlice is the longest single pull of a long poll.
const fetchSlice = time.Second

// foreignNakDelay is how long a ready notification that a customer's
// claims/next passed over (another customer's task on a shared queue)
// stays out of sight before it is offered again.
const foreignNakDelay = 100 * time.Millisecond

func (s *Service) claimNotified(ctx context.Context, p Principal, msg jetstream.Msg, executorID string) (aggregate.State, bool, error) {
	var n events.ReadyNotification
	if err := json.Unmarshal(msg.Data(), &n); err != nil || events.ValidID(n.TaskID) != nil {
		s.cfg.Logger.Error().Err(err).Msg("claims/next: malformed ready notification dropped")
		msg.Term()
		return aggregate.State{}, false, nil
	}
	if !p.IsOperator() && n.CustomerID != p.CustomerID {
		// Not this principal's: leave it for a claimer who may take it.
		// A plain Nak would hand it straight back to this same poll,
		// which would spin on it until its deadline.
		msg.NakWithDelay(foreignNakDelay)
		return aggregate.State{}, false, nil
	}
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
