package events

import (
	"crypto/sha256"
	"encoding/json"
	"time"
)

// Type names an event kind. The names are part of the stored log: never
// rename one, add a new type instead.
type Type string

// The v1 event types. Names are constants stored in every envelope:
// never rename one; add a new type instead.
const (
	TypeTaskScheduled          Type = "TaskScheduled"
	TypeAdmissionRejected      Type = "AdmissionRejected"
	TypeDeliveryPending        Type = "DeliveryPending"
	TypeDeliveryRetryScheduled Type = "DeliveryRetryScheduled"
	TypeDeliveryExhausted      Type = "DeliveryExhausted"
	TypeReadyPublished         Type = "ReadyPublished"
	TypeReadyRepublished       Type = "ReadyRepublished"
	TypeClaimed                Type = "Claimed"
	TypeTimedOut               Type = "TimedOut"
	TypeResultRecorded         Type = "ResultRecorded"
	TypeCanceled               Type = "Canceled"
	TypeMailboxAppended        Type = "MailboxAppended"
	TypeMailboxRead            Type = "MailboxRead"
	TypeEffectsReported        Type = "EffectsReported"
	TypeCheckFailed            Type = "CheckFailed"
	TypeClaimLost              Type = "ClaimLost"
	TypeRunSaved               Type = "RunSaved"

	// The events of a concurrency key (KeyEvent): on the key's own
	// subject, <root>.conc.<customerId>.<keyId>, never a task's.
	TypeSlotAcquired   Type = "SlotAcquired"
	TypeSlotReleased   Type = "SlotReleased"
	TypeRetryScheduled Type = "RetryScheduled"
)

// KeyEvent reports whether events of type t belong to a concurrency key
// (their TaskID is the key's id, KeyID) rather than to a task.
func KeyEvent(t Type) bool { return t == TypeSlotAcquired || t == TypeSlotReleased }

// Payload is the typed body of an event. Every payload type in this package
// implements it; no other type should.
type Payload interface {
	EventType() Type
}

// Event is one immutable lifecycle fact about one task.
type Event struct {
	ID         string    // unique per append attempt; the Nats-Msg-Id of an append to a replicated stream
	Version    uint8     // schema version of Data; 0 means current on encode
	TaskID     string    // the task the fact is about
	CustomerID string    // owner of the task
	Number     int       // 1-based position in the task's history: gap-free per task
	At         time.Time // when the scheduler decided the fact
	Actor      string    // scheduler node or executor id
	// Prev is the SHA-256 of the stored bytes of the task's previous
	// event: the link of the task's hash chain. It is zero on a task's
	// first event and on v1 events, which predate the chain.
	Prev Hash
	// Key is the id of the chain key whose HMAC ends the event's stored
	// bytes (Keyring), 0 for an unkeyed event: one written before the
	// log's chain was keyed, or encoded without a Keyring.
	Key  uint32
	Data Payload

	// Seq is the log position the event was stored at (with one part,
	// its stream sequence). It is set when an event is read from the log
	// and is not part of the encoding.
	Seq Position
	// Hash is the SHA-256 of the event's stored bytes, set by a reader
	// that continues or checks the chain (DecodeHashed) and by the store
	// when it appends. It is not part of the encoding.
	Hash Hash
}

// Hash is the SHA-256 of an event's stored bytes.
type Hash [sha256.Size]byte

// HashOf returns the hash of an event's stored bytes.
func HashOf(b []byte) Hash { return sha256.Sum256(b) }

// IsZero reports whether h is the zero hash: no previous event.
func (h Hash) IsZero() bool { return h == Hash{} }

// Type returns the type of the event's payload.
func (e Event) Type() Type { return e.Data.EventType() }

// Signal correlates a task with what caused it (a webhook, a chat message).
type Signal struct {
	ID          string `json:"id,omitempty"`
	URI         string `json:"uri,omitempty"`
	RequestID   string `json:"requestId,omitempty"`
	EventType   string `json:"eventType,omitempty"`
	EventAction string `json:"eventAction,omitempty"`
}

// ContentPart is one part of a message; today only {"type": "text"}.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
}

// Message is a task's objective or a mailbox item.
type Message struct {
	ID        string        `json:"id,omitempty"`
	CreatedAt time.Time     `json:"createdAt"`
	Content   []ContentPart `json:"content"`
}

