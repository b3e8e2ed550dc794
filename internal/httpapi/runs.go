package httpapi

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
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

func newRunDocument(taskID string, r store.Run) runDocument {
	return runDocument{TaskID: taskID, Revision: r.Revision, UpdatedAt: r.UpdatedAt, DeliveryID: r.DeliveryID, Run: r.Doc}
}

// runSave is api.RunSave with the run kept as sent.
type runSave struct {
	DeliveryID string          `json:"deliveryId"`
	Revision   uint64          `json:"revision"`
	Run        json.RawMessage `json:"run"`
}

// saveRun replaces the task's run (PUT /v1/tasks/{id}/run).
func (h *handler) saveRun(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
	id, err := pathID(r)
	var b runSave
	if err == nil {
		err = decode(r, &b)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	run, err := h.Service.SaveRun(r.Context(), p, id, scheduler.RunSave(b))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newRunDocument(id, run))
}

// getRun answers the task's run (GET /v1/tasks/{id}/run).
func (h *handler) getRun(w http.ResponseWriter, r *http.Request, p scheduler.Principal) {
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
