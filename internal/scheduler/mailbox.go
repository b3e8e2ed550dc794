package scheduler

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// MailItem is a mailbox message with its index (service.MailItem).
type MailItem = service.MailItem

// AppendMail adds a message to a task's mailbox and returns its id and
// index. A message id seen before answers its original index, even on a
// terminal task; a new message on a terminal task is aggregate.ErrTerminal.
// Appending to a live task also checks that its release, pending
// delivery, notification check (queued) or deadline is in the timer
// queues, and repairs it if not.
func (s *tasks) AppendMail(ctx context.Context, p Principal, id string, msg events.Message) (string, int, error) {
	if msg.ID == "" {
		msg.ID = events.NewID()
	}
	msg.CreatedAt = msg.CreatedAt.UTC()
	st, err := s.execute(ctx, p, id, p.Actor(), aggregate.AppendMail{Message: msg}, nil)
	if err != nil {
		return "", 0, err
	}
	if !st.Status.Terminal() && s.views.Repair(st) {
		s.metrics.Repairs.Inc()
		s.logger.Warn().Str("task", id).Str("status", string(st.Status)).Msg("timer queue lacked the task; repaired from the log")
	}
	return msg.ID, st.MailIndex(msg.ID), nil
}

// Mailbox returns the messages with index > after and the scheduler's
// cursor, without moving it.
func (s *tasks) Mailbox(ctx context.Context, p Principal, id string, after int) ([]MailItem, int, error) {
	evs, err := s.feed.History(ctx, p, id)
	if err != nil {
		return nil, 0, err
	}
	return mailAfter(evs, after), aggregate.Replay(evs).Cursor, nil
}

func mailAfter(evs []events.Event, after int) []MailItem {
	var out []MailItem
	for _, ev := range evs {
		if m, ok := ev.Data.(events.MailboxAppended); ok && m.Index > after {
			out = append(out, MailItem{Index: m.Index, Message: m.Message})
		}
	}
	return out
}

// CheckResult is Check's answer (service.CheckResult).
type CheckResult = service.CheckResult

// Check tells an executor whether to stop and hands it the mailbox
// messages after the cursor. Only the claim's holder consumes them: a
// check whose deliveryID is the running task's current claim advances the
// cursor past them (also when it says stop); any other caller — no token,
// a stale one, a monitor — peeks, and the same messages stay for the
// holder. It fails open: a fault while checking answers "continue" with
// reason check_failed, is logged and counted, and is recorded on the task
// (a CheckFailed, at most one a minute; when the log is what failed, at a
// later check once it answers). Only a malformed id or delivery token
// (ErrInvalid), and the token of a claim that was lost
// (aggregate.ErrClaimLost: its holder must stop), are errors.
func (s *tasks) Check(ctx context.Context, p Principal, id, deliveryID string) (CheckResult, error) {
	if err := events.ValidID(id); err != nil {
		return CheckResult{}, invalid("task id: %v", err)
	}
	if deliveryID != "" {
		if err := validIDs("deliveryId", deliveryID); err != nil {
			return CheckResult{}, err
		}
	}
	res, err := s.check(ctx, p, id, deliveryID)
	switch {
	case errors.Is(err, aggregate.ErrClaimLost):
		return CheckResult{}, err
	case err != nil:
		s.metrics.CheckFailures.Inc()
		s.logger.Error().Err(err).Str("task", id).Msg("stop check failed; answering continue")
		res.ShouldStop, res.Reason = false, api.ReasonCheckFailed
		s.noteCheckFailed(ctx, id, err)
	case res.Reason != api.ReasonMissing:
		s.recordCheckFailed(ctx, id, true) // failures the log could not take before
	}
	return res, nil
}

func (s *tasks) check(ctx context.Context, p Principal, id, deliveryID string) (CheckResult, error) {
	evs, err := s.store.History(ctx, id)
	st := aggregate.Replay(evs)
	switch err := s.visible(p, id, st, err); {
	case errors.Is(err, aggregate.ErrNotFound): // another customer's task too
		return CheckResult{ShouldStop: true, Reason: api.ReasonMissing}, nil
	case err != nil:
		return CheckResult{}, err
	}
	if st.LostClaim(deliveryID) {
		return CheckResult{}, aggregate.ErrClaimLost
	}
	res := CheckResult{Reason: api.ReasonActive, Messages: mailAfter(evs, st.Cursor), Cursor: st.Cursor}
	if n := len(res.Messages); n > 0 && holds(st, deliveryID) {
		// The aggregate decides again whether deliveryID still holds the
		// claim: one that lost it in between has peeked.
		_, _, err := s.store.Execute(ctx, id, p.Actor(), aggregate.ReadMail{Cursor: res.Cursor + n, DeliveryID: deliveryID})
		switch {
		case err == nil:
			res.Cursor += n
		case !errors.Is(err, aggregate.ErrTokenMismatch):
			return res, fmt.Errorf("advance cursor: %w", err)
		}
	}
	if st.Status.Terminal() {
		res.ShouldStop, res.Reason = true, api.ReasonTerminal
		return res, nil
	}
	ancestors, err := s.views.Ancestors(id)
	if err != nil {
		return res, err
	}
	for _, a := range ancestors {
		if a.Status.Terminal() {
			res.ShouldStop, res.Reason = true, api.ReasonAncestorTerminal
			break
		}
	}
	return res, nil
}

// holds reports whether deliveryID is the claim the task runs under: its
// holder's check consumes the mailbox.
func holds(st aggregate.State, deliveryID string) bool {
	return deliveryID != "" && st.Status == aggregate.StatusRunning && st.Claim.DeliveryID == deliveryID
}