// Effect is an external change a run made (a pull request, a comment).
type Effect struct {
	Kind string `json:"kind"`
	Ref  string `json:"ref,omitempty"`
	URL  string `json:"url,omitempty"`
	// Uncertain marks an effect whose outcome an executor could not
	// confirm after a crash.
	Uncertain bool `json:"uncertain,omitempty"`
	// At is when the effect happened, as the executor says. Where the
	// executor left it zero, an EffectsReported carries the time of the
	// report, and a task's merged effects the time of the event that
	// brought each; a result keeps its effects as reported, so there it
	// may be zero. A zero At is left out of the stored bytes: effects
	// without one encode as they did before the field existed.
	At time.Time `json:"at,omitzero" msgpack:"at,omitempty"`
}

// SameEffect reports whether a and b name the same effect: the same kind
// and ref. A later report of it replaces the earlier one.
func SameEffect(a, b Effect) bool { return a.Kind == b.Kind && a.Ref == b.Ref }

// Result is what an executor reported when a task finished.
type Result struct {
	Success bool     `json:"success"`
	Summary string   `json:"summary,omitempty"`
	Error   string   `json:"error,omitempty"`
	Effects []Effect `json:"effects,omitempty"`
	// Retryable false says a failure is final: the task fails even with
	// attempts left in its retry policy. Nil (left out) means true.
	Retryable *bool `json:"retryable,omitempty"`
	// Output is the run's structured result, compact JSON of at most
	// MaxOutputBytes; nil for none, and then left out of the stored
	// bytes, so results without one encode as before.
	Output json.RawMessage `json:"output,omitempty"`
}

// Retry causes: what ended an attempt that a RetryScheduled follows, and
// the values of RetryPolicy.On.
const (
	RetryOnFailed   = "failed"
	RetryOnTimedOut = "timed_out"
)

// RetryPolicy says how often a task is tried and how long it waits between
// attempts. A stored policy is complete: the service fills the defaults
// and the aggregate refuses a policy out of its bounds (see
// aggregate.Schedule).
type RetryPolicy struct {
	MaxAttempts       int      `json:"maxAttempts"`
	BackoffSeconds    int      `json:"backoffSeconds"`
	MaxBackoffSeconds int      `json:"maxBackoffSeconds"`
	On                []string `json:"on"` // RetryOnFailed and/or RetryOnTimedOut
}

