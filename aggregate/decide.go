package aggregate

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/taskledger/taskledger/events"
)

// Errors returned by Decide. Callers test them with errors.Is; the API maps
// each to a status code.
var (
	// ErrNotFound: the command needs an existing task and there is none.
	ErrNotFound = errors.New("aggregate: task not found")
	// ErrExists: Schedule or Reject for a task id that already has events.
	ErrExists = errors.New("aggregate: task already exists")
	// ErrTerminal: the task is succeeded, failed, canceled or timed out and
	// the command would change it.
	ErrTerminal = errors.New("aggregate: task is terminal")
	// ErrNotClaimable: Claim on a task that is not scheduled or queued, or
	// that has not been released yet.
	ErrNotClaimable = errors.New("aggregate: task is not claimable")
	// ErrTokenMismatch: Claim, RecordResult, ReportEffects or ReadMail
	// with a delivery token that is not the current one (for
	// ReportEffects and ReadMail: the task is not running under it).
	ErrTokenMismatch = errors.New("aggregate: delivery token mismatch")
	// ErrClaimLost: RecordResult, ReportEffects or LoseClaim with the
	// token of a claim that ended in a ClaimLost (a missed heartbeat or a
	// release): another executor may hold the task now.
	ErrClaimLost = errors.New("aggregate: claim lost")
	// ErrStale: a reactor command (release, delivery, timeout) that no
	// longer applies because the task moved on or is not due yet. Reactors
	// drop it: a duplicated or late action is harmless by construction.
	ErrStale = errors.New("aggregate: command no longer applies")
	// ErrNotTerminal: RetrySpec for a task that has not finished.
	ErrNotTerminal = errors.New("aggregate: task is not terminal")
	// ErrInvalid: the command's own arguments are unacceptable.
	ErrInvalid = errors.New("aggregate: invalid command")
	// ErrConflict: another writer appended to the task between load and
	// append. Returned by stores, never by Decide.
	ErrConflict = errors.New("aggregate: concurrent append")
	// ErrTooLarge: the encoded event is larger than the log accepts (the
	// NATS server's max payload, or the stream's maximum message size),
	// returned by stores; or a task's payload or a result's output is
	// over its limit (CompactJSON), returned by Decide. Retrying cannot
	// help.
	ErrTooLarge = errors.New("aggregate: event too large for the log")
	// ErrRunRevision: SaveRun for a revision that is not the one after
	// the task's latest (another save came first, or the caller read an
	// older revision).
	ErrRunRevision = errors.New("aggregate: run revision is not the next one")
	// ErrWrongTenant: Claim naming a customer or a queue (Claim.CustomerID,
	// Claim.Queue) that is not the task's: the claim came through a ready
	// notification that does not describe the task it names (a forged
	// one). Retrying cannot help.
	ErrWrongTenant = errors.New("aggregate: task belongs to another customer or queue")
)

// Command is a request to change one task. The commands are the types in
// this file; Decide accepts no others.
type Command interface{ command() }

// Schedule accepts a new task. A zero Spec.RunAt means now. With a
// DeliveryID (fresh, chosen by the caller) a task due at once is also
// released in the same event, with that delivery token: its notification
// is due at NextAt (now if zero), the time the caller leaves itself to
// publish it and record that before the alarm does. A DeliveryID on a task
// not yet due is ignored: the alarm releases it at runAt. A Spec.Retry
// must be complete (the service fills its defaults): maxAttempts 1 to
// events.MaxAttempts, backoffSeconds 0 to events.MaxBackoffSeconds,
// maxBackoffSeconds 0 to events.MaxMaxBackoffSeconds, and on one or both
// of events.RetryOnFailed and events.RetryOnTimedOut, each once.
type Schedule struct {
	TaskID, CustomerID string
	Spec               events.TaskSpec
	DeliveryID         string
	NextAt             time.Time
}

// Reject persists a candidate task that admission refused, as canceled.
type Reject struct {
	TaskID, CustomerID string
	Spec               events.TaskSpec
	Reason             string
}

// ReleaseDue releases a scheduled task whose runAt (after a retry, the
// retry's nextAt) has come, creating the delivery token DeliveryID
// (fresh, chosen by the caller; one an earlier attempt was claimed with
// is ErrInvalid). Attempt, when not 0, is the attempt the caller took
// the task's concurrency slot for: a task at another attempt is ErrStale.
type ReleaseDue struct {
	DeliveryID string
	Attempt    int
	// NextAt, if after the decision's time, is when the delivery is due
	// instead of at once: the releaser publishes the notification itself
	// and leaves the delivery queue (the retry path) until then.
	NextAt time.Time
}

// MarkReadyPublished records that the notification for DeliveryID went
// out, stored at ReadySeq in the ready stream.
type MarkReadyPublished struct {
	DeliveryID string
	ReadySeq   uint64
}

