package aggregate

import (
	"slices"
	"time"

	"github.com/taskledger/taskledger/events"
)

// Status is where a task is in its lifecycle: scheduled → queued →
// running → one of the four terminal statuses, or from running back to
// scheduled for another attempt (RetryScheduled).
type Status string

// The task statuses. The zero Status means the task does not exist.
const (
	StatusScheduled Status = "scheduled"
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusCanceled  Status = "canceled"
	StatusTimedOut  Status = "timed_out"
)

// Terminal reports whether s is a final status: nothing but mailbox reads
// changes a terminal task.
func (s Status) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusCanceled, StatusTimedOut:
		return true
	}
	return false
}

// Delivery is the task's current ready notification. Its ID is the
// delivery token a claim must present.
type Delivery struct {
	ID      string
	Attempt int
	// NextAt is when the next publish attempt is due; once published,
	// when the notification was last published (ReadyPublished or
	// ReadyRepublished), from which its liveness is checked.
	NextAt    time.Time
	FirstAt   time.Time // when the first attempt was due: the delivery budget counts from it
	Published bool      // ReadyPublished was recorded for ID
	ReadySeq  uint64    // the notification's ready stream sequence; 0 if unknown
}

// Owner records who consumed the delivery token, and the claim's
// heartbeat interval (Claimed): 0 for a claim without heartbeats.
type Owner struct {
	DeliveryID       string
	ExecutorID       string
	HeartbeatSeconds int `msgpack:",omitempty"`
}

// State is a task as its events describe it. The zero State is a task that
// does not exist. A State is a value: Apply returns a new one and never
// changes the one it was given.
type State struct {
	TaskID     string
	CustomerID string
	Spec       events.TaskSpec
	Status     Status

	CreatedAt   time.Time
	StartedAt   time.Time
	CompletedAt time.Time
	Deadline    time.Time // running deadline, set by Claimed

	Delivery Delivery
	Claim    Owner
	Result   *events.Result
	// Effects are every effect the task's runs reported (EffectsReported
	// and the result's), merged by kind and ref (a later report of the same
	// pair replaces the earlier in its place); nil when there are none.
	Effects []events.Effect `msgpack:",omitempty"`
	// Retries are the task's attempts that ended in a RetryScheduled, in
	// order; nil for a task on its first attempt.
	Retries  []Attempt `msgpack:",omitempty"`
	Reason   string    // why it was canceled, rejected, exhausted or timed out
	Rejected bool      // admission refused the task (AdmissionRejected)

	// Run is the latest revision of the task's Run (RunSaved); zero
	// before the first save.
	Run RunHead `msgpack:",omitempty"`

	MailIDs []string // mailbox message ids; MailIDs[i] has index i+1
	Cursor  int      // mailbox messages handed out by check
	// CheckFailedAt is when the task's last CheckFailed was recorded
	// (zero: none); the next may come CheckFailedInterval after it.
	CheckFailedAt time.Time `msgpack:",omitempty"`

	Version  int             // number of events applied
	FirstSeq events.Position // log position of the first event (the task's spec)
	LastSeq  events.Position // log position of the last event applied
	// LastHash is the Hash of the last event applied, the Prev of the
	// task's next event; zero when that event's Hash was not set.
	LastHash events.Hash `msgpack:",omitempty"`
}

// RunHead is the latest saved revision of a task's Run, as its RunSaved
// records it.
type RunHead struct {
	Revision uint64
	Digest   string
	Size     int
}

// Attempt is one run of a task: the claim that started it and how it
// ended. Outcome is the cause of a retry (events.RetryOnFailed,
// events.RetryOnTimedOut), the task's status for its last attempt, or
// "running"; NextAt is when the attempt after a retried one was due.
type Attempt struct {
	Number     int
	DeliveryID string // the token the attempt was claimed with
	ExecutorID string
	StartedAt  time.Time
	EndedAt    time.Time
	Outcome    string
	Error      string
	NextAt     time.Time
}

// Attempt is the number of the task's current (or last) attempt, from 1.
func (s State) Attempt() int { return len(s.Retries) + 1 }

