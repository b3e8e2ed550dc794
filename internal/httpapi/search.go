package httpapi

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// searchFilter adds GET /v1/tasks's search parameters to f: label=k=v
// (repeatable, at most api.MaxLabelFilters, each key once), requestId,
// createdAfter and createdBefore (RFC 3339). A bad one is a 400.
func (h *handler) searchFilter(p service.Principal, q url.Values, f *service.TaskFilter) error {
	// An empty label= is as if left out, as every empty parameter is.
	labels := slices.DeleteFunc(slices.Clone(q["label"]), func(l string) bool { return l == "" })
	if len(labels) > 0 {
		if len(labels) > api.MaxLabelFilters {
			return invalidArg("%d label filters, at most %d", len(labels), api.MaxLabelFilters)
		}
		f.Labels = make(map[string]string, len(labels))
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return invalidArg("label filter %q is not key=value", trim(l))
			}
			if _, dup := f.Labels[k]; dup {
				return invalidArg("label key %q is filtered twice", trim(k))
			}
			f.Labels[k] = v
		}
		if err := aggregate.ValidateLabels(f.Labels); err != nil {
			return err
		}
	}
	if id := q.Get("requestId"); id != "" {
		var err error
		if *f, err = h.Service.RequestFilter(p, *f, id); err != nil {
			return err
		}
	}
	for _, b := range []struct {
		name string
		t    *time.Time
	}{{"createdAfter", &f.CreatedAfter}, {"createdBefore", &f.CreatedBefore}} {
		s := q.Get(b.name)
		if s == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return invalidArg("%s must be an RFC 3339 time, like 2026-01-02T15:04:05Z", b.name)
		}
		*b.t = t
	}
	return nil
}

// trim shortens a client's text quoted in an error.
func trim(s string) string { return events.Truncate(s, 80) }

// retryTask answers POST /v1/tasks/{id}/retry (a manual retry): 201
// with the new task, 200 with the one a repeated requestId made.
func (h *handler) retryTask(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := pathID(r)
	var b api.RetryTaskRequest
	if err == nil {
		err = decode(r, &b)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, created, err := h.Service.RetryTask(r.Context(), p, id, service.RetryTaskRequest{RequestID: b.RequestID, Message: b.Message, RunAt: b.RunAt})
	h.scheduled(w, r, st, created, err)
}