// RepublishReady records that the notification for DeliveryID of a queued
// task, last recorded at LostSeq of the ready stream, was found missing
// and published again, at ReadySeq, with the same token. LostSeq must be
// the task's current ready sequence, so a second process that found the
// same loss appends nothing.
type RepublishReady struct {
	DeliveryID string
	LostSeq    uint64
	ReadySeq   uint64
}

// RetryDelivery schedules another publish attempt of DeliveryID at NextAt.
type RetryDelivery struct {
	DeliveryID string
	NextAt     time.Time
	Error      string
}

// ExhaustDelivery fails the task: DeliveryID could not be published.
type ExhaustDelivery struct {
	DeliveryID string
	Reason     string
}

// Claim consumes the current delivery token and starts the run.
// HeartbeatSeconds, 0 or events.MinHeartbeatSeconds to
// events.MaxHeartbeatSeconds, is the interval within which the executor
// renews the claim; 0 is a claim without heartbeats. CustomerID and
// Queue, when set, are whose task and which queue the claimer expects
// (the caller's customer, the queue it claims on): a task of another
// customer or on another queue is ErrWrongTenant, decided before the
// token, whatever the ready notification that led there said.
type Claim struct {
	DeliveryID, ExecutorID string
	HeartbeatSeconds       int
	CustomerID, Queue      string
}

// LoseClaim ends the running claim under DeliveryID without a result:
// Reason events.ClaimLostHeartbeat (the alarm: the claim's heartbeat was
// missed; allowed only once the log's heartbeat due time,
// State.HeartbeatDue, has passed, since renewals are not in the log) or
// events.ClaimLostReleased (the executor handed it back, Note saying why,
// at most events.MaxReasonBytes). The task is scheduled again, due at
// once, while its retry policy has an attempt left (State.Charged; a
// release within events.MaxFreeReleases always has), else it times out.
type LoseClaim struct {
	DeliveryID string
	Reason     string
	Note       string
}

// RecordResult finishes the task. A non-empty DeliveryID must match the
// current claim. A failure of a running task whose retry policy has
// attempts left and retries on failed is a RetryScheduled instead,
// unless the result says it is not retryable.
type RecordResult struct {
	DeliveryID string
	Result     events.Result
}

// ReportEffects records effects the run under DeliveryID made, while the
// task is running under that claim: 1 to events.MaxEffects of them, and
// no more than events.MaxTaskEffects distinct ones (by kind and ref) on
// the task with those already reported. An effect with a zero At gets the
// decision's time.
type ReportEffects struct {
	DeliveryID string
	Effects    []events.Effect
}

// SaveRun records revision Revision of the task's Run, saved by the run
// under DeliveryID while the task is running under that claim: Revision
// is the one after the latest (State.Run.Revision + 1), at most
// events.MaxRunRevisions; Digest is the SHA-256 of the revision's
// canonical bytes in lowercase hex and Size their length (at least 2,
// "{}"). The bytes themselves are stored beside the log.
type SaveRun struct {
	DeliveryID string
	Revision   uint64
	Digest     string
	Size       int
}

// Cancel cancels a non-terminal task.
type Cancel struct{ Reason string }

// TimeOut ends a run whose deadline has passed: TimedOut, or a
// RetryScheduled when the task's retry policy has attempts left and
// retries on timed_out.
type TimeOut struct{}

// AppendMail adds a message to the mailbox; a message id seen before is a
// no-op, even on a terminal task.
type AppendMail struct{ Message events.Message }

// ReadMail advances the scheduler's mailbox cursor to Cursor for the
// claim holder: DeliveryID must be the running task's claim
// (ErrTokenMismatch otherwise), so only the run a follow-up is for
// consumes it. The service always gives one; an empty DeliveryID is what
// the verifier passes for a MailboxRead of a log written before checks
// named their claim (any status then, terminal included).
type ReadMail struct {
	Cursor     int
	DeliveryID string
}

// RecordCheckFailed records that stop checks of a live task failed (they
// answered check_failed) from Since on, Failures (≥ 1) of them, the last
// with Error (at most events.MaxErrorBytes): at most one CheckFailed per
// CheckFailedInterval, so a record within it of the last is a no-op and
// the caller counts the failures into a later one.
type RecordCheckFailed struct {
	Since    time.Time
	Failures int
	Error    string
}

// CheckFailedInterval is the least time between two CheckFailed events
// of one task.
const CheckFailedInterval = time.Minute

func (RecordCheckFailed) command() {}

// CancelForAncestor cancels a task one of whose ancestors has ended, in
// place of the step that would run it (the caller looked up the ancestor):
// with a DeliveryID, its claim, allowed as Claim is (the task released
// under that token); without, its release, allowed as ReleaseDue is but
// at any time (scheduled, not released yet). It appends Canceled with
// reason events.ReasonAncestorTerminal. CustomerID and Queue, when set,
// are the claim's (see Claim): a task of another customer or on another
// queue is ErrWrongTenant.
type CancelForAncestor struct{ DeliveryID, CustomerID, Queue string }