// The outcomes of an attempt that ended in a ClaimLost.
const (
	OutcomeClaimLost = "claim_lost" // its executor missed a heartbeat
	OutcomeReleased  = "released"   // its executor handed the claim back
)

// ReasonHeartbeat is the Reason of a task that timed out because its last
// attempt's executor missed a heartbeat and no attempt was left.
const ReasonHeartbeat = "heartbeat missed"

// Charged is the number of the current attempt as the retry policy counts
// it: released claims (up to events.MaxFreeReleases of them) are not
// charged, so a graceful hand-over never uses up the policy.
func (s State) Charged() int {
	released := 0
	for _, a := range s.Retries {
		if a.Outcome == OutcomeReleased {
			released++
		}
	}
	return s.Attempt() - min(released, events.MaxFreeReleases)
}

// HeartbeatDue is when the running claim's heartbeat is due as the log
// knows it: one interval after the claim (renewals are not in the log).
// Zero for a claim without heartbeats or a task not running.
func (s State) HeartbeatDue() time.Time {
	if s.Status != StatusRunning || s.Claim.HeartbeatSeconds <= 0 {
		return time.Time{}
	}
	return s.StartedAt.Add(time.Duration(s.Claim.HeartbeatSeconds) * time.Second)
}

// ExpiresAt is when the running claim ends unless renewed: its heartbeat
// due time (HeartbeatDue) if it has one before the running deadline, else
// the deadline. Zero for a task not running.
func (s State) ExpiresAt() time.Time {
	if s.Status != StatusRunning {
		return time.Time{}
	}
	if hb := s.HeartbeatDue(); !hb.IsZero() && hb.Before(s.Deadline) {
		return hb
	}
	return s.Deadline
}

// LostClaim reports whether deliveryID is the token of a claim that
// ended in a ClaimLost: its executor's late writes get ErrClaimLost.
func (s State) LostClaim(deliveryID string) bool {
	if deliveryID == "" {
		return false
	}
	if s.Status == StatusTimedOut && s.Reason == ReasonHeartbeat && s.Claim.DeliveryID == deliveryID {
		return true
	}
	return slices.ContainsFunc(s.Retries, func(a Attempt) bool {
		return a.DeliveryID == deliveryID && (a.Outcome == OutcomeClaimLost || a.Outcome == OutcomeReleased)
	})
}

// MaxAttempts is how many attempts the task's retry policy allows, 1
// without one.
func (s State) MaxAttempts() int {
	if s.Spec.Retry == nil {
		return 1
	}
	return s.Spec.Retry.MaxAttempts
}

// DueAt is when the task's current attempt is due to be released: its
// runAt, or after a retry the retry's nextAt.
func (s State) DueAt() time.Time {
	if n := len(s.Retries); n > 0 {
		return s.Retries[n-1].NextAt
	}
	return s.Spec.RunAt
}

// WaitsForSlot reports whether s is a task with a concurrency key that is
// due at now (its runAt, or a retry's nextAt) and not released: it waits
// for a slot of its key (or, for the moment between its due time and the
// alarm's release, for the alarm).
func (s State) WaitsForSlot(now time.Time) bool {
	return s.Spec.Concurrency != nil && s.Status == StatusScheduled && s.Delivery.ID == "" && !now.Before(s.DueAt())
}

// Attempts lists every attempt that started: the retried ones and then
// the current or last one, if it was claimed. Nil when none started.
func (s State) Attempts() []Attempt {
	out := slices.Clone(s.Retries)
	if s.StartedAt.IsZero() {
		return out
	}
	return append(out, s.current(s.CompletedAt, string(s.Status), s.Result))
}

// current is the task's current attempt, ended at end (zero: not yet)
// with outcome and result r (nil: none).
func (s State) current(end time.Time, outcome string, r *events.Result) Attempt {
	a := Attempt{Number: s.Attempt(), DeliveryID: s.Claim.DeliveryID, ExecutorID: s.Claim.ExecutorID, StartedAt: s.StartedAt, EndedAt: end, Outcome: outcome}
	if r != nil {
		a.Error = r.Error
	}
	return a
}