// TaskSpec is everything a caller chose about a task when scheduling it.
type TaskSpec struct {
	RootID         string    `json:"rootId"`
	ParentID       string    `json:"parentId,omitempty"`
	RequestID      string    `json:"requestId,omitempty"`
	RelatedTaskID  string    `json:"relatedTaskId,omitempty"`
	Queue          string    `json:"queue"`
	Signal         Signal    `json:"signal"`
	Repo           string    `json:"repo,omitempty"`
	Message        Message   `json:"message"`
	RunAt          time.Time `json:"runAt"`
	TimeoutSeconds int       `json:"timeoutSeconds"`
	// Retry is the task's retry policy; nil (left out of the stored
	// bytes, as in every event written before it existed) is one attempt.
	Retry *RetryPolicy `json:"retry,omitempty"`
	// Concurrency, if set, limits how many tasks of the customer with
	// the same key hold a delivery token or run at once. Absent from the
	// stored bytes when nil, so older events encode as before.
	Concurrency *Concurrency `json:"concurrency,omitempty"`
	// Labels are the caller's key=value pairs for search (GET
	// /v1/tasks?label=); nil when there are none. Added after v1 as an
	// optional key: a spec without labels encodes, and old specs decode,
	// as before.
	Labels map[string]string `json:"labels,omitempty"`
	// RetryOf is the terminal task this one retries (POST
	// /v1/tasks/{id}/retry); it equals RelatedTaskID. Empty for any other
	// task, and left out of the stored bytes then, as Labels is.
	RetryOf string `json:"retryOf,omitempty"`
	// Kind names the sort of job the task is, for executors to route on
	// (ValidKind); Payload is its arguments, compact JSON of at most
	// MaxPayloadBytes. Empty (nil) for a task without them, and left out
	// of the stored bytes then, as Labels is.
	Kind    string          `json:"kind,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Concurrency is a task's concurrency limit: at most Limit tasks of its
// customer with Key hold a slot of the key at once (MaxNameBytes,
// MinConcurrencyLimit..MaxConcurrencyLimit).
type Concurrency struct {
	Key   string `json:"key"`
	Limit int    `json:"limit"`
}

// TaskScheduled records that a task was accepted. It waits for RunAt to be
// released, unless DeliveryID is set (since v3): a task due when it was
// scheduled is released in the same event, as a DeliveryPending would,
// with the delivery token DeliveryID (attempt 1) whose notification the
// alarm publishes at NextAt if the scheduler that wrote the event has not
// recorded it published by then.
type TaskScheduled struct {
	Spec       TaskSpec  `json:"spec"`
	DeliveryID string    `json:"deliveryId,omitempty"`
	NextAt     time.Time `json:"nextAt,omitempty,omitzero"` // omitempty for msgpack, omitzero for JSON
}

// AdmissionRejected records that admission refused a new task. The candidate is kept
// so a retry with the same request id sees the same outcome.
type AdmissionRejected struct {
	Spec   TaskSpec `json:"spec"`
	Reason string   `json:"reason"`
}

// DeliveryPending records that the task was released; a ready notification carrying
// DeliveryID is due at NextAt.
type DeliveryPending struct {
	DeliveryID string    `json:"deliveryId"`
	Attempt    int       `json:"attempt"`
	NextAt     time.Time `json:"nextAt"`
}

// DeliveryRetryScheduled records that publishing the notification failed; attempt
// Attempt of the same DeliveryID is due at NextAt.
type DeliveryRetryScheduled struct {
	DeliveryID string    `json:"deliveryId"`
	Attempt    int       `json:"attempt"`
	NextAt     time.Time `json:"nextAt"`
	Error      string    `json:"error,omitempty"`
}

// DeliveryExhausted records that the notification could not be published within the
// bounded attempts. The task has failed.
type DeliveryExhausted struct {
	DeliveryID string `json:"deliveryId"`
	Attempts   int    `json:"attempts"`
	Reason     string `json:"reason"`
}

// ReadyPublished records that the ready notification for DeliveryID was published.
// ReadySeq is its sequence in the ready stream (0 in events written before
// it was recorded: unknown), so a later check can tell whether it is still
// there.
type ReadyPublished struct {
	DeliveryID string `json:"deliveryId"`
	ReadySeq   uint64 `json:"readySeq,omitempty"`
}

// ReadyRepublished records that the notification for DeliveryID, last
// recorded at LostSeq of the ready stream (0: unknown), was no longer
// there while the task stayed queued, and was published again, at
// ReadySeq, with the same token.
type ReadyRepublished struct {
	DeliveryID string `json:"deliveryId"`
	LostSeq    uint64 `json:"lostSeq,omitempty"`
	ReadySeq   uint64 `json:"readySeq"`
}

// Claimed records that an executor consumed the delivery token and owns the run
// until Deadline. HeartbeatSeconds, if not 0, is the interval the executor
// promised to renew the claim within (POST /v1/tasks/{id}/heartbeat); a
// claim not renewed within it is lost (ClaimLost). 0 (left out of the
// stored bytes, as in every event written before it existed) is a claim
// without heartbeats, held until Deadline.
type Claimed struct {
	DeliveryID       string    `json:"deliveryId"`
	ExecutorID       string    `json:"executorId"`
	Deadline         time.Time `json:"deadline"`
	HeartbeatSeconds int       `json:"heartbeatSeconds,omitempty"`
}

// TimedOut records that the running deadline passed without a result.
type TimedOut struct {
	Deadline time.Time `json:"deadline"`
}

// ResultRecorded records that the task finished with Result.
type ResultRecorded struct {
	DeliveryID string `json:"deliveryId,omitempty"`
	Result     Result `json:"result"`
}

// Canceled records that someone canceled the task.
type Canceled struct {
	Reason string `json:"reason,omitempty"`
}

// ReasonAncestorTerminal is the reason of the Canceled the scheduler
// records, in place of a claim or a release, for a task one of whose
// ancestors has ended: a lineage closes lazily, one task at a time.
const ReasonAncestorTerminal = "ancestor_terminal"

// EffectsReported records effects the run under DeliveryID made while it
// was running (POST /v1/tasks/{id}/effects), each with its At set.
type EffectsReported struct {
	DeliveryID string   `json:"deliveryId"`
	Effects    []Effect `json:"effects"`
}

// RunSaved records that the run under DeliveryID saved revision Revision
// of the task's Run (PUT /v1/tasks/{id}/run): revision Revision-1 and
// the change stored beside the log give a Run whose canonical bytes are
// Size long and hash to Digest (SHA-256, lowercase hex). The Run's bytes
// are not in the log; the digest lets an auditor check them.
type RunSaved struct {
	DeliveryID string `json:"deliveryId"`
	Revision   uint64 `json:"revision"`
	Digest     string `json:"digest"`
	Size       int    `json:"size"`
}

// SlotAcquired records that task TaskID took one of the slots of the
// concurrency key Key, whose limit for it was Limit: the key then had
// fewer than Limit holders. Only a holder is released. Attempt is the
// task's attempt the slot is for, 0 (left out of the stored bytes, as in
// every event written before retries released slots) for the first.
type SlotAcquired struct {
	Key     string `json:"key"`
	TaskID  string `json:"taskId"`
	Limit   int    `json:"limit"`
	Attempt int    `json:"attempt,omitempty"`
}

// SlotReleased records that task TaskID, a holder of Key, gave its slot
// back, with the task's status then: terminal, or scheduled for a retry
// (RetryScheduled). Attempt is the attempt the slot was taken for, as in
// SlotAcquired (0 for the first).
type SlotReleased struct {
	Key     string `json:"key"`
	TaskID  string `json:"taskId"`
	Status  string `json:"status,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
}