func (Schedule) command()           {}
func (Reject) command()             {}
func (ReleaseDue) command()         {}
func (MarkReadyPublished) command() {}
func (RepublishReady) command()     {}
func (RetryDelivery) command()      {}
func (ExhaustDelivery) command()    {}
func (Claim) command()              {}
func (RecordResult) command()       {}
func (ReportEffects) command()      {}
func (SaveRun) command()            {}
func (Cancel) command()             {}
func (TimeOut) command()            {}
func (AppendMail) command()         {}
func (ReadMail) command()           {}
func (LoseClaim) command()          {}
func (CancelForAncestor) command()  {}

// Decide returns the events cmd appends to the task in state s at time now,
// or an error wrapping one of the Err values above. An empty slice and a
// nil error mean the command is already satisfied (a repeated mailbox
// message, a cursor that does not move). Event IDs are left empty for the
// store to fill in.
func Decide(s State, cmd Command, now time.Time) ([]events.Event, error) {
	if c, ok := cmd.(Schedule); ok {
		if c.DeliveryID != "" && !s.Exists() {
			if err := events.ValidID(c.DeliveryID); err != nil {
				return nil, fmt.Errorf("%w: delivery id: %w", ErrInvalid, err)
			}
		}
		return decideNew(s, c.TaskID, c.CustomerID, c.Spec, now, func(spec events.TaskSpec) events.Payload {
			// A keyed task is released only once it holds a slot of its
			// concurrency key (the alarm's release path), never in its
			// TaskScheduled.
			if c.DeliveryID == "" || now.Before(spec.RunAt) || spec.Concurrency != nil {
				return events.TaskScheduled{Spec: spec}
			}
			nextAt := c.NextAt
			if nextAt.IsZero() {
				nextAt = now
			}
			return events.TaskScheduled{Spec: spec, DeliveryID: c.DeliveryID, NextAt: nextAt}
		})
	}
	if c, ok := cmd.(Reject); ok {
		if err := maxBytes(field{"reason", c.Reason, events.MaxReasonBytes}); err != nil && !s.Exists() {
			return nil, err
		}
		return decideNew(s, c.TaskID, c.CustomerID, c.Spec, now, func(spec events.TaskSpec) events.Payload {
			return events.AdmissionRejected{Spec: spec, Reason: c.Reason}
		})
	}
	if !s.Exists() {
		return nil, ErrNotFound
	}
	p, err := decideExisting(s, cmd, now)
	if p == nil || err != nil {
		return nil, err
	}
	return []events.Event{{TaskID: s.TaskID, CustomerID: s.CustomerID, Number: s.Version + 1, At: now, Actor: holder(s, cmd), Data: p}}, nil
}

// holder is the actor of what cmd appends when the claim's holder makes
// it (a result, effects or a mailbox read under the claim's delivery
// token): the claim's executor id. Any other command leaves the actor to
// the store, which names the caller.
func holder(s State, cmd Command) string {
	switch c := cmd.(type) {
	case RecordResult:
		if c.DeliveryID != "" {
			return s.Claim.ExecutorID
		}
	case ReportEffects, SaveRun:
		return s.Claim.ExecutorID
	case ReadMail:
		if c.DeliveryID != "" {
			return s.Claim.ExecutorID
		}
	}
	return ""
}

func decideNew(s State, taskID, customerID string, spec events.TaskSpec, now time.Time, payload func(events.TaskSpec) events.Payload) ([]events.Event, error) {
	if s.Exists() {
		return nil, ErrExists
	}
	if spec.RunAt.IsZero() {
		spec.RunAt = now
	}
	spec.Labels = maps.Clone(spec.Labels) // the event's own copy; no labels is nil
	if len(spec.Labels) == 0 {
		spec.Labels = nil
	}
	if err := validateNew(taskID, customerID, spec); err != nil {
		return nil, err
	}
	spec, err := compactSpec(spec) // valid: checked just above
	if err != nil {
		return nil, err
	}
	return []events.Event{{TaskID: taskID, CustomerID: customerID, Number: 1, At: now, Data: payload(spec)}}, nil
}

func validateNew(taskID, customerID string, spec events.TaskSpec) error {
	for _, id := range []struct{ name, v string }{
		{"taskId", taskID}, {"customerId", customerID}, {"rootId", spec.RootID},
	} {
		if err := events.ValidID(id.v); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalid, id.name, err)
		}
	}
	if err := ValidateRequest(spec); err != nil {
		return err
	}
	if spec.RetryOf != "" && (spec.RetryOf != spec.RelatedTaskID || spec.ParentID != "") {
		return fmt.Errorf("%w: a retry is a root task whose relatedTaskId is the task it retries", ErrInvalid)
	}
	if (spec.ParentID == "") != (spec.RootID == taskID) {
		return fmt.Errorf("%w: rootId must be the task's own id exactly when it has no parent", ErrInvalid)
	}
	return nil
}