// Exists reports whether any event has been applied.
func (s State) Exists() bool { return s.Version > 0 }

// Claimable reports whether a claim with the current token would succeed.
func (s State) Claimable() bool {
	return (s.Status == StatusScheduled || s.Status == StatusQueued) && s.Delivery.ID != ""
}

// MailIndex returns the 1-based index of the mailbox message with id, or 0.
func (s State) MailIndex(id string) int {
	return slices.Index(s.MailIDs, id) + 1
}

// Replay folds a task's events, in log order, into its State.
func Replay(evs []events.Event) State {
	var s State
	for _, ev := range evs {
		s = Apply(s, ev)
	}
	return s
}

// Apply returns s with ev applied. The log is the truth, so Apply accepts
// any event, but it never moves a task backwards or sideways: an event the
// transition table does not allow from the current status (a second
// TaskScheduled, a Claimed for a running task, anything lifecycle after a
// terminal event, a ReadyPublished for another or an already claimed
// delivery) changes nothing but Version and LastSeq. The verifier reports
// such events; Decide never produces them.
func Apply(s State, ev events.Event) State {
	s.Version++
	if s.Version == 1 {
		s.FirstSeq = ev.Seq
	}
	s.LastSeq, s.LastHash = ev.Seq, ev.Hash
	if s.Status.Terminal() {
		switch p := ev.Data.(type) {
		case events.MailboxAppended:
			s.MailIDs = appendID(s.MailIDs, p.Message.ID)
		case events.MailboxRead:
			s.Cursor = max(s.Cursor, p.Cursor)
		}
		return s
	}
	switch p := ev.Data.(type) {
	case events.TaskScheduled:
		if s.Version == 1 {
			s.TaskID, s.CustomerID, s.Spec = ev.TaskID, ev.CustomerID, p.Spec
			s.Status, s.CreatedAt = StatusScheduled, ev.At
			if p.DeliveryID != "" { // released at once, as a DeliveryPending would
				s.Delivery = Delivery{ID: p.DeliveryID, Attempt: 1, NextAt: p.NextAt, FirstAt: ev.At}
			}
		}
	case events.AdmissionRejected:
		if s.Version == 1 {
			s.TaskID, s.CustomerID, s.Spec = ev.TaskID, ev.CustomerID, p.Spec
			s.CreatedAt, s.Rejected = ev.At, true
			s = finish(s, StatusCanceled, ev.At, p.Reason)
		}
	case events.DeliveryPending:
		if s.Status == StatusScheduled && s.Delivery.ID == "" {
			s.Delivery = Delivery{ID: p.DeliveryID, Attempt: p.Attempt, NextAt: p.NextAt, FirstAt: p.NextAt}
		}
	case events.DeliveryRetryScheduled:
		if s.currentDelivery(p.DeliveryID) {
			s.Delivery.Attempt, s.Delivery.NextAt = p.Attempt, p.NextAt
		}
	case events.DeliveryExhausted:
		if s.currentDelivery(p.DeliveryID) {
			s = finish(s, StatusFailed, ev.At, p.Reason)
		}
	case events.ReadyPublished:
		if s.currentDelivery(p.DeliveryID) {
			s.Delivery.Published, s.Delivery.ReadySeq, s.Delivery.NextAt = true, p.ReadySeq, ev.At
			if s.Status == StatusScheduled {
				s.Status = StatusQueued
			}
		}
	case events.ReadyRepublished:
		if s.Status == StatusQueued && s.currentDelivery(p.DeliveryID) {
			s.Delivery.ReadySeq, s.Delivery.NextAt = p.ReadySeq, ev.At
		}
	case events.Claimed:
		if s.Status == StatusScheduled || s.Status == StatusQueued {
			s.Status, s.StartedAt, s.Deadline = StatusRunning, ev.At, p.Deadline
			s.Claim = Owner{DeliveryID: p.DeliveryID, ExecutorID: p.ExecutorID, HeartbeatSeconds: p.HeartbeatSeconds}
		}
	case events.ClaimLost:
		switch {
		case s.Status != StatusRunning || p.DeliveryID != s.Claim.DeliveryID:
		case p.Attempt == 0:
			s = finish(s, StatusTimedOut, ev.At, ReasonHeartbeat)
		default:
			outcome := OutcomeClaimLost
			if p.Reason == events.ClaimLostReleased {
				outcome = OutcomeReleased
			}
			a := s.current(ev.At, outcome, nil)
			a.Error, a.NextAt = p.Note, ev.At
			s.Retries = append(slices.Clip(s.Retries), a)
			s.Status, s.Delivery, s.Claim = StatusScheduled, Delivery{}, Owner{}
			s.StartedAt, s.Deadline = time.Time{}, time.Time{}
		}
	case events.EffectsReported:
		if s.Status == StatusRunning && p.DeliveryID == s.Claim.DeliveryID {
			s.Effects = mergeEffects(s.Effects, p.Effects, ev.At)
		}
	case events.RunSaved:
		if s.Status == StatusRunning && p.DeliveryID == s.Claim.DeliveryID && p.Revision == s.Run.Revision+1 {
			s.Run = RunHead{Revision: p.Revision, Digest: p.Digest, Size: p.Size}
		}
	case events.TimedOut:
		if s.Status == StatusRunning {
			s = finish(s, StatusTimedOut, ev.At, "running deadline passed")
		}
	case events.RetryScheduled:
		if s.Status == StatusRunning {
			a := s.current(ev.At, p.Cause, p.Result)
			a.NextAt = p.NextAt
			if p.Result != nil {
				s.Effects = resultEffects(s.Effects, p.Result.Effects, ev.At)
			}
			s.Retries = append(slices.Clip(s.Retries), a)
			s.Status, s.Delivery, s.Claim = StatusScheduled, Delivery{}, Owner{}
			s.StartedAt, s.Deadline = time.Time{}, time.Time{}
		}
	case events.ResultRecorded:
		if s.Exists() {
			r := p.Result
			s.Result = &r
			s.Effects = resultEffects(s.Effects, r.Effects, ev.At)
			status := StatusFailed
			if r.Success {
				status = StatusSucceeded
			}
			s = finish(s, status, ev.At, "")
		}
	case events.Canceled:
		if s.Exists() {
			s = finish(s, StatusCanceled, ev.At, p.Reason)
		}
	case events.MailboxAppended:
		s.MailIDs = appendID(s.MailIDs, p.Message.ID)
	case events.MailboxRead:
		s.Cursor = max(s.Cursor, p.Cursor)
	case events.CheckFailed:
		s.CheckFailedAt = ev.At
	}
	return s
}

