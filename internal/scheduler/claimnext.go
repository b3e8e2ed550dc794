package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/internal/delivery"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/internal/service"
)

// MaxWait is the longest long poll of ClaimNext (service.MaxWait).
const MaxWait = service.MaxWait

// claims is the part of the service that hands tasks to executors and
// takes their answers: claims/next and batch claims (POST
// /v1/claims/next, POST /v1/claims), a claim by delivery (POST
// /v1/tasks/{id}/claim), results (POST /v1/tasks/{id}/result, POST
// /v1/results) and effects (POST /v1/tasks/{id}/effects). It is safe for
// concurrent use.
type claims struct {
	*core
	views    ClaimViews
	delivery claimQueue
	maxPolls int // Limits.MaxPollsPerCustomer
	polls    polls
	claiming claiming

	// renewed is Config.Renewed; nil: none.
	renewed func(taskID, deliveryID string)
	// wrongTenant counts the notifications dropped because the task they
	// name is not the caller's, or not on the queue claimed on
	// (Metrics.WrongTenantClaims); logger logs each.
	wrongTenant interface{ Inc() }
	logger      zerolog.Logger
	// repeats logs the claims that pass over a quarantined task, each
	// task once an interval.
	repeats *ratelog.Limiter
}

// claimQueue is the ready queue as claims use it (Config.Delivery).
type claimQueue interface {
	Dispatcher(ctx context.Context, queue string) (*delivery.Dispatcher, error)
	Drop(ctx context.Context, st aggregate.State)
	Waiting(queue string) int
}

// ClaimViews is what claims/next and batch claims read from the
// projections, besides Applied: which queues exist and a customer's
// queued tasks. Its methods are safe for concurrent use.
type ClaimViews interface {
	// HasQueue reports whether a task was ever scheduled on queue.
	HasQueue(queue string) bool
	// Queued returns up to limit of customerID's queued tasks on queue,
	// published longest ago first, skipping those skip reports.
	Queued(customerID, queue string, limit int, skip func(taskID string) bool) []aggregate.State
	// QueuedSignal is closed once a task of customerID is queued on queue.
	QueuedSignal(customerID, queue string) <-chan struct{}
	// Renew renews the heartbeat of a task's claim under deliveryID at
	// now and returns when the claim expires; false when the views do
	// not show the task running under it with heartbeats.
	Renew(taskID, deliveryID string, now time.Time) (time.Time, bool)
	// TerminalAncestor returns the nearest ancestor of a task that has
	// ended, as far as the views hold them; found is false for none.
	TerminalAncestor(id string) (ancestorID string, status aggregate.Status, found bool)
}

// claim claims the task taskID with c (its delivery and executor), as
// store.Execute does, unless an ancestor of the task has
// ended: then it records the task canceled instead (reason
// ancestor_terminal, by the scheduler) and fails with an error wrapping
// ErrAncestorTerminal, the state and events being the cancel's. A
// lineage so ends lazily, task by task, at its next claim; a claim that
// raced the ancestor's end and won runs, and its stop check tells it to
// stop. The cancel expects c's customer and queue as the claim does, so a
// claim of another tenant's task (a forged notification) writes nothing
// and fails with aggregate.ErrWrongTenant either way.
func (s *claims) claim(ctx context.Context, taskID string, c aggregate.Claim) (aggregate.State, []events.Event, error) {
	id, status, found := s.views.TerminalAncestor(taskID)
	if !found {
		return s.store.Execute(ctx, taskID, c.ExecutorID, c)
	}
	st, evs, err := s.store.Execute(ctx, taskID, "", aggregate.CancelForAncestor{DeliveryID: c.DeliveryID, CustomerID: c.CustomerID, Queue: c.Queue})
	if err != nil {
		return st, evs, err
	}
	return st, evs, fmt.Errorf("%w: %s, an ancestor of task %s, is %s: the claim canceled it", ErrAncestorTerminal, id, taskID, status)
}