// ValidateRequest checks what a client gives for a new task: its queue,
// the ids it names and its content (ValidateContent). The aggregate
// checks it again with what it assigns, the task's own ids.
func ValidateRequest(spec events.TaskSpec) error {
	if err := events.ValidID(spec.Queue); err != nil {
		return fmt.Errorf("%w: queue: %w", ErrInvalid, err)
	}
	for _, id := range []struct{ name, v string }{
		{"parentId", spec.ParentID}, {"requestId", spec.RequestID}, {"relatedTaskId", spec.RelatedTaskID},
	} {
		if id.v == "" {
			continue
		}
		if err := events.ValidID(id.v); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalid, id.name, err)
		}
	}
	return ValidateContent(spec)
}

// ValidateContent checks what a task's spec holds besides its ids: the
// timeout, repo, signal, labels, kind, payload and message limits.
func ValidateContent(spec events.TaskSpec) error {
	if spec.TimeoutSeconds < events.MinTimeoutSeconds || spec.TimeoutSeconds > events.MaxTimeoutSeconds {
		return fmt.Errorf("%w: timeoutSeconds must be %d..%d", ErrInvalid, events.MinTimeoutSeconds, events.MaxTimeoutSeconds)
	}
	sig := spec.Signal
	if err := validateRetry(spec.Retry); err != nil {
		return err
	}
	if err := maxBytes(field{"repo", spec.Repo, events.MaxURLBytes},
		field{"signal.uri", sig.URI, events.MaxURLBytes},
		field{"signal.id", sig.ID, events.MaxNameBytes},
		field{"signal.requestId", sig.RequestID, events.MaxNameBytes},
		field{"signal.eventType", sig.EventType, events.MaxNameBytes},
		field{"signal.eventAction", sig.EventAction, events.MaxNameBytes}); err != nil {
		return err
	}
	if spec.Concurrency != nil {
		if err := ValidConcurrency(*spec.Concurrency); err != nil {
			return err
		}
	}
	if err := ValidateLabels(spec.Labels); err != nil {
		return err
	}
	if err := ValidateKind(spec.Kind); err != nil {
		return err
	}
	if err := validateMessage(spec.Message); err != nil {
		return err
	}
	_, err := compactSpec(spec) // last: the one check that may be ErrTooLarge
	return err
}

// validateRetry checks a complete retry policy; nil is none.
func validateRetry(p *events.RetryPolicy) error {
	if p == nil {
		return nil
	}
	for _, n := range []struct {
		name   string
		v, min int
		max    int
	}{
		{"retry.maxAttempts", p.MaxAttempts, 1, events.MaxAttempts},
		{"retry.backoffSeconds", p.BackoffSeconds, 0, events.MaxBackoffSeconds},
		{"retry.maxBackoffSeconds", p.MaxBackoffSeconds, 0, events.MaxMaxBackoffSeconds},
	} {
		if n.v < n.min || n.v > n.max {
			return fmt.Errorf("%w: %s must be %d..%d", ErrInvalid, n.name, n.min, n.max)
		}
	}
	if len(p.On) == 0 {
		return fmt.Errorf("%w: retry.on needs %q, %q or both", ErrInvalid, events.RetryOnFailed, events.RetryOnTimedOut)
	}
	for i, on := range p.On {
		switch {
		case on != events.RetryOnFailed && on != events.RetryOnTimedOut:
			return fmt.Errorf("%w: retry.on[%d] must be %q or %q", ErrInvalid, i, events.RetryOnFailed, events.RetryOnTimedOut)
		case slices.Index(p.On, on) < i:
			return fmt.Errorf("%w: retry.on lists %q twice", ErrInvalid, on)
		}
	}
	return nil
}

