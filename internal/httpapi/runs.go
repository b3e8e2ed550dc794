package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
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
	Digest     string          `json:"digest,omitempty"`
	Run        json.RawMessage `json:"run"`
}

func newRunDocument(taskID string, r service.Run) runDocument {
	return runDocument{TaskID: taskID, Revision: r.Revision, UpdatedAt: r.UpdatedAt, DeliveryID: r.DeliveryID, Digest: r.Digest, Run: r.Doc}
}

// runSave is api.RunSave with the run kept as sent.
type runSave struct {
	DeliveryID string          `json:"deliveryId"`
	Revision   uint64          `json:"revision"`
	Run        json.RawMessage `json:"run"`
}

// saveRun saves the next revision of the task's run (PUT /v1/tasks/{id}/run).
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

// getRun answers the task's run (GET /v1/tasks/{id}/run): the latest
// revision, or the one ?revision= names.
func (h *handler) getRun(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var rev uint64
	if err == nil {
		rev, err = revisionArg(r.URL.Query().Get("revision"), "revision")
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	run, err := h.Service.GetRun(r.Context(), p, id, rev)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newRunDocument(id, run))
}

// revisionArg parses a run revision argument ("" is 0).
func revisionArg(v, name string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, invalidArg("%s must be a run revision, a whole number", name)
	}
	return n, nil
}

// progress sends a progress line to the task's run streams (POST
// /v1/tasks/{id}/progress).
func (h *handler) progress(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var b api.ProgressRequest
	if err == nil {
		err = decode(r, &b)
	}
	if err == nil {
		err = h.Service.Progress(r.Context(), p, id, service.RunProgress{DeliveryID: b.DeliveryID, Text: b.Text})
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// runStream serves GET /v1/tasks/{id}/run/stream (docs/API.md, "Run
// history and live progress"): the revisions after the one
// Last-Event-ID (or ?after=) names, then each save and progress line as
// it happens, within the event streams' limits (serveSSE); an end event
// once the task is terminal.
func (h *handler) runStream(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var after uint64
	if err == nil {
		name, v := "after", r.URL.Query().Get("after")
		if last := r.Header.Get("Last-Event-ID"); last != "" {
			name, v = "Last-Event-ID", last
		}
		after, err = revisionArg(v, name)
	}
	if err == nil {
		_, err = h.Service.Get(r.Context(), p, id) // 404 before the headers go out
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.serveSSE(w, r, p, func(ctx context.Context, send func([]byte) error) error {
		err := h.Service.FollowRun(ctx, p, id, after, h.Streams.Buffer, func(it service.RunItem) error {
			b, err := runEvent(id, it)
			if err == nil {
				err = send(b)
			}
			var full *bufferFull
			if errors.As(err, &full) {
				return &overflowError{api.StreamOverflow{After: after, Reason: fmt.Sprintf(
					"the client read too slowly: %d messages (%d bytes) not taken", full.n, full.bytes)}}
			}
			if it.Kind == service.RunItemSaved {
				after = it.Run.Revision
			}
			return err
		})
		if err != nil && !errors.As(err, new(*overflowError)) {
			// The headers are out: tell the client why the stream ends.
			b, _ := json.Marshal(wireError(err))
			send(fmt.Appendf(nil, "event: error\ndata: %s\n\n", b))
		}
		return err
	})
}

// runEvent is the Server-Sent Events message of one run stream item.
func runEvent(taskID string, it service.RunItem) ([]byte, error) {
	switch it.Kind {
	case service.RunItemSaved:
		c := api.RunChange{TaskID: taskID, Revision: it.Run.Revision, DeliveryID: it.Run.DeliveryID, SavedAt: it.Run.UpdatedAt.UTC(), Digest: it.Run.Digest}
		if err := json.Unmarshal(it.Run.Change, &c); err != nil {
			return nil, err
		}
		data, err := json.Marshal(c)
		if err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, "id: %d\nevent: %s\ndata: %s\n\n", c.Revision, api.RunSavedEvent, data), nil
	case service.RunItemProgress:
		data, err := json.Marshal(api.RunProgress{Text: it.Text, At: it.At.UTC()})
		return fmt.Appendf(nil, "event: %s\ndata: %s\n\n", api.RunProgressEvent, data), err
	}
	data, err := json.Marshal(api.RunEnd{Status: it.Status})
	return fmt.Appendf(nil, "event: %s\ndata: %s\n\n", api.RunEndEvent, data), err
}

// GetRun returns a task's Run document (api.ErrNotFound before the
// first save).
func (l *Local) GetRun(ctx context.Context, id string) (api.RunDocument, error) {
	return l.GetRunRevision(ctx, id, 0)
}

// GetRunRevision returns revision revision of a task's Run document (0:
// the latest), as GET /v1/tasks/{id}/run?revision=N.
func (l *Local) GetRunRevision(ctx context.Context, id string, revision uint64) (api.RunDocument, error) {
	if err := validTaskID(id); err != nil {
		return api.RunDocument{}, err
	}
	run, err := l.svc.GetRun(ctx, l.p, id, revision)
	return localRunDocument(id, run, err)
}

// Progress sends a progress line, as POST /v1/tasks/{id}/progress.
func (l *Local) Progress(ctx context.Context, id, deliveryID, text string) error {
	if err := validTaskID(id); err != nil {
		return err
	}
	if err := l.svc.Progress(ctx, l.p, id, service.RunProgress{DeliveryID: deliveryID, Text: text}); err != nil {
		return wireError(err)
	}
	return nil
}

// SaveRun saves the next revision of a task's Run, as PUT /v1/tasks/{id}/run.
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
	d := api.RunDocument{TaskID: id, Revision: r.Revision, UpdatedAt: r.UpdatedAt, DeliveryID: r.DeliveryID, Digest: r.Digest}
	if err := json.Unmarshal(r.Doc, &d.Run); err != nil {
		return api.RunDocument{}, wireError(fmt.Errorf("run of %s revision %d: %w", id, r.Revision, err))
	}
	return d, nil
}
