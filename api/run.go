package api

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/taskledger/taskledger/events"
)

// RunState is an executor's durable Run of one task (docs/API.md, "Run
// state"): what it is doing, which Turn it is in, what it has seen and
// done, and what it must not repeat after a crash. The scheduler stores
// it as the executor wrote it (fields it does not know are kept) and
// checks only its size and the claim that saves it.
type RunState struct {
	ExecutorID string `json:"executorId,omitempty"`
	Phase      string `json:"phase,omitempty"` // free text set by the executor
	Turn       int    `json:"turn"`            // index of the current Turn, from 1; 0 before the first
	// Transcript is every item of the run in order, each under a
	// deterministic id, so a resumed run never adds one twice.
	Transcript []TranscriptItem `json:"transcript,omitempty"`
	// Contexts are named snapshots (fetched issue history, a repository
	// summary); saving one again makes a new version.
	Contexts map[string]RunContext `json:"contexts,omitempty"`
	// PendingTools are dispatched tool calls not yet settled.
	PendingTools []ToolCall `json:"pendingTools,omitempty"`
	// Steps names the completed steps (Run.Step).
	Steps []string `json:"steps,omitempty"`
	// Effects holds external writes by key: the intent is recorded before
	// the write, the outcome after it.
	Effects map[string]EffectRecord `json:"effects,omitempty"`
	// Children maps a delegation key to the child task it created.
	Children map[string]string `json:"children,omitempty"`
}

// Transcript item kinds.
const (
	ItemMailbox     = "mailbox"      // a mailbox message, under its message id
	ItemModelInput  = "model_input"  // what the executor sent the model
	ItemModelOutput = "model_output" // what the model answered
	ItemToolCall    = "tool_call"    // a tool dispatched (Tool set, status pending)
	ItemToolResult  = "tool_result"  // a tool settled (Tool set, its final status)
	ItemNote        = "note"         // anything else the executor wants kept
	// ItemHandover: a claim took the Run over from an earlier one (a lost
	// or released claim, or a retry), under id "handover-<deliveryId>" of
	// the new claim; its content names both executors and claims.
	ItemHandover = "handover"
)

// TranscriptItem is one item of a Run's transcript.
type TranscriptItem struct {
	ID      string               `json:"id"`
	Kind    string               `json:"kind"`
	Turn    int                  `json:"turn"`
	At      time.Time            `json:"at,omitzero"`
	Content []events.ContentPart `json:"content,omitempty"`
	Tool    *ToolCall            `json:"tool,omitempty"`
}

// Tool call statuses.
const (
	ToolPending   = "pending"   // dispatched, not settled
	ToolOK        = "ok"        // settled with a result
	ToolError     = "error"     // settled with an error
	ToolTimeout   = "timeout"   // settled: it did not answer in time
	ToolUncertain = "uncertain" // a crash cut it off and no lookup could tell; not repeated unless idempotent
)

// ToolCall is one tool dispatch of a Turn.
type ToolCall struct {
	ID         string          `json:"id"` // deterministic within the run
	Name       string          `json:"name"`
	Input      json.RawMessage `json:"input,omitempty"`
	Idempotent bool            `json:"idempotent,omitempty"` // safe to call again after a crash
	Turn       int             `json:"turn"`
	Status     string          `json:"status"`
	Output     json.RawMessage `json:"output,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// RunContext is one named context snapshot.
type RunContext struct {
	Version int             `json:"version"` // 1 for the first save, +1 for each replacement
	Value   json.RawMessage `json:"value"`
	SavedAt time.Time       `json:"savedAt,omitzero"`
}

// EffectRecord is one external effect's intent and, once known, outcome.
type EffectRecord struct {
	Outcome   *events.Effect `json:"outcome,omitempty"`
	Uncertain bool           `json:"uncertain,omitempty"`
}

// RunSave is the body of PUT /v1/tasks/{id}/run.
type RunSave struct {
	DeliveryID string   `json:"deliveryId"` // the current claim's token
	Revision   uint64   `json:"revision"`   // the revision read; 0 for the first save
	Run        RunState `json:"run"`
}

// RunDocument is the answer of GET and PUT /v1/tasks/{id}/run.
type RunDocument struct {
	TaskID     string    `json:"taskId"`
	Revision   uint64    `json:"revision"`
	UpdatedAt  time.Time `json:"updatedAt"`
	DeliveryID string    `json:"deliveryId"` // the claim that saved it
	Run        RunState  `json:"run"`
}

// EffectsRequest is the body of POST /v1/tasks/{id}/effects.
type EffectsRequest struct {
	DeliveryID string          `json:"deliveryId"`
	Effects    []events.Effect `json:"effects"`
}

// ErrStaleRevision (409): PUT /v1/tasks/{id}/run named a revision that is
// not the stored one; read the run again.
var ErrStaleRevision = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "stale_revision", Message: "run revision is not the stored one"}

// GetRun returns a task's Run document (ErrNotFound before the first save).
func (c *Client) GetRun(ctx context.Context, id string) (d RunDocument, err error) {
	_, err = c.do(ctx, http.MethodGet, taskPath(id, "/run"), nil, &d)
	return d, err
}

// SaveRun replaces a task's Run document when s.Revision is the stored
// one and s.DeliveryID the current claim's; ErrStaleRevision,
// ErrClaimLost (the claim under s.DeliveryID was lost or released),
// ErrTokenMismatch or ErrTerminal otherwise, and nothing changes.
func (c *Client) SaveRun(ctx context.Context, id string, s RunSave) (d RunDocument, err error) {
	_, err = c.do(ctx, http.MethodPut, taskPath(id, "/run"), s, &d)
	return d, err
}

// ReportEffects records effects of the running task as they happen; the
// answer is the task with every effect reported so far.
func (c *Client) ReportEffects(ctx context.Context, id, deliveryID string, effects []events.Effect) (t Task, err error) {
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/effects"), EffectsRequest{DeliveryID: deliveryID, Effects: effects}, &t)
	return t, err
}