// unknownQueuePoll is how often a claimer on a queue nobody scheduled a
// task on looks again whether one was.
const unknownQueuePoll = 100 * time.Millisecond

// poll begins a long poll of p on queue for up to wait (at least minWait,
// at most MaxWait): it takes one of p's long-poll slots and, once a task
// was scheduled on queue (a claimer on a queue that never had one waits
// without creating anything for it), the queue's dispatcher. The wait's
// deadline and Service.Close end waitCtx; end releases the slot. d is nil
// (and there is nothing to end) when the wait ended before the queue had a
// task.
func (s *claims) poll(ctx context.Context, p Principal, queue string, wait time.Duration) (d *delivery.Dispatcher, waitCtx context.Context, end func(), err error) {
	leave, err := s.holdPoll(p)
	if err != nil {
		return nil, nil, nil, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, min(max(wait, minWait), MaxWait))
	stop := context.AfterFunc(s.closing, cancel)
	end = func() { stop(); cancel(); leave() }
	if !s.awaitQueue(waitCtx, queue) {
		end()
		return nil, nil, nil, nil
	}
	if d, err = s.delivery.Dispatcher(ctx, queue); err != nil {
		end()
		return nil, nil, nil, s.unavailable(err)
	}
	return d, waitCtx, end, nil
}

// awaitQueue waits until the projections know a task scheduled on queue,
// and reports false if ctx ended first.
func (s *claims) awaitQueue(ctx context.Context, queue string) bool {
	if s.views.HasQueue(queue) {
		return true
	}
	tick := time.NewTicker(unknownQueuePoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
			if s.views.HasQueue(queue) {
				return true
			}
		}
	}
}

// polls counts each customer's long polls in progress.
type polls struct {
	mu sync.Mutex
	n  map[string]int
}

// holdPoll takes one of p's MaxPollsPerCustomer long-poll slots and
// returns its release; past the limit it fails with ErrTooManyPolls. An
// operator's polls are not limited.
func (s *claims) holdPoll(p Principal) (func(), error) {
	limit := s.maxPolls
	if p.IsOperator() || limit < 0 {
		return func() {}, nil
	}
	s.polls.mu.Lock()
	defer s.polls.mu.Unlock()
	if s.polls.n[p.CustomerID] >= limit {
		return nil, fmt.Errorf("%w: customer %s holds %d long polls, at most %d", ErrTooManyPolls, p.CustomerID, limit, limit)
	}
	s.polls.n[p.CustomerID]++
	return func() {
		s.polls.mu.Lock()
		defer s.polls.mu.Unlock()
		if s.polls.n[p.CustomerID]--; s.polls.n[p.CustomerID] == 0 {
			delete(s.polls.n, p.CustomerID)
		}
	}, nil
}

// Waiting returns how many claimers wait on queue in this process, or on
// every queue for "".
func (s *claims) Waiting(queue string) int { return s.delivery.Waiting(queue) }

// minWait is the shortest long poll: enough for one pull to find a
// notification that is already there.
const minWait = 20 * time.Millisecond

// ClaimNext waits up to wait (at least minWait, at most MaxWait) for a
// ready notification on queue and claims its task for executorID. ok is
// false when nothing could be claimed in time. Notifications are
// at-least-once: one whose token is stale (the task was claimed, canceled
// or re-released) is dropped and the wait goes on. A customer principal
// claims only its own tasks, its queued ones straight from the
// projections first (claimQueued), so it never waits behind others'
// notifications. Service.Close ends the wait at once. A customer holding
// MaxPollsPerCustomer polls already gets ErrTooManyPolls; a poll on a
// queue no task was scheduled on waits without creating anything for the
// queue. opts may give the claim heartbeats (service.WithHeartbeat); a
// heartbeat interval out of bounds is ErrInvalid before any wait.
func (s *claims) ClaimNext(ctx context.Context, p Principal, queue, executorID string, wait time.Duration, opts ...ClaimOption) (st aggregate.State, ok bool, err error) {
	c, err := claimOf(queue, executorID, opts)
	if err != nil {
		return st, false, err
	}
	got, err := s.claimWaiting(ctx, p, queue, c, 1, 0, wait)
	if len(got) == 0 {
		return st, false, err
	}
	return got[0], true, nil
}

