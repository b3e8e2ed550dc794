package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
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

// RunDocument is the answer of GET and PUT /v1/tasks/{id}/run: one
// revision of the task's Run (Revision 1 for the first save, +1 for
// each after it).
type RunDocument struct {
	TaskID     string    `json:"taskId"`
	Revision   uint64    `json:"revision"`
	UpdatedAt  time.Time `json:"updatedAt"`
	DeliveryID string    `json:"deliveryId"` // the claim that saved it
	// Digest is the SHA-256 of the revision's canonical JSON, lowercase
	// hex, as the log's RunSaved records it (empty for a Run saved
	// before revisions).
	Digest string   `json:"digest,omitempty"`
	Run    RunState `json:"run"`
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

// SaveRun saves s.Run as the task's next Run revision when s.Revision is
// its latest (0 for the first save) and s.DeliveryID the current
// claim's; the answer carries the new revision (the same save repeated
// answers the revision it stored). ErrStaleRevision, ErrClaimLost (the
// claim under s.DeliveryID was lost or released), ErrTokenMismatch or
// ErrTerminal otherwise, and nothing changes.
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

// Run history and progress limits (docs/API.md, "Run history and live
// progress").
const (
	// MaxProgressBytes bounds the text of one progress line (POST
	// /v1/tasks/{id}/progress); larger is 413 (ErrPayloadTooLarge).
	MaxProgressBytes = 4 << 10
	// ProgressRate and ProgressBurst bound a task's progress lines on
	// one server: a token bucket of ProgressBurst lines refilled at
	// ProgressRate a second; past it 429 (ErrProgressRate).
	ProgressRate  = 20
	ProgressBurst = 40
)

// ErrProgressRate (429): a task's progress lines came faster than
// ProgressRate a second; the line was not sent, send a later one.
var ErrProgressRate = &Error{Status: http.StatusTooManyRequests, Code: "too_many_requests", Reason: "progress_rate", Message: "too many progress lines"}

// ProgressRequest is the body of POST /v1/tasks/{id}/progress.
type ProgressRequest struct {
	DeliveryID string `json:"deliveryId"` // the current claim's token
	Text       string `json:"text"`       // UTF-8, at most MaxProgressBytes
}

// The event names of the run stream (GET /v1/tasks/{id}/run/stream).
const (
	RunSavedEvent    = "saved"    // data: RunChange; id: its revision
	RunProgressEvent = "progress" // data: RunProgress; no id
	RunEndEvent      = "end"      // data: RunEnd; the stream ends
)

// RunChange is a saved revision of a task's Run as the run stream sends
// it: what it changed in the revision before. Applied in order from
// revision 1 (or to the document of revision Revision-1), the changes
// give every revision's document.
type RunChange struct {
	TaskID     string    `json:"taskId"`
	Revision   uint64    `json:"revision"`
	DeliveryID string    `json:"deliveryId"`
	SavedAt    time.Time `json:"savedAt"`
	Digest     string    `json:"digest"` // SHA-256 of the revision's canonical JSON, as the log's RunSaved records it
	// Transcript, when set, keeps the first Keep items of the
	// revision before and appends Append.
	Transcript *TranscriptChange `json:"transcript,omitempty"`
	// Set replaces (or adds) top-level fields; Unset removes them.
	Set   map[string]json.RawMessage `json:"set,omitempty"`
	Unset []string                   `json:"unset,omitempty"`
	// Members changes top-level objects (contexts, effects, children)
	// member by member.
	Members map[string]MemberChange `json:"members,omitempty"`
}

// TranscriptChange keeps the first Keep transcript items and appends
// Append after them.
type TranscriptChange struct {
	Keep   int              `json:"keep"`
	Append []TranscriptItem `json:"append,omitempty"`
}

// MemberChange sets and removes members of one top-level object.
type MemberChange struct {
	Set   map[string]json.RawMessage `json:"set,omitempty"`
	Unset []string                   `json:"unset,omitempty"`
}

// RunProgress is a progress line on the run stream.
type RunProgress struct {
	Text string    `json:"text"`
	At   time.Time `json:"at"`
}

// RunEnd ends the run stream: the task is terminal.
type RunEnd struct {
	Status string `json:"status"`
}

// GetRunRevision returns revision revision of a task's Run document
// (GET /v1/tasks/{id}/run?revision=N); 0 is the latest, as GetRun.
// ErrNotFound for a revision the task does not have.
func (c *Client) GetRunRevision(ctx context.Context, id string, revision uint64) (d RunDocument, err error) {
	p := taskPath(id, "/run")
	if revision > 0 {
		p += "?revision=" + strconv.FormatUint(revision, 10)
	}
	_, err = c.do(ctx, http.MethodGet, p, nil, &d)
	return d, err
}

// GetRunRevisionJSON is GetRunRevision answering the document as the
// server sent it, with the fields of the run RunState does not know.
func (c *Client) GetRunRevisionJSON(ctx context.Context, id string, revision uint64) (json.RawMessage, error) {
	p := taskPath(id, "/run")
	if revision > 0 {
		p += "?revision=" + strconv.FormatUint(revision, 10)
	}
	var d json.RawMessage
	_, err := c.do(ctx, http.MethodGet, p, nil, &d)
	return d, err
}

// Progress sends a progress line of the run under deliveryID to the
// task's run streams; nothing is stored. ErrPayloadTooLarge,
// ErrProgressRate, ErrTokenMismatch (not the current claim), ErrTerminal
// or ErrNotFound otherwise.
func (c *Client) Progress(ctx context.Context, id, deliveryID, text string) error {
	_, err := c.do(ctx, http.MethodPost, taskPath(id, "/progress"), ProgressRequest{DeliveryID: deliveryID, Text: text}, nil)
	return err
}

// RunStreamItem is one message of a run stream: exactly one of Change
// (event saved), Progress (event progress) and End (event end) is set.
type RunStreamItem struct {
	Change   *RunChange
	Progress *RunProgress
	End      *RunEnd
}

// StreamRun follows a task's Run (GET /v1/tasks/{id}/run/stream): fn
// gets every revision after after, then each new revision and each
// progress line as it happens, then the end once the task is terminal,
// after which StreamRun returns nil. A stream the server drops for
// reading too slowly is resumed after the last revision fn got
// (progress lines sent meanwhile are lost). It returns fn's first error,
// ctx's error when ctx ends, an *Error the server sent, and
// ErrStreamEnded when the connection ends before the end.
func (c *Client) StreamRun(ctx context.Context, id string, after uint64, fn func(RunStreamItem) error) error {
	for {
		resp, err := c.open(ctx, taskPath(id, "/run/stream")+"?after="+strconv.FormatUint(after, 10))
		if err != nil {
			return err
		}
		again, err := readRunStream(resp.Body, &after, fn)
		resp.Body.Close()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil || !again:
			return err
		}
	}
}

