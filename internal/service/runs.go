package service

import (
	"encoding/json"
	"time"
)

// Run is one revision of a task's run document: its revision, the claim
// and time of its save, and the run object in canonical JSON (keys
// sorted, compact; fields the server does not know are kept).
type Run struct {
	Revision   uint64          // 1 for the first save, +1 for each after it (0: a run saved before revisions)
	DeliveryID string          // the claim that saved it
	UpdatedAt  time.Time       // when it was saved
	Digest     string          // SHA-256 of Doc, lowercase hex: the RunSaved digest
	Doc        json.RawMessage // the run object
	// Change is what the revision changed in the one before, as the
	// run stream sends it (api.RunChange's fields); nil where not asked.
	Change json.RawMessage
}

// RunSave is a request to save a task's run (PUT /v1/tasks/{id}/run).
type RunSave struct {
	DeliveryID string          // the current claim's token
	Revision   uint64          // the revision read; 0 for the first save
	Run        json.RawMessage // a JSON object, at most api.MaxRunBytes
}

// RunProgress is an ephemeral progress line of a running task (POST
// /v1/tasks/{id}/progress): sent to the task's run streams, never
// stored.
type RunProgress struct {
	DeliveryID string // the current claim's token
	Text       string // valid UTF-8, at most api.MaxProgressBytes
}

// Kinds of RunItem.
const (
	RunItemSaved    = "saved"    // a revision was saved (Run)
	RunItemProgress = "progress" // a progress line (Text)
	RunItemEnd      = "end"      // the task is terminal (Status): nothing more comes
)

// RunItem is one item of a task's run stream (GET
// /v1/tasks/{id}/run/stream).
type RunItem struct {
	Kind   string
	Run    Run       // RunItemSaved: the revision, with its Change
	Text   string    // RunItemProgress
	At     time.Time // RunItemProgress: when the line was sent
	Status string    // RunItemEnd: the task's status
}
