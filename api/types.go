// Package api is taskledger's wire contract and Go client: the request
// and response types of the HTTP API (docs/API.md), the typed errors a
// client gets back, and Client. It links no server code.
package api

import (
	"encoding/json"
	"time"

	"github.com/taskledger/taskledger/events"
)

// Task is the task resource.
type Task struct {
	ID            string         `json:"id"`
	RootID        string         `json:"rootId"`
	ParentID      string         `json:"parentId,omitempty"`
	RelatedTaskID string         `json:"relatedTaskId,omitempty"`
	CustomerID    string         `json:"customerId"`
	RequestID     string         `json:"requestId,omitempty"`
	Queue         string         `json:"queue"`
	Signal        *events.Signal `json:"signal,omitempty"`
	Repo          string         `json:"repo,omitempty"`
	Message       events.Message `json:"message"`
	// Labels are the task's key=value pairs, as scheduled.
	Labels map[string]string `json:"labels,omitempty"`
	// RetryOf is the task this one retries (POST /v1/tasks/{id}/retry);
	// RelatedTaskID names it too.
	RetryOf string `json:"retryOf,omitempty"`
	// Kind and Payload are the task's kind and its payload (compact
	// JSON), as scheduled; left out when it has none. A list (GET
	// /v1/tasks) and a tree (GET /v1/tasks/{id}/tree) leave the payload
	// out: read the task for it.
	Kind           string          `json:"kind,omitempty"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	Status         string          `json:"status"`
	CreatedAt      time.Time       `json:"createdAt,omitzero"`
	RunAt          time.Time       `json:"runAt,omitzero"`
	StartedAt      time.Time       `json:"startedAt,omitzero"`
	CompletedAt    time.Time       `json:"completedAt,omitzero"`
	TimeoutSeconds int             `json:"timeoutSeconds"`
	Deadline       time.Time       `json:"deadline,omitzero"`
	Delivery       *Delivery       `json:"delivery,omitempty"`
	Claim          *Claim          `json:"claim,omitempty"`
	Mailbox        Mailbox         `json:"mailbox"`
	Result         *events.Result  `json:"result,omitempty"`
	// Effects are every effect reported so far (POST /v1/tasks/{id}/effects
	// and the result's), merged by kind and ref.
	Effects []events.Effect `json:"effects,omitempty"`
	Reason  string          `json:"reason,omitempty"`
	// Retry is the task's retry policy, with its defaults filled in;
	// absent for a task without one (a single attempt).
	Retry *events.RetryPolicy `json:"retry,omitempty"`
	// Attempt is the number of the current (or last) attempt, from 1;
	// MaxAttempts how many the retry policy allows.
	Attempt     int `json:"attempt"`
	MaxAttempts int `json:"maxAttempts"`
	// Attempts lists the attempts that started, in order.
	Attempts []Attempt `json:"attempts"`
	Version  int       `json:"version"`
	// Concurrency is the task's concurrency limit, as scheduled.
	Concurrency *events.Concurrency `json:"concurrency,omitempty"`
	// WaitingFor says why a due task is not released: "concurrency"
	// while every slot of its concurrency key is held. Empty otherwise.
	WaitingFor string `json:"waitingFor,omitempty"`
}

// WaitingForConcurrency is Task.WaitingFor of a due task whose
// concurrency key has no free slot.
const WaitingForConcurrency = "concurrency"

// ConcurrencyKey is the answer of GET /v1/concurrency: a customer's
// concurrency key, the tasks holding its slots (in the order they took
// them) and those waiting for one (first due first).
type ConcurrencyKey struct {
	CustomerID string       `json:"customerId"`
	Key        string       `json:"key"`
	Holders    []KeySlotter `json:"holders"`
	Waiters    []KeySlotter `json:"waiters"`
}

// KeySlotter is a task holding or waiting for a slot of a concurrency
// key. Status is empty for a holder that has left the projections
// (finished, its slot about to be released).
type KeySlotter struct {
	TaskID string    `json:"taskId"`
	Status string    `json:"status,omitempty"`
	Limit  int       `json:"limit,omitempty"`
	RunAt  time.Time `json:"runAt,omitzero"`
}

// Attempt is one run of a task. Outcome is "failed" or "timed_out" for
// an attempt that was retried, and for the current or last one the task's
// status then ("running", "succeeded", "failed", "canceled", "timed_out").
type Attempt struct {
	Attempt    int       `json:"attempt"`
	ExecutorID string    `json:"executorId"`
	StartedAt  time.Time `json:"startedAt"`
	EndedAt    time.Time `json:"endedAt,omitzero"`
	Outcome    string    `json:"outcome"`
	Error      string    `json:"error,omitempty"`
}

// Delivery is the task's current ready notification.
type Delivery struct {
	ID      string `json:"id"`
	Attempt int    `json:"attempt"`
}

// Claim says who consumed which delivery token, and the claim's
// heartbeat interval (0 or left out: none).
type Claim struct {
	DeliveryID       string `json:"deliveryId"`
	ExecutorID       string `json:"executorId"`
	HeartbeatSeconds int    `json:"heartbeatSeconds,omitempty"`
}

// Renewal is the answer of POST /v1/tasks/{id}/heartbeat: the claim is
// held until ExpiresAt unless renewed again, never after Deadline.
type Renewal struct {
	ExpiresAt time.Time `json:"expiresAt"`
	Deadline  time.Time `json:"deadline"`
}

// Mailbox counts a task's messages and the scheduler's read cursor.
type Mailbox struct {
	Count  int `json:"count"`
	Cursor int `json:"cursor"`
}

// TaskList is the answer of GET /v1/tasks.
type TaskList struct {
	Tasks []Task `json:"tasks"`
	Next  string `json:"next"`
}

// MailItem is one mailbox message as the API shows it.
type MailItem struct {
	ID        string               `json:"id"`
	Index     int                  `json:"index"`
	CreatedAt time.Time            `json:"createdAt"`
	Content   []events.ContentPart `json:"content"`
}

// Mail is the answer of GET /v1/tasks/{id}/mailbox.
type Mail struct {
	Messages []MailItem `json:"messages"`
	Cursor   int        `json:"cursor"`
}

// Check is the answer of POST /v1/tasks/{id}/check.
type Check struct {
	ShouldStop bool       `json:"shouldStop"`
	Reason     string     `json:"reason"`
	Messages   []MailItem `json:"messages"`
	Cursor     int        `json:"cursor"`
}

// MailAccepted is the answer of POST /v1/tasks/{id}/mailbox.
type MailAccepted struct {
	MessageID string `json:"messageId"`
	Index     int    `json:"index"`
}

// Event is one entry of a task's history: the logged event, plus the
// status it left its task in and a line saying what it meant.
type Event struct {
	// Seq is the event's log position; 0 (left out of the JSON) in the
	// answers to a customer token, where the log's positions would tell
	// how many events other tenants stored.
	Seq    uint64    `json:"seq,omitempty"`
	ID     string    `json:"id"`
	TaskID string    `json:"taskId"`
	Type   string    `json:"type"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor,omitempty"`
	Status string    `json:"status"`
	Detail string    `json:"detail"`
	Data   any       `json:"data"`
	// Cursor is, on the live event stream, the resume token after this
	// event (its SSE id): give it as after or Last-Event-ID. To a
	// customer token it is always there, opaque; to the operator it is
	// there on a sharded log, and left out with one shard, where Seq is
	// the token.
	Cursor string `json:"cursor,omitempty"`
}