// claimWaiting waits up to wait for tasks of queue p may claim and claims
// up to max of them with c (its DeliveryID set for each): from the first notifications that
// arrive (collecting more for linger), or, for a customer, straight from
// the projections (see claimQueued), whichever comes first. The deadline
// and shutdown end the wait, never a claim under way: that runs on the
// caller's ctx until its answer. It fails only when nothing was claimed.
func (s *claims) claimWaiting(ctx context.Context, p Principal, queue string, c aggregate.Claim, max int, linger, wait time.Duration) ([]aggregate.State, error) {
	d, waitCtx, end, err := s.poll(ctx, p, queue, wait)
	if err != nil || d == nil {
		return nil, err
	}
	defer end()
	for {
		takeCtx, cancel := waitCtx, context.CancelFunc(func() {})
		if !p.IsOperator() {
			// Watch for the customer's next queued task before looking,
			// so none slips between the look and the wait.
			sig := s.views.QueuedSignal(p.CustomerID, queue)
			if got, err := s.claimQueued(ctx, p, queue, c, max); len(got) > 0 || err != nil {
				return got, err
			}
			takeCtx, cancel = untilClosed(waitCtx, sig)
		}
		offers, err := d.Take(takeCtx, p.Scope(), max, linger)
		cancel()
		switch {
		case err != nil && waitCtx.Err() != nil:
			return nil, nil // waited in vain
		case errors.Is(err, context.Canceled):
			continue // the customer has a task queued: claim it
		case err != nil:
			return nil, s.unavailable(err)
		}
		claimed := make([]aggregate.State, len(offers))
		errs := make([]error, len(offers))
		ok := make([]bool, len(offers))
		inParallel(len(offers), func(i int) {
			claimed[i], ok[i], errs[i] = s.claimNotified(ctx, p, queue, offers[i].Msg, offers[i].Note, c)
		})
		out := claimed[:0] // in place: a State is ~750 bytes
		for i, st := range claimed {
			if ok[i] {
				out = append(out, st)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
}

// claimQueued claims up to max of customer p's queued tasks on queue
// straight from the projections, those published longest ago first, with
// their current tokens: a customer's claim never waits behind other
// customers' notifications on a shared queue. Tasks another claim of this
// process is trying are passed over; one that moved on meanwhile is
// skipped. Each claimed task's notification is deleted from the ready
// stream (it would only be stale). It fails only when nothing was claimed
// and the log could not answer.
func (s *claims) claimQueued(ctx context.Context, p Principal, queue string, c aggregate.Claim, max int) ([]aggregate.State, error) {
	cands := s.claiming.reserve(func(skip func(string) bool) []aggregate.State {
		return s.views.Queued(p.CustomerID, queue, max, skip)
	})
	defer s.claiming.release(cands)
	claimed := make([]aggregate.State, len(cands))
	errs := make([]error, len(cands))
	inParallel(len(cands), func(i int) {
		crashpoint.Hit(crashpoint.ClaimReceived)
		c := c
		c.DeliveryID, c.CustomerID, c.Queue = cands[i].Delivery.ID, p.CustomerID, queue
		st, evs, err := s.claim(ctx, cands[i].TaskID, c)
		switch {
		case err == nil:
			crashpoint.Hit(crashpoint.Claimed)
			s.delivery.Drop(ctx, st)
			claimed[i], errs[i] = st, s.settle(ctx, st, evs, nil)
		case errors.Is(err, ErrAncestorTerminal): // canceled instead: pass it over
			s.delivery.Drop(ctx, cands[i])
			if err := s.settle(ctx, st, evs, nil); err != nil {
				errs[i] = err
			}
		case errors.Is(err, aggregate.ErrWrongTenant): // the views disagree with the log: pass it over
			s.refused(p, queue, cands[i].TaskID, err)
		case isCorrupt(err): // quarantined: pass it over, now and later
			s.claiming.quarantine(cands[i].TaskID)
			s.skippedCorrupt(cands[i].TaskID, err)
		case !errors.Is(err, aggregate.ErrNotClaimable) && !errors.Is(err, aggregate.ErrTokenMismatch) && !errors.Is(err, aggregate.ErrNotFound):
			errs[i] = s.unavailable(err)
		}
	})
	out := slices.DeleteFunc(claimed, func(st aggregate.State) bool { return !st.Exists() })
	if len(out) > 0 {
		return out, nil
	}
	return nil, errors.Join(errs...)
}

// skippedCorrupt logs a claim that passed over task id, which holds a
// message of the log that does not decode (err), once an interval.
func (s *claims) skippedCorrupt(id string, err error) {
	s.repeats.Log(zerolog.WarnLevel, "claim skip corrupt task "+id,
		"claim skipped: the task holds a message of the log that does not decode (quarantined)",
		func(e *zerolog.Event) { e.Err(err).Str("task", id) })
}

// maxCorruptTasks bounds claiming.corrupt: past it a quarantined task is
// tried (and passed over) again at each claim that finds it first.
const maxCorruptTasks = 1024

// claiming holds the tasks this process's claimQueued calls are trying,
// and the queued tasks a claim found quarantined (corrupt), which no
// later claim tries again: they would come first in every listing of
// their queue and never be claimed.
type claiming struct {
	mu      sync.Mutex
	ids     map[string]struct{}
	corrupt map[string]struct{}
}

// quarantine records that task id cannot be claimed, ever: it holds a
// message of the log that does not decode. At most maxCorruptTasks are
// kept.
func (c *claiming) quarantine(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corrupt == nil {
		c.corrupt = make(map[string]struct{})
	}
	if len(c.corrupt) < maxCorruptTasks {
		c.corrupt[id] = struct{}{}
	}
}

// reserve returns the candidates list gives when it passes over those
// already reserved or quarantined, now reserved; one lock covers both,
// so two claims never pick the same task.
func (c *claiming) reserve(list func(skip func(taskID string) bool) []aggregate.State) []aggregate.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	cands := list(func(id string) bool {
		_, ok := c.ids[id]
		_, corrupt := c.corrupt[id]
		return ok || corrupt
	})
	for _, st := range cands {
		c.ids[st.TaskID] = struct{}{}
	}
	return cands
}

func (c *claiming) release(cands []aggregate.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range cands {
		delete(c.ids, st.TaskID)
	}
}

// untilClosed returns a context that ctx's end or the closing of sig
// cancels.
func untilClosed(ctx context.Context, sig <-chan struct{}) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-sig:
			cancel()
		case <-c.Done():
		}
	}()
	return c, cancel
}