// readRunStream reads one connection of a run stream, moving *after past
// each revision fn got; again reports an overflow (reconnect).
func readRunStream(body io.Reader, after *uint64, fn func(RunStreamItem) error) (again bool, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, maxStreamLine)
	var event, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		case line == "" && data != "":
			var it RunStreamItem
			var target any
			switch event {
			case RunSavedEvent:
				it.Change = new(RunChange)
				target = it.Change
			case RunProgressEvent:
				it.Progress = new(RunProgress)
				target = it.Progress
			case RunEndEvent:
				it.End = new(RunEnd)
				target = it.End
			case StreamOverflowEvent:
				var o StreamOverflow
				if err := json.Unmarshal([]byte(data), &o); err != nil {
					return false, fmt.Errorf("decoding overflow: %w", err)
				}
				*after = max(*after, o.After)
				return true, nil
			case "error":
				e := new(Error)
				if err := json.Unmarshal([]byte(data), e); err != nil {
					return false, fmt.Errorf("decoding stream error: %w", err)
				}
				return false, e
			}
			name, raw := event, data
			event, data = "", ""
			if target == nil {
				continue // an event this client does not know
			}
			if err := json.Unmarshal([]byte(raw), target); err != nil {
				return false, fmt.Errorf("decoding %s: %w", name, err)
			}
			if err := fn(it); err != nil {
				return false, err
			}
			if it.Change != nil {
				*after = it.Change.Revision
			}
			if it.End != nil {
				return false, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, fmt.Errorf("%w after run revision %d", ErrStreamEnded, *after)
}