// RetryScheduled records that attempt Attempt-1 ended without success and
// attempt Attempt is due at NextAt: the task is scheduled again and is
// released, with a new delivery token, at NextAt. Cause is RetryOnFailed
// (Result is the failure the run reported under DeliveryID, its effects
// kept with the task's) or RetryOnTimedOut (Deadline is the running
// deadline that passed).
type RetryScheduled struct {
	Attempt    int       `json:"attempt"`
	NextAt     time.Time `json:"nextAt"`
	Cause      string    `json:"cause"`
	DeliveryID string    `json:"deliveryId,omitempty"`
	Result     *Result   `json:"result,omitempty"`
	Deadline   time.Time `json:"deadline,omitzero" msgpack:"deadline,omitempty"`
}

// The reasons of a ClaimLost.
const (
	// ClaimLostHeartbeat: the executor missed its heartbeat.
	ClaimLostHeartbeat = "heartbeat"
	// ClaimLostReleased: the executor handed the claim back (POST
	// /v1/tasks/{id}/release), for instance when shutting down.
	ClaimLostReleased = "released"
)

// ClaimLost records that the claim under DeliveryID, of ExecutorID,
// ended without a result, for Reason (ClaimLostHeartbeat or
// ClaimLostReleased; Note is the releaser's words). With Attempt set the
// task is scheduled again for that attempt, due at once: the next release
// gives it a new delivery token, as after a RetryScheduled. Attempt 0
// says no attempt was left: the task timed out.
type ClaimLost struct {
	DeliveryID string `json:"deliveryId"`
	ExecutorID string `json:"executorId"`
	Reason     string `json:"reason"`
	Note       string `json:"note,omitempty"`
	Attempt    int    `json:"attempt,omitempty"`
}

// MailboxAppended records that a follow-up message was added at 1-based Index.
type MailboxAppended struct {
	Index   int     `json:"index"`
	Message Message `json:"message"`
}

// MailboxRead records that the scheduler handed out messages up to Cursor.
type MailboxRead struct {
	Cursor int `json:"cursor"`
}

func (TaskScheduled) EventType() Type          { return TypeTaskScheduled }
func (AdmissionRejected) EventType() Type      { return TypeAdmissionRejected }
func (DeliveryPending) EventType() Type        { return TypeDeliveryPending }
func (DeliveryRetryScheduled) EventType() Type { return TypeDeliveryRetryScheduled }
func (DeliveryExhausted) EventType() Type      { return TypeDeliveryExhausted }
func (ReadyPublished) EventType() Type         { return TypeReadyPublished }
func (ReadyRepublished) EventType() Type       { return TypeReadyRepublished }
func (Claimed) EventType() Type                { return TypeClaimed }
func (TimedOut) EventType() Type               { return TypeTimedOut }
func (ResultRecorded) EventType() Type         { return TypeResultRecorded }
func (Canceled) EventType() Type               { return TypeCanceled }
func (MailboxAppended) EventType() Type        { return TypeMailboxAppended }
func (MailboxRead) EventType() Type            { return TypeMailboxRead }
func (EffectsReported) EventType() Type        { return TypeEffectsReported }
func (RunSaved) EventType() Type               { return TypeRunSaved }
func (SlotAcquired) EventType() Type           { return TypeSlotAcquired }
func (SlotReleased) EventType() Type           { return TypeSlotReleased }
func (RetryScheduled) EventType() Type         { return TypeRetryScheduled }
func (ClaimLost) EventType() Type              { return TypeClaimLost }

// CheckFailed records that stop checks of the task failed (they answered
// check_failed, fail-open) from Since on, Failures of them, the last with
// Error: whether the task should stop could not be verified then. The
// scheduler records at most one a minute per task; failures in between
// are counted in the next.
type CheckFailed struct {
	Since    time.Time `json:"since"`
	Failures int       `json:"failures"`
	Error    string    `json:"error,omitempty"`
}

func (CheckFailed) EventType() Type { return TypeCheckFailed }

// CreationRoot returns the root a task's creation names (its
// TaskScheduled or AdmissionRejected), "" for any other event.
func CreationRoot(ev Event) string {
	switch p := ev.Data.(type) {
	case TaskScheduled:
		return p.Spec.RootID
	case AdmissionRejected:
		return p.Spec.RootID
	}
	return ""
}