// ValidateLabels checks a task's labels: at most events.MaxLabels pairs,
// each key events.ValidLabelKey, each value valid UTF-8 of at most
// events.MaxLabelValueBytes bytes. It fails with ErrInvalid.
func ValidateLabels(labels map[string]string) error {
	if len(labels) > events.MaxLabels {
		return fmt.Errorf("%w: %d labels, at most %d", ErrInvalid, len(labels), events.MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) { // the same error for the same labels
		v := labels[k]
		switch {
		case !events.ValidLabelKey(k):
			return fmt.Errorf("%w: label key %q must match [a-z0-9][a-z0-9_./-]{0,62}", ErrInvalid, events.Truncate(k, events.MaxLabelKeyBytes+1))
		case len(v) > events.MaxLabelValueBytes:
			return fmt.Errorf("%w: label %s: value is %d bytes, more than %d", ErrInvalid, k, len(v), events.MaxLabelValueBytes)
		case !utf8.ValidString(v):
			return fmt.Errorf("%w: label %s: value is not valid UTF-8", ErrInvalid, k)
		}
	}
	return nil
}

// retryOn reports whether the task's policy gives an attempt ended by
// cause another one.
func retryOn(s State, cause string) bool {
	p := s.Spec.Retry
	return p != nil && s.Charged() < p.MaxAttempts && slices.Contains(p.On, cause)
}

// retryAt is when the attempt after the task's current one is due: now
// plus backoffSeconds doubled for each attempt before the current one, at
// most maxBackoffSeconds, less a jitter of up to a fifth that is derived
// from the task id and the attempt, so a decision is the same every time
// it is made (the verifier makes it again).
func retryAt(s State, now time.Time) time.Time {
	p := s.Spec.Retry
	d, limit := time.Duration(p.BackoffSeconds)*time.Second, time.Duration(p.MaxBackoffSeconds)*time.Second
	for i := 1; i < s.Attempt() && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", s.TaskID, s.Attempt())
	return now.Add(d - time.Duration(h.Sum64()%uint64(d/5+1)))
}

// RetrySpec returns the spec of a new root task that repeats the
// terminal task of: of's spec (queue, message, repo, labels, signal,
// timeout, retry policy, concurrency and every other field a caller chose) with RelatedTaskID and
// RetryOf set to of's id, and no root, parent, request id or runAt: the
// caller sets those for the new task. It fails with ErrNotFound for a
// task that does not exist and ErrNotTerminal for one still live. of
// must be the task's full state, as the store loads it.
func RetrySpec(of State) (events.TaskSpec, error) {
	switch {
	case !of.Exists():
		return events.TaskSpec{}, ErrNotFound
	case !of.Status.Terminal():
		return events.TaskSpec{}, fmt.Errorf("%w: task %s is %s", ErrNotTerminal, of.TaskID, of.Status)
	}
	spec := of.Spec
	spec.RootID, spec.ParentID, spec.RequestID, spec.RunAt = "", "", "", time.Time{}
	spec.RelatedTaskID, spec.RetryOf = of.TaskID, of.TaskID
	return spec, nil
}

// field is a client-given text and its limit in bytes.
type field struct {
	name, v string
	limit   int
}

// maxBytes fails with ErrInvalid on the first field longer than its limit.
func maxBytes(fs ...field) error {
	for _, f := range fs {
		if len(f.v) > f.limit {
			return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrInvalid, f.name, len(f.v), f.limit)
		}
	}
	return nil
}

// validateMessage checks a message's id and content: at most
// MaxContentParts parts, each with a type and a text, MaxMessageBytes in
// all. A task's objective may have no parts; a mailbox message may not.
func validateMessage(m events.Message) error {
	if m.ID != "" {
		if err := events.ValidID(m.ID); err != nil {
			return fmt.Errorf("%w: message id: %w", ErrInvalid, err)
		}
	}
	if len(m.Content) > events.MaxContentParts {
		return fmt.Errorf("%w: message has %d content parts, at most %d", ErrInvalid, len(m.Content), events.MaxContentParts)
	}
	for i, c := range m.Content {
		switch {
		case c.Type == "" || c.Text == "":
			return fmt.Errorf("%w: content part %d needs a type and a text", ErrInvalid, i)
		case len(c.Type) > events.MaxNameBytes:
			return fmt.Errorf("%w: content part %d: type is %d bytes, more than %d", ErrInvalid, i, len(c.Type), events.MaxNameBytes)
		}
	}
	if n := MessageSize(m); n > events.MaxMessageBytes {
		return fmt.Errorf("%w: message is %d bytes, more than %d", ErrInvalid, n, events.MaxMessageBytes)
	}
	return nil
}

// MessageSize is the size of a message's content as the limits count it.
func MessageSize(m events.Message) int {
	n := 0
	for _, c := range m.Content {
		n += len(c.Type) + len(c.Text)
	}
	return n
}

