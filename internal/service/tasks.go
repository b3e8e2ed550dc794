package service

import (
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// ScheduleRequest is a request for a new task (POST /v1/tasks).
type ScheduleRequest struct {
	CustomerID     string
	ParentID       string
	RequestID      string
	RelatedTaskID  string
	Signal         events.Signal
	Repo           string
	Queue          string
	Message        events.Message
	RunAt          *time.Time
	DelaySeconds   *float64
	TimeoutSeconds *int
	Concurrency    *events.Concurrency
	Retry          *api.RetryRequest // nil: one attempt
	Labels         map[string]string
	Kind           string
	Payload        []byte // JSON; nil for none
}

// RetryTaskRequest asks for a new task repeating a terminal one (POST
// /v1/tasks/{id}/retry, a manual retry; not the retry policy). Every field
// is optional.
type RetryTaskRequest struct {
	// RequestID makes the retry idempotent, as for Schedule: a repeat
	// answers the task the first call made. It shares Schedule's request
	// ids.
	RequestID string
	// Message replaces the retried task's objective.
	Message *events.Message
	// RunAt is when the new task is due; default now.
	RunAt *time.Time
}

// TaskFilter selects the tasks of List (GET /v1/tasks). Empty fields
// match everything.
type TaskFilter struct {
	Status     aggregate.Status
	Queue      string
	CustomerID string
	RootID     string
	// TaskID selects the one task with that id (a request id's task,
	// Service.RequestFilter).
	TaskID string
	// Labels selects tasks carrying every one of these key=value pairs.
	Labels map[string]string
	// Kind selects the tasks of that kind.
	Kind string
	// CreatedAfter and CreatedBefore select tasks created strictly
	// after and strictly before them; zero is no bound.
	CreatedAfter, CreatedBefore time.Time
	// IDPrefix selects the tasks whose id starts with it.
	IDPrefix string
}

// Node is one task of a tree with its children.
type Node struct {
	Task     aggregate.State
	Children []Node
}

// KeyView is a concurrency key as the projections have it: the tasks that
// hold its slots, in the order they took them, and those due and waiting
// for one, first due first.
type KeyView struct {
	CustomerID, Key  string
	Holders, Waiters []aggregate.State
}

// MailItem is one mailbox message with its 1-based index.
type MailItem struct {
	Index   int
	Message events.Message
}

// CheckResult answers an executor's stop check.
type CheckResult struct {
	ShouldStop bool
	Reason     string
	Messages   []MailItem
	Cursor     int
}

// Outcome is one item's answer in a batch: the task and whether the call
// created it, or the error a single call would have returned.
type Outcome struct {
	State   aggregate.State
	Created bool
	Err     error
}

// ResultItem is one result of RecordResults.
type ResultItem struct {
	TaskID, DeliveryID string
	Result             events.Result
}

// MaxWait is the longest long poll of ClaimNext and ClaimBatch.
const MaxWait = api.MaxWaitSeconds * time.Second