// claimNotified claims the task of notification n for p, who claims on
// queue, with c and settles msg: acknowledged once claimed or stale,
// handed back when the log could not answer. msg is nil for a delivery
// handed off (see delivery.Offer): there is nothing to settle, and should
// the claim fail the alarm publishes the delivery after its grace.
//
// The notification is not trusted: the claim expects the task to be the
// caller's (a customer's; for an operator, the customer the notification
// names) and on queue, and the aggregate decides that on the log
// (aggregate.ErrWrongTenant). A notification that names a task of
// another customer or queue (a forged one) is logged, counted and
// terminated, so it is never redelivered, and the claimer waits on.
func (s *claims) claimNotified(ctx context.Context, p Principal, queue string, msg jetstream.Msg, n events.ReadyNotification, c aggregate.Claim) (aggregate.State, bool, error) {
	crashpoint.Hit(crashpoint.ClaimReceived)
	if ctx.Err() != nil { // the claimer is gone: leave the delivery to another
		settleMsg(msg, jetstream.Msg.Nak)
		return aggregate.State{}, false, nil
	}
	c.DeliveryID, c.CustomerID, c.Queue = n.DeliveryID, n.CustomerID, queue
	if !p.IsOperator() && n.CustomerID != p.CustomerID {
		// The dispatcher hands a customer only its own notifications.
		s.refused(p, queue, n.TaskID, fmt.Errorf("%w: the notification names customer %q", aggregate.ErrWrongTenant, n.CustomerID))
		settleMsg(msg, jetstream.Msg.Term)
		return aggregate.State{}, false, nil
	}
	// Not cut short by the claimer leaving: the claim's outcome is then
	// known, and one nobody will receive is handed back at once.
	st, evs, err := s.claim(context.WithoutCancel(ctx), n.TaskID, c)
	switch {
	case err == nil && ctx.Err() != nil:
		settleMsg(msg, jetstream.Msg.Ack)
		s.handBack(st, evs)
		return st, false, nil
	case err == nil:
		crashpoint.Hit(crashpoint.Claimed)
		settleMsg(msg, jetstream.Msg.Ack)
		return st, true, s.settle(ctx, st, evs, nil)
	case errors.Is(err, ErrAncestorTerminal): // canceled instead: wait on for another
		settleMsg(msg, jetstream.Msg.Ack)
		return st, false, s.settle(ctx, st, evs, nil)
	case errors.Is(err, aggregate.ErrWrongTenant):
		s.refused(p, queue, n.TaskID, err)
		settleMsg(msg, jetstream.Msg.Term)
		return aggregate.State{}, false, nil
	case isCorrupt(err): // the task cannot be read, now or later: wait on for another
		s.claiming.quarantine(n.TaskID)
		s.skippedCorrupt(n.TaskID, err)
		settleMsg(msg, jetstream.Msg.Term)
		return aggregate.State{}, false, nil
	case errors.Is(err, aggregate.ErrNotClaimable), errors.Is(err, aggregate.ErrTokenMismatch), errors.Is(err, aggregate.ErrNotFound):
		settleMsg(msg, jetstream.Msg.Ack) // stale notification: the task moved on
		return st, false, nil
	default:
		settleMsg(msg, jetstream.Msg.Nak)
		return st, false, s.unavailable(err)
	}
}

