package service

import (
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/aggregate"
)

// Errors the service adds to the aggregate's. Their texts keep the
// "scheduler:" prefix that error answers have always carried.
var (
	// ErrParentTerminal: a child was scheduled under a terminal parent.
	ErrParentTerminal = errors.New("scheduler: parent task is terminal")
	// ErrAncestorTerminal: a child was scheduled under a task whose
	// ancestor (its parent's parent, or further up) has ended, or a task
	// was claimed whose ancestor had ended: the claim canceled it instead.
	ErrAncestorTerminal = errors.New("scheduler: ancestor task is terminal")
	// ErrRequestIDConflict: a customer's requestId named a task under
	// another parent (or none) than the request's.
	ErrRequestIDConflict = errors.New("scheduler: requestId names a task under another parent")
	// ErrUnavailable: the log or the projections could not answer in time.
	ErrUnavailable = errors.New("scheduler: unavailable")
	// ErrLineageLimit: a child would make its lineage deeper or larger
	// than the scheduler's limits (MaxLineageDepth, MaxLineageTasks).
	ErrLineageLimit = errors.New("scheduler: lineage limit reached")
	// ErrTooManyPolls: a customer already holds the most long polls it
	// may (claims/next, batch claims; MaxPollsPerCustomer).
	ErrTooManyPolls = errors.New("scheduler: too many long polls")
	// ErrScheduleLimit: a customer already has the most live schedules
	// it may (MaxSchedules).
	ErrScheduleLimit = errors.New("scheduler: schedule limit reached")
	// ErrStaleRevision: a SaveRun named a revision that is not the
	// stored one (another save came first); nothing changed.
	ErrStaleRevision = errors.New("scheduler: stale run revision")
	// ErrOperatorOnly: a customer's token asked for what only an operator
	// may do: a result without the claim's delivery token.
	ErrOperatorOnly = errors.New("scheduler: operator only")
	// ErrProgressRate: a task's progress lines came faster than
	// MaxProgressRate allows; the line was not sent.
	ErrProgressRate = errors.New("scheduler: too many progress lines")
	// ErrAdmissionRejected: admission refused a new root task. The
	// candidate is persisted as canceled; the error is an
	// *AdmissionError holding it.
	ErrAdmissionRejected = errors.New("scheduler: admission rejected")
	// ErrCorruptEvent: the task (or key, or schedule) has a message on
	// the log that cannot be read as an event; the error also wraps its
	// *events.CorruptError, which names the message's position. It is
	// quarantined, with no repair: it stays on the log and retrying never
	// helps; the work is scheduled again as a new task (taskledger replay
	// quarantine lists such messages).
	ErrCorruptEvent = errors.New("scheduler: corrupt event")
)

// invalid wraps a validation failure as aggregate.ErrInvalid.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", aggregate.ErrInvalid, fmt.Sprintf(format, args...))
}

// AdmissionError carries the persisted, rejected task; errors.Is finds
// ErrAdmissionRejected in it.
type AdmissionError struct {
	Task aggregate.State
}

func (e *AdmissionError) Error() string {
	return fmt.Sprintf("admission rejected task %s: %s", e.Task.TaskID, e.Task.Reason)
}

// Unwrap makes errors.Is(err, ErrAdmissionRejected) hold.
func (e *AdmissionError) Unwrap() error { return ErrAdmissionRejected }