func decideExisting(s State, cmd Command, now time.Time) (events.Payload, error) {
	if s.LostClaim(claimToken(cmd)) { // before ErrTerminal: a lost claim's writer hears why
		return nil, ErrClaimLost
	}
	switch c := cmd.(type) {
	case AppendMail:
		if s.MailIndex(c.Message.ID) > 0 {
			return nil, nil
		}
		if err := live(s); err != nil {
			return nil, err
		}
		if err := events.ValidID(c.Message.ID); err != nil {
			return nil, fmt.Errorf("%w: message id: %w", ErrInvalid, err)
		}
		if len(c.Message.Content) == 0 {
			return nil, fmt.Errorf("%w: a mailbox message needs content", ErrInvalid)
		}
		if err := validateMessage(c.Message); err != nil {
			return nil, err
		}
		m := c.Message
		if m.CreatedAt.IsZero() {
			m.CreatedAt = now
		}
		return events.MailboxAppended{Index: len(s.MailIDs) + 1, Message: m}, nil
	case Claim: // on a terminal task too: a claim on anything not queued is not_claimable
		if err := tenant(s, c.CustomerID, c.Queue); err != nil {
			return nil, err
		}
		if !s.Claimable() {
			return nil, fmt.Errorf("%w: task is %s", ErrNotClaimable, describe(s))
		}
		if c.DeliveryID != s.Delivery.ID {
			return nil, ErrTokenMismatch
		}
		if err := events.ValidID(c.ExecutorID); err != nil {
			return nil, fmt.Errorf("%w: executor id: %w", ErrInvalid, err)
		}
		if hb := c.HeartbeatSeconds; hb != 0 && (hb < events.MinHeartbeatSeconds || hb > events.MaxHeartbeatSeconds) {
			return nil, fmt.Errorf("%w: heartbeatSeconds must be 0 (none) or %d..%d", ErrInvalid, events.MinHeartbeatSeconds, events.MaxHeartbeatSeconds)
		}
		deadline := now.Add(time.Duration(s.Spec.TimeoutSeconds) * time.Second)
		return events.Claimed{DeliveryID: c.DeliveryID, ExecutorID: c.ExecutorID, Deadline: deadline, HeartbeatSeconds: c.HeartbeatSeconds}, nil
	case LoseClaim:
		return loseClaim(s, c, now)
	case ReadMail:
		if c.DeliveryID != "" && (s.Status != StatusRunning || c.DeliveryID != s.Claim.DeliveryID) {
			return nil, ErrTokenMismatch
		}
		if c.Cursor > len(s.MailIDs) {
			return nil, fmt.Errorf("%w: cursor %d beyond %d messages", ErrInvalid, c.Cursor, len(s.MailIDs))
		}
		if c.Cursor <= s.Cursor {
			return nil, nil
		}
		return events.MailboxRead{Cursor: c.Cursor}, nil
	case CancelForAncestor:
		if err := tenant(s, c.CustomerID, c.Queue); err != nil {
			return nil, err
		}
		if c.DeliveryID != "" {
			if !s.Claimable() {
				return nil, fmt.Errorf("%w: task is %s", ErrNotClaimable, describe(s))
			}
			if c.DeliveryID != s.Delivery.ID {
				return nil, ErrTokenMismatch
			}
		} else {
			if err := live(s); err != nil {
				return nil, err
			}
			if s.Status != StatusScheduled || s.Delivery.ID != "" {
				return nil, fmt.Errorf("%w: already released", ErrStale)
			}
		}
		return events.Canceled{Reason: events.ReasonAncestorTerminal}, nil
	}

	if err := live(s); err != nil {
		return nil, err
	}
	switch c := cmd.(type) {
	case ReleaseDue:
		if s.Status != StatusScheduled || s.Delivery.ID != "" {
			return nil, fmt.Errorf("%w: already released", ErrStale)
		}
		if due := s.DueAt(); now.Before(due) {
			return nil, fmt.Errorf("%w: not due until %s", ErrStale, due.Format(time.RFC3339Nano))
		}
		if c.Attempt != 0 && c.Attempt != s.Attempt() {
			return nil, fmt.Errorf("%w: at attempt %d, not %d", ErrStale, s.Attempt(), c.Attempt)
		}
		if err := events.ValidID(c.DeliveryID); err != nil {
			return nil, fmt.Errorf("%w: delivery id: %w", ErrInvalid, err)
		}
		if i := slices.IndexFunc(s.Retries, func(a Attempt) bool { return a.DeliveryID == c.DeliveryID }); i >= 0 {
			return nil, fmt.Errorf("%w: delivery id %s was attempt %d's", ErrInvalid, c.DeliveryID, s.Retries[i].Number)
		}
		next := now
		if c.NextAt.After(now) {
			next = c.NextAt
		}
		return events.DeliveryPending{DeliveryID: c.DeliveryID, Attempt: 1, NextAt: next}, nil
	case MarkReadyPublished:
		if err := pendingDelivery(s, c.DeliveryID); err != nil {
			return nil, err
		}
		return events.ReadyPublished{DeliveryID: c.DeliveryID, ReadySeq: c.ReadySeq}, nil
	case RepublishReady:
		if s.Status != StatusQueued || s.Delivery.ID != c.DeliveryID || s.Delivery.ReadySeq != c.LostSeq {
			return nil, fmt.Errorf("%w: delivery %s is not queued at ready sequence %d", ErrStale, c.DeliveryID, c.LostSeq)
		}
		return events.ReadyRepublished{DeliveryID: c.DeliveryID, LostSeq: c.LostSeq, ReadySeq: c.ReadySeq}, nil
	case RetryDelivery:
		if err := pendingDelivery(s, c.DeliveryID); err != nil {
			return nil, err
		}
		return events.DeliveryRetryScheduled{
			DeliveryID: c.DeliveryID, Attempt: s.Delivery.Attempt + 1, NextAt: c.NextAt, Error: c.Error,
		}, nil
	case ExhaustDelivery:
		if err := pendingDelivery(s, c.DeliveryID); err != nil {
			return nil, err
		}
		return events.DeliveryExhausted{DeliveryID: c.DeliveryID, Attempts: s.Delivery.Attempt, Reason: c.Reason}, nil
	case RecordResult:
		if c.DeliveryID != "" && (s.Status != StatusRunning || c.DeliveryID != s.Claim.DeliveryID) {
			return nil, ErrTokenMismatch
		}
		if err := validateResult(c.Result); err != nil { // a full effects list never refuses a result: see Apply
			return nil, err
		}
		result, err := compactResult(c.Result)
		if err != nil {
			return nil, err
		}
		c.Result = result
		if r := c.Result; !r.Success && s.Status == StatusRunning && (r.Retryable == nil || *r.Retryable) && retryOn(s, events.RetryOnFailed) {
			return events.RetryScheduled{
				Attempt: s.Attempt() + 1, NextAt: retryAt(s, now), Cause: events.RetryOnFailed, DeliveryID: c.DeliveryID, Result: &r,
			}, nil
		}
		return events.ResultRecorded{DeliveryID: c.DeliveryID, Result: c.Result}, nil
	case ReportEffects:
		if s.Status != StatusRunning || c.DeliveryID != s.Claim.DeliveryID {
			return nil, ErrTokenMismatch
		}
		if len(c.Effects) == 0 {
			return nil, fmt.Errorf("%w: a report needs 1 to %d effects", ErrInvalid, events.MaxEffects)
		}
		if err := validateEffects(c.Effects); err != nil {
			return nil, err
		}
		if err := roomForEffects(s, c.Effects); err != nil {
			return nil, err
		}
		return events.EffectsReported{DeliveryID: c.DeliveryID, Effects: stamped(c.Effects, now)}, nil
	case SaveRun:
		if s.Status != StatusRunning || c.DeliveryID != s.Claim.DeliveryID {
			return nil, ErrTokenMismatch
		}
		if err := validRunSave(c); err != nil {
			return nil, err
		}
		if c.Revision != s.Run.Revision+1 {
			return nil, fmt.Errorf("%w: revision %d after %d", ErrRunRevision, c.Revision, s.Run.Revision)
		}
		return events.RunSaved{DeliveryID: c.DeliveryID, Revision: c.Revision, Digest: c.Digest, Size: c.Size}, nil
	case Cancel:
		if err := maxBytes(field{"reason", c.Reason, events.MaxReasonBytes}); err != nil {
			return nil, err
		}
		return events.Canceled{Reason: c.Reason}, nil
	case RecordCheckFailed:
		if c.Failures < 1 {
			return nil, fmt.Errorf("%w: check failures must be at least 1", ErrInvalid)
		}
		if err := maxBytes(field{"error", c.Error, events.MaxErrorBytes}); err != nil {
			return nil, err
		}
		if !s.CheckFailedAt.IsZero() && now.Before(s.CheckFailedAt.Add(CheckFailedInterval)) {
			return nil, nil
		}
		return events.CheckFailed{Since: c.Since, Failures: c.Failures, Error: c.Error}, nil
	case TimeOut:
		if s.Status != StatusRunning {
			return nil, fmt.Errorf("%w: task is %s", ErrStale, s.Status)
		}
		if now.Before(s.Deadline) {
			return nil, fmt.Errorf("%w: deadline is %s", ErrStale, s.Deadline.Format(time.RFC3339Nano))
		}
		if retryOn(s, events.RetryOnTimedOut) {
			return events.RetryScheduled{Attempt: s.Attempt() + 1, NextAt: retryAt(s, now), Cause: events.RetryOnTimedOut, Deadline: s.Deadline}, nil
		}
		return events.TimedOut{Deadline: s.Deadline}, nil
	}
	return nil, fmt.Errorf("%w: unknown command %T", ErrInvalid, cmd)
}