// refused logs and counts a claim of task taskID by p on queue that the
// task's customer or queue refused (aggregate.ErrWrongTenant).
func (s *claims) refused(p Principal, queue, taskID string, err error) {
	s.wrongTenant.Inc()
	s.logger.Warn().Err(err).Str("customer", p.CustomerID).Bool("operator", p.IsOperator()).Str("queue", queue).Str("task", taskID).
		Msg("claim refused: the task is not the claimer's customer's or not on the queue claimed on (a forged ready notification?); dropped")
}

// handBack releases st's claim, which was made (evs) for a claimer that
// left before it could receive it, so its task is claimable again at once
// instead of held until a heartbeat or its deadline passes; the attempt is
// not charged (a release). A failure leaves it to those.
func (s *claims) handBack(st aggregate.State, evs []events.Event) {
	ctx, cancel := context.WithTimeout(context.Background(), s.writeTimeout)
	defer cancel()
	if err := s.settle(ctx, st, evs, nil); err != nil {
		return
	}
	release := aggregate.LoseClaim{DeliveryID: st.Claim.DeliveryID, Reason: events.ClaimLostReleased, Note: "the claimer left before the claim reached it"}
	if next, evs, err := s.store.Execute(ctx, st.TaskID, "", release); err == nil {
		s.settle(ctx, next, evs, nil)
	}
}

