package service

import (
	"encoding/json"
	"time"
)

// Run is a task's run document as stored: the revision, claim and time
// of its last save and the run object byte for byte as the executor sent
// it, so fields the server does not know reach the reader too.
type Run struct {
	Revision   uint64          // grows with every save
	DeliveryID string          // the claim that saved it
	UpdatedAt  time.Time       // when it was saved
	Doc        json.RawMessage // the run object
}

// RunSave is a request to replace a task's run (PUT /v1/tasks/{id}/run).
type RunSave struct {
	DeliveryID string          // the current claim's token
	Revision   uint64          // the revision read; 0 for the first save
	Run        json.RawMessage // a JSON object, at most api.MaxRunBytes
}
