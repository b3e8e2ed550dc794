package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/service"
)

// runDocument is api.RunDocument with the run kept as stored, so the
// fields the server does not know reach the reader too.
type runDocument struct {
	TaskID     string          `json:"taskId"`
	Revision   uint64          `json:"revision"`
	UpdatedAt  time.Time       `json:"updatedAt"`
	DeliveryID string          `json:"deliveryId"`
	Run        json.RawMessage `json:"run"`
}

func newRunDocument(taskID string, r service.Run) runDocument {
	return runDocument{TaskID: taskID, Revision: r.Revision, UpdatedAt: r.UpdatedAt, DeliveryID: r.DeliveryID, Run: r.Doc}
}

// runSave is api.RunSave with the run kept as sent.
type runSave struct {
	DeliveryID string          `json:"deliveryId"`
	Revision   uint64          `json:"revision"`
	Run        json.RawMessage `json:"run"`
}

// saveRun replaces the task's run (PUT /v1/tasks/{id}/run).
func (h *handler) saveRun(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var b runSave
	if err == nil {
		err = decode(r, &b)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	run, err := h.Service.SaveRun(r.Context(), p, id, service.RunSave(b))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newRunDocument(id, run))
}

// getRun answers the task's run (GET /v1/tasks/{id}/run).
func (h *handler) getRun(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	run, err := h.Service.GetRun(r.Context(), p, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newRunDocument(id, run))
}

// GetRun returns a task's Run document (api.ErrNotFound before the
// first save).
func (l *Local) GetRun(ctx context.Context, id string) (api.RunDocument, error) {
	if err := validTaskID(id); err != nil {
		return api.RunDocument{}, err
	}
	run, err := l.svc.GetRun(ctx, l.p, id)
	return localRunDocument(id, run, err)
}

// SaveRun replaces a task's Run document, as PUT /v1/tasks/{id}/run.
func (l *Local) SaveRun(ctx context.Context, id string, s api.RunSave) (api.RunDocument, error) {
	if err := validTaskID(id); err != nil {
		return api.RunDocument{}, err
	}
	doc, err := json.Marshal(s.Run)
	if err != nil {
		return api.RunDocument{}, invalidArg("run: %v", err)
	}
	run, err := l.svc.SaveRun(ctx, l.p, id, service.RunSave{DeliveryID: s.DeliveryID, Revision: s.Revision, Run: doc})
	return localRunDocument(id, run, err)
}

// localRunDocument renders the answer of a Local run call.
func localRunDocument(id string, r service.Run, err error) (api.RunDocument, error) {
	if err != nil {
		return api.RunDocument{}, wireError(err)
	}
	d := api.RunDocument{TaskID: id, Revision: r.Revision, UpdatedAt: r.UpdatedAt, DeliveryID: r.DeliveryID}
	if err := json.Unmarshal(r.Doc, &d.Run); err != nil {
		return api.RunDocument{}, wireError(fmt.Errorf("run of %s revision %d: %w", id, r.Revision, err))
	}
	return d, nil
}