// settleMsg acknowledges or hands back msg with how, unless msg is nil (a
// delivery handed off).
func settleMsg(msg jetstream.Msg, how func(jetstream.Msg) error) {
	if msg != nil {
		how(msg)
	}
}

// Claim consumes deliveryID and starts the run for executorID, with
// heartbeats if opts say so (service.WithHeartbeat). A task one of whose
// ancestors has ended is recorded canceled instead, and Claim fails with
// ErrAncestorTerminal.
func (s *claims) Claim(ctx context.Context, p Principal, id, deliveryID, executorID string, opts ...ClaimOption) (aggregate.State, error) {
	if err := validIDs("deliveryId", deliveryID); err != nil {
		return aggregate.State{}, err
	}
	c, err := claimOf("", executorID, opts)
	if err != nil {
		return aggregate.State{}, err
	}
	c.DeliveryID = deliveryID
	if !p.IsOperator() {
		c.CustomerID = p.CustomerID // authorize checks it too; the aggregate decides on the log
	}
	crashpoint.Hit(crashpoint.ClaimReceived)
	if err := s.authorize(ctx, p, id); err != nil {
		return aggregate.State{}, err
	}
	st, evs, err := s.claim(ctx, id, c)
	switch {
	case errors.Is(err, ErrAncestorTerminal):
		if serr := s.settle(ctx, st, evs, nil); serr != nil {
			return st, serr
		}
		return st, err
	case err != nil:
		return st, s.fromStore(err)
	}
	crashpoint.Hit(crashpoint.Claimed)
	return st, s.settle(ctx, st, evs, nil)
}

// RecordResult finishes a task. A non-empty deliveryID must be the claim's,
// and the result's events name the claim's executor. A result without one
// is an operator's action (recovery), named by the operator's token: a
// customer's is ErrOperatorOnly (ErrNotFound for a task it may not see).
func (s *claims) RecordResult(ctx context.Context, p Principal, id, deliveryID string, r events.Result) (aggregate.State, error) {
	return s.recordResult(ctx, p, id, deliveryID, r, nil)
}

// recordResult is RecordResult, settling as settle does with later.
func (s *claims) recordResult(ctx context.Context, p Principal, id, deliveryID string, r events.Result, later *events.Position) (aggregate.State, error) {
	switch {
	case deliveryID != "":
		if err := validIDs("deliveryId", deliveryID); err != nil {
			return aggregate.State{}, err
		}
	case !p.IsOperator():
		if err := s.authorize(ctx, p, id); err != nil { // another customer's task is not found, as everywhere
			return aggregate.State{}, err
		}
		return aggregate.State{}, fmt.Errorf("%w: a result without the claim's deliveryId is an operator's action", ErrOperatorOnly)
	}
	crashpoint.Hit(crashpoint.ResultPending)
	st, err := s.execute(ctx, p, id, p.Actor(), aggregate.RecordResult{DeliveryID: deliveryID, Result: r}, later)
	if err == nil {
		crashpoint.Hit(crashpoint.ResultStored)
	}
	return st, err
}

// ReportEffects records effects the run under deliveryID made, while the
// task is running under that claim, and returns the task with every
// effect reported so far. Errors: aggregate.ErrNotFound (no such task for
// p), ErrTerminal, ErrTokenMismatch (not running under deliveryID),
// ErrInvalid (no effects, more than events.MaxEffects, a bad one, or past
// events.MaxTaskEffects distinct ones), ErrTooLarge, ErrUnavailable.
func (s *claims) ReportEffects(ctx context.Context, p Principal, id, deliveryID string, effects []events.Effect) (aggregate.State, error) {
	if err := validIDs("deliveryId", deliveryID); err != nil {
		return aggregate.State{}, err
	}
	return s.execute(ctx, p, id, p.Actor(), aggregate.ReportEffects{DeliveryID: deliveryID, Effects: effects}, nil)
}