// currentDelivery reports whether id names the task's pending delivery.
func (s State) currentDelivery(id string) bool {
	return (s.Status == StatusScheduled || s.Status == StatusQueued) && id != "" && s.Delivery.ID == id
}

func finish(s State, status Status, at time.Time, reason string) State {
	s.Status, s.CompletedAt, s.Reason = status, at, reason
	return s
}

// appendID appends without writing into an array another State may share.
func appendID(ids []string, id string) []string {
	return append(ids[:len(ids):len(ids)], id)
}

// resultEffects merges a result's effects into the task's. A result is
// never refused for its effects: those that would take the task past
// MaxTaskEffects stay in the result only.
func resultEffects(have, add []events.Effect, at time.Time) []events.Effect {
	out := mergeEffects(have, add, at)
	return out[:min(len(out), events.MaxTaskEffects)]
}

// mergeEffects returns have with add merged in: an effect of the same kind
// and ref as one before it (in have or earlier in add) replaces that one
// in its place, any other is appended, and a zero At becomes at. It never
// writes into have's array, which another State may share; with nothing
// to add it returns have itself.
func mergeEffects(have, add []events.Effect, at time.Time) []events.Effect {
	if len(add) == 0 {
		return have
	}
	out := slices.Clone(have)
	for _, e := range add {
		if e.At.IsZero() {
			e.At = at
		}
		if i := slices.IndexFunc(out, func(o events.Effect) bool { return events.SameEffect(o, e) }); i >= 0 {
			out[i] = e
		} else {
			out = append(out, e)
		}
	}
	return out
}