// claimToken is the token of the claim an executor's command writes
// under: a result's, an effects report's, a LoseClaim's or a SaveRun's;
// "" for others.
func claimToken(cmd Command) string {
	switch c := cmd.(type) {
	case RecordResult:
		return c.DeliveryID
	case ReportEffects:
		return c.DeliveryID
	case LoseClaim:
		return c.DeliveryID
	case SaveRun:
		return c.DeliveryID
	}
	return ""
}

// loseClaim decides a LoseClaim: see its doc.
func loseClaim(s State, c LoseClaim, now time.Time) (events.Payload, error) {
	if err := live(s); err != nil {
		return nil, err
	}
	if s.Status != StatusRunning || c.DeliveryID != s.Claim.DeliveryID {
		return nil, ErrTokenMismatch
	}
	if err := maxBytes(field{"reason", c.Note, events.MaxReasonBytes}); err != nil {
		return nil, err
	}
	ev := events.ClaimLost{DeliveryID: c.DeliveryID, ExecutorID: s.Claim.ExecutorID, Reason: c.Reason, Note: c.Note}
	free := false
	switch c.Reason {
	case events.ClaimLostHeartbeat:
		if due := s.HeartbeatDue(); due.IsZero() || now.Before(due) {
			return nil, fmt.Errorf("%w: heartbeat not due (claim's interval %ds)", ErrStale, s.Claim.HeartbeatSeconds)
		}
		if c.Note != "" {
			return nil, fmt.Errorf("%w: a missed heartbeat has no note", ErrInvalid)
		}
	case events.ClaimLostReleased:
		free = s.Attempt()-s.Charged() < events.MaxFreeReleases
	default:
		return nil, fmt.Errorf("%w: reason must be %q or %q", ErrInvalid, events.ClaimLostHeartbeat, events.ClaimLostReleased)
	}
	if free || s.Charged() < s.MaxAttempts() {
		ev.Attempt = s.Attempt() + 1
	}
	return ev, nil
}