// History is the answer of GET /v1/tasks/{id}/history.
type History struct {
	Events []Event `json:"events"`
}

// Tree is one node of GET /v1/tasks/{id}/tree.
type Tree struct {
	Task     Task   `json:"task"`
	Children []Tree `json:"children"`
}

// BatchItem is one item's outcome in the answer of a batch route, in
// request order: Status is what the single route would have answered
// (201 created, 200 existing or done, 4xx refused) with Task, or the
// error fields.
type BatchItem struct {
	Status  int    `json:"status"`
	Task    *Task  `json:"task,omitempty"`
	Code    string `json:"error,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Err returns the item's error as the single route's *Error (match it
// with errors.Is), or nil when the item succeeded.
func (b BatchItem) Err() error {
	if b.Code == "" {
		return nil
	}
	return &Error{Status: b.Status, Code: b.Code, Reason: b.Reason, Message: b.Message, Task: b.Task}
}

// BatchAnswer is the answer of POST /v1/tasks/batch and POST /v1/results.
type BatchAnswer struct {
	Results []BatchItem `json:"results"`
}

// ClaimedTasks is the answer of POST /v1/claims.
type ClaimedTasks struct {
	Tasks []Task `json:"tasks"`
}

// Task statuses as the API shows them.
const (
	StatusScheduled = "scheduled"
	StatusQueued    = "queued"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusCanceled  = "canceled"
	StatusTimedOut  = "timed_out"
)

// Reasons a stop check gives (Check.Reason).
const (
	ReasonActive           = "active"            // keep going
	ReasonTerminal         = "terminal"          // the task itself ended
	ReasonAncestorTerminal = "ancestor_terminal" // an ancestor ended: cancel this task too
	ReasonMissing          = "missing"           // the task is gone
	ReasonCheckFailed      = "check_failed"      // the check itself failed; fail-open, keep going
)
