package httpapi

import (
	"net/http"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// NewSchedule renders a schedule's view as the schedule resource.
func NewSchedule(v service.ScheduleView) api.Schedule {
	st, t := v.State, v.State.Spec.Task
	timeout := t.TimeoutSeconds
	// The runs' message, as each run gets it but for its time: the
	// schedule's spec is from its creation or last change.
	t.Message.CreatedAt = st.CreatedAt.UTC()
	if st.UpdatedAt.After(st.CreatedAt) {
		t.Message.CreatedAt = st.UpdatedAt.UTC()
	}
	if t.Message.Content == nil {
		t.Message.Content = []events.ContentPart{}
	}
	out := api.Schedule{
		ID: st.ID, CustomerID: st.CustomerID, Cron: st.Spec.Cron, Every: st.Spec.Every, Timezone: st.Spec.Timezone,
		Task: api.ScheduleTask{Queue: t.Queue, Message: t.Message, Repo: t.Repo, Signal: t.Signal, TimeoutSeconds: &timeout,
			Labels: t.Labels, Retry: api.RetryRequestOf(t.Retry), Concurrency: t.Concurrency, Kind: t.Kind, Payload: t.Payload},
		Overlap: st.Spec.Overlap, Catchup: st.Spec.Catchup, Paused: st.Paused, Deleted: st.Deleted,
		CreatedAt: st.CreatedAt.UTC(), UpdatedAt: st.UpdatedAt.UTC(), Next: v.Next, Runs: make([]api.ScheduleRun, len(v.Runs)),
		RunCount: st.Runs, Version: st.Version,
	}
	if out.Next == nil {
		out.Next = []time.Time{}
	}
	for i, r := range v.Runs {
		out.Runs[i] = api.ScheduleRun{At: r.At.UTC(), TaskID: r.TaskID, RequestID: r.RequestID, Status: string(r.Status),
			Skipped: r.Skipped, Missed: r.Missed, Manual: r.Manual}
	}
	return out
}

// scheduleID returns the {id} path value, or a 400 for a malformed id.
func scheduleID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if err := events.ValidID(id); err != nil {
		return "", invalidArg("schedule id: %v", err)
	}
	return id, nil
}

// createScheduleBody is the body of POST /v1/schedules as read: its task
// has every field of a task's body, so those a schedule may not set are
// refused rather than ignored.
type createScheduleBody struct {
	api.ScheduleCreateRequest
	Task api.ScheduleRequest `json:"task"`
}

func (h *handler) createSchedule(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b createScheduleBody
	if err := decode(r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	v, created, err := h.Service.CreateSchedule(r.Context(), p, service.CreateScheduleRequest{
		CustomerID: b.CustomerID, ID: b.ID, Cron: b.Cron, Every: b.Every, Timezone: b.Timezone, Task: scheduleRequest(b.Task),
		Overlap: b.Overlap, Catchup: b.Catchup, Paused: b.Paused,
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, createdCode(created), NewSchedule(v))
}

func (h *handler) listSchedules(w http.ResponseWriter, r *http.Request, p service.Principal) {
	q := r.URL.Query()
	customerID, after := q.Get("customerId"), q.Get("after")
	if customerID != "" {
		if err := events.ValidID(customerID); err != nil {
			h.fail(w, r, invalidArg("customerId: %v", err))
			return
		}
		if !p.IsOperator() && customerID != p.CustomerID {
			h.fail(w, r, invalidArg("customerId is taken from the token"))
			return
		}
	}
	if after != "" && !h.Service.ScheduleCursorValid(p, customerID, after) {
		h.fail(w, r, invalidArg("after: not a cursor of this list"))
		return
	}
	limit, err := listLimit(q.Get("limit"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	views, next, err := h.Service.ListSchedules(p, customerID, after, limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := api.ScheduleList{Schedules: []api.Schedule{}, Next: next}
	for _, v := range views {
		out.Schedules = append(out.Schedules, NewSchedule(v))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) getSchedule(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := scheduleID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	v, err := h.Service.GetSchedule(r.Context(), p, r.URL.Query().Get("customerId"), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NewSchedule(v))
}

// scheduleAction serves a route that runs cmd on the path's schedule and
// answers it.
func scheduleAction(cmd aggregate.Command) principalFunc {
	return func(h *handler, w http.ResponseWriter, r *http.Request, p service.Principal) {
		id, err := scheduleID(r)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		v, err := h.Service.ScheduleAction(r.Context(), p, r.URL.Query().Get("customerId"), id, cmd)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, NewSchedule(v))
	}
}

func (h *handler) triggerSchedule(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := scheduleID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	st, err := h.Service.TriggerSchedule(r.Context(), p, r.URL.Query().Get("customerId"), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, NewTask(st))
}

func (h *handler) scheduleHistory(w http.ResponseWriter, r *http.Request, p service.Principal) {
	id, err := scheduleID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	entries, err := h.Service.ScheduleTimeline(r.Context(), p, r.URL.Query().Get("customerId"), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.History{Events: forCaller(p, entries)})
}