// validRunSave checks a SaveRun's own fields.
func validRunSave(c SaveRun) error {
	switch {
	case c.Revision == 0 || c.Revision > events.MaxRunRevisions:
		return fmt.Errorf("%w: run revision %d, want 1 to %d", ErrInvalid, c.Revision, events.MaxRunRevisions)
	case c.Size < 2:
		return fmt.Errorf("%w: run size %d, want at least 2", ErrInvalid, c.Size)
	case len(c.Digest) != 64 || strings.Trim(c.Digest, "0123456789abcdef") != "":
		return fmt.Errorf("%w: run digest must be 64 lowercase hex digits", ErrInvalid)
	}
	return nil
}

func live(s State) error {
	if s.Status.Terminal() {
		return fmt.Errorf("%w: task is %s", ErrTerminal, s.Status)
	}
	return nil
}

func describe(s State) string {
	if s.Status == StatusScheduled && s.Delivery.ID == "" {
		return "scheduled and not released yet"
	}
	return string(s.Status)
}

// pendingDelivery checks that deliveryID is the task's current, not yet
// published notification. A task not released yet has no delivery, so an
// empty deliveryID never matches.
func pendingDelivery(s State, deliveryID string) error {
	if s.Status != StatusScheduled || s.Delivery.ID == "" || s.Delivery.ID != deliveryID || s.Delivery.Published {
		return fmt.Errorf("%w: delivery %s is not pending", ErrStale, deliveryID)
	}
	return nil
}

func validateResult(r events.Result) error {
	if err := maxBytes(field{"summary", r.Summary, events.MaxSummaryBytes}, field{"error", r.Error, events.MaxErrorBytes}); err != nil {
		return err
	}
	return validateEffects(r.Effects)
}

// validateEffects checks at most events.MaxEffects effects, each with a
// kind and within the name and url limits.
func validateEffects(effects []events.Effect) error {
	if len(effects) > events.MaxEffects {
		return fmt.Errorf("%w: %d effects, at most %d", ErrInvalid, len(effects), events.MaxEffects)
	}
	for i, e := range effects {
		switch {
		case e.Kind == "":
			return fmt.Errorf("%w: effect %d has no kind", ErrInvalid, i)
		case len(e.Kind) > events.MaxNameBytes || len(e.Ref) > events.MaxNameBytes || len(e.URL) > events.MaxURLBytes:
			return fmt.Errorf("%w: effect %d: kind and ref may have at most %d bytes each, url %d", ErrInvalid, i, events.MaxNameBytes, events.MaxURLBytes)
		}
	}
	return nil
}

// roomForEffects fails with ErrInvalid when adding effects to the task's
// would make it hold more than events.MaxTaskEffects distinct ones.
func roomForEffects(s State, effects []events.Effect) error {
	if n := len(mergeEffects(s.Effects, effects, time.Time{})); n > events.MaxTaskEffects {
		return fmt.Errorf("%w: the task would have %d distinct effects (kind and ref), at most %d", ErrInvalid, n, events.MaxTaskEffects)
	}
	return nil
}

// stamped returns effects with every zero At set to now, as a copy.
func stamped(effects []events.Effect, now time.Time) []events.Effect {
	out := slices.Clone(effects)
	for i := range out {
		if out[i].At.IsZero() {
			out[i].At = now
		}
	}
	return out
}

// tenant fails with ErrWrongTenant when a claim expects a customer or a
// queue (set: not "") that is not task s's.
func tenant(s State, customerID, queue string) error {
	if s.Exists() && (customerID != "" && customerID != s.CustomerID || queue != "" && queue != s.Spec.Queue) {
		return fmt.Errorf("%w: the claim expects customer %q and queue %q", ErrWrongTenant, customerID, queue)
	}
	return nil
}
