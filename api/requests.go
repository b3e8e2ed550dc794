package api

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/taskledger/taskledger/events"
)

// MaxBodyBytes is the largest request body a server accepts; larger is
// 413 (ErrPayloadTooLarge).
const MaxBodyBytes = 1 << 20

// MaxRunBytes is the largest body of PUT /v1/tasks/{id}/run (RunSave);
// larger is 413 (ErrPayloadTooLarge).
const MaxRunBytes = 1 << 20

// Batch limits: POST /v1/tasks/batch, POST /v1/claims (max) and
// POST /v1/results take 1 to MaxBatchItems items in a body of at most
// MaxBatchBodyBytes.
const (
	MaxBatchItems     = 1000
	MaxBatchBodyBytes = 8 << 20
)

// Page sizes of GET /v1/tasks.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// MaxWaitSeconds is the longest long poll of POST /v1/claims/next; a
// longer waitSeconds is cut to it.
const MaxWaitSeconds = 60

// ScheduleRequest is the body of POST /v1/tasks.
type ScheduleRequest struct {
	CustomerID     string         `json:"customerId,omitempty"`
	ParentID       string         `json:"parentId,omitempty"`
	RequestID      string         `json:"requestId,omitempty"`
	RelatedTaskID  string         `json:"relatedTaskId,omitempty"`
	Signal         events.Signal  `json:"signal"`
	Repo           string         `json:"repo,omitempty"`
	Queue          string         `json:"queue,omitempty"`
	Message        events.Message `json:"message"`
	RunAt          *time.Time     `json:"runAt,omitempty"`
	DelaySeconds   *float64       `json:"delaySeconds,omitempty"`
	TimeoutSeconds *int           `json:"timeoutSeconds,omitempty"`
	// Concurrency, if set, admits at most Limit tasks of the customer with
	// the same Key to hold a delivery token or run at once.
	Concurrency *events.Concurrency `json:"concurrency,omitempty"`
	Retry       *RetryRequest       `json:"retry,omitempty"`
	// Labels are key=value pairs to search tasks by: at most
	// events.MaxLabels, keys as events.ValidLabelKey, values of at most
	// events.MaxLabelValueBytes bytes. A child does not inherit its
	// parent's.
	Labels map[string]string `json:"labels,omitempty"`
	// Kind names the sort of job, for executors to route on: 1 to
	// events.MaxKindBytes of [a-z0-9._-], starting with a letter or
	// digit. Payload is its arguments, any JSON value of at most
	// events.MaxPayloadBytes once compact (larger is 413
	// ErrPayloadTooLarge); the task stores it compact.
	Kind    string          `json:"kind,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// RetryRequest is a task's retry policy as a schedule request gives it;
// a field left out takes its default: maxAttempts 1 (no retry),
// backoffSeconds events.DefaultBackoffSeconds, maxBackoffSeconds
// events.DefaultMaxBackoffSeconds, on ["failed"].
type RetryRequest struct {
	MaxAttempts       *int     `json:"maxAttempts,omitempty"`
	BackoffSeconds    *int     `json:"backoffSeconds,omitempty"`
	MaxBackoffSeconds *int     `json:"maxBackoffSeconds,omitempty"`
	On                []string `json:"on,omitempty"`
}

// RetryRequestOf returns a stored retry policy as a request that asks for
// exactly it (every field set); nil for none.
func RetryRequestOf(p *events.RetryPolicy) *RetryRequest {
	if p == nil {
		return nil
	}
	c := *p // the request's pointers are to its own copy
	return &RetryRequest{MaxAttempts: &c.MaxAttempts, BackoffSeconds: &c.BackoffSeconds,
		MaxBackoffSeconds: &c.MaxBackoffSeconds, On: slices.Clone(p.On)}
}

// MaxLabelFilters is how many label filters one GET /v1/tasks may give.
const MaxLabelFilters = 4

// RetryTaskRequest is the body of POST /v1/tasks/{id}/retry, a manual
// retry (not the retry policy, RetryRequest): every field is optional.
// Without a RequestID every call makes another task; with one,
// a repeat answers the task it made (the id shares the request ids of
// POST /v1/tasks). Message replaces the retried task's objective; RunAt
// defaults to now.
type RetryTaskRequest struct {
	RequestID string          `json:"requestId,omitempty"`
	Message   *events.Message `json:"message,omitempty"`
	RunAt     *time.Time      `json:"runAt,omitempty"`
}

// ClaimRequest is the body of POST /v1/tasks/{id}/claim.
type ClaimRequest struct {
	DeliveryID string `json:"deliveryId"`
	ExecutorID string `json:"executorId"`
	// HeartbeatSeconds, if not 0 (events.MinHeartbeatSeconds to
	// events.MaxHeartbeatSeconds),
	// is the interval within which the executor renews the claim (POST
	// /v1/tasks/{id}/heartbeat); a claim not renewed within it is lost.
	HeartbeatSeconds int `json:"heartbeatSeconds,omitempty"`
}

// ClaimNextRequest is the body of POST /v1/claims/next.
type ClaimNextRequest struct {
	Queue       string  `json:"queue"`
	ExecutorID  string  `json:"executorId"`
	WaitSeconds float64 `json:"waitSeconds"`
	// HeartbeatSeconds, if not 0 (events.MinHeartbeatSeconds to
	// events.MaxHeartbeatSeconds),
	// is the interval within which the executor renews the claim (POST
	// /v1/tasks/{id}/heartbeat); a claim not renewed within it is lost.
	HeartbeatSeconds int `json:"heartbeatSeconds,omitempty"`
}

// ResultRequest is the body of POST /v1/tasks/{id}/result.
type ResultRequest struct {
	DeliveryID string          `json:"deliveryId,omitempty"`
	Success    bool            `json:"success"`
	Summary    string          `json:"summary,omitempty"`
	Error      string          `json:"error,omitempty"`
	Effects    []events.Effect `json:"effects,omitempty"`
	// Retryable false makes a failure final even with attempts left;
	// left out, a failure is retried if the task's policy allows.
	Retryable *bool `json:"retryable,omitempty"`
	// Output is the run's structured result, any JSON value of at most
	// events.MaxOutputBytes once compact (larger is 413
	// ErrPayloadTooLarge); it is kept in the task's result.
	Output json.RawMessage `json:"output,omitempty"`
}

// CancelRequest is the body of POST /v1/tasks/{id}/cancel.
type CancelRequest struct {
	Reason string `json:"reason"`
}

// BatchScheduleRequest is the body of POST /v1/tasks/batch.
type BatchScheduleRequest struct {
	Tasks []ScheduleRequest `json:"tasks"`
}

// ClaimBatchRequest is the body of POST /v1/claims. Max defaults to 1.
type ClaimBatchRequest struct {
	Queue       string  `json:"queue"`
	ExecutorID  string  `json:"executorId"`
	Max         int     `json:"max,omitempty"`
	WaitSeconds float64 `json:"waitSeconds"`
	// HeartbeatSeconds, if not 0 (events.MinHeartbeatSeconds to
	// events.MaxHeartbeatSeconds),
	// is the interval within which the executor renews the claim (POST
	// /v1/tasks/{id}/heartbeat); a claim not renewed within it is lost.
	HeartbeatSeconds int `json:"heartbeatSeconds,omitempty"`
}

// ResultItem is one result of POST /v1/results.
type ResultItem struct {
	TaskID string `json:"taskId"`
	ResultRequest
}

// ResultsRequest is the body of POST /v1/results.
type ResultsRequest struct {
	Results []ResultItem `json:"results"`
}

// MailRequest is the body of POST /v1/tasks/{id}/mailbox.
type MailRequest struct {
	Message events.Message `json:"message"`
}

// CheckRequest is the optional body of POST /v1/tasks/{id}/check.
// DeliveryID, the running claim's delivery token, makes the check the
// claim holder's: it consumes the mailbox messages it hands out. Without
// it, or with any other token, the check only peeks.
type CheckRequest struct {
	DeliveryID string `json:"deliveryId,omitempty"`
}

// HeartbeatRequest is the body of POST /v1/tasks/{id}/heartbeat.
type HeartbeatRequest struct {
	DeliveryID string `json:"deliveryId"`
}

// ReleaseRequest is the body of POST /v1/tasks/{id}/release.
type ReleaseRequest struct {
	DeliveryID string `json:"deliveryId"`
	Reason     string `json:"reason,omitempty"`
}

// ClaimOptions are a claim's choices besides its executor, which
// ClaimOption values set.
type ClaimOptions struct {
	// HeartbeatSeconds: see ClaimNextRequest.
	HeartbeatSeconds int
}

// ClaimOption is a per-call choice of a claim (Client.Claim, ClaimNext,
// ClaimBatch).
type ClaimOption func(*ClaimOptions)

// WithHeartbeat makes a claim with heartbeats: the executor promises to
// renew it (Client.Heartbeat) within every seconds
// (events.MinHeartbeatSeconds to events.MaxHeartbeatSeconds; 0: none,
// the claim is held until its deadline).
func WithHeartbeat(seconds int) ClaimOption {
	return func(o *ClaimOptions) { o.HeartbeatSeconds = seconds }
}

// Claiming returns the options opts choose.
func Claiming(opts []ClaimOption) ClaimOptions {
	var o ClaimOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}
