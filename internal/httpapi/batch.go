package httpapi

import (
	"net/http"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// scheduleRequest is the service's form of a schedule body.
func scheduleRequest(b api.ScheduleRequest) service.ScheduleRequest {
	return service.ScheduleRequest{
		CustomerID: b.CustomerID, ParentID: b.ParentID, RequestID: b.RequestID, RelatedTaskID: b.RelatedTaskID,
		Signal: b.Signal, Repo: b.Repo, Queue: b.Queue, Message: b.Message,
		RunAt: b.RunAt, DelaySeconds: b.DelaySeconds, TimeoutSeconds: b.TimeoutSeconds, Concurrency: b.Concurrency, Retry: b.Retry,
		Labels: b.Labels, Kind: b.Kind, Payload: b.Payload,
	}
}

// pollArgs checks a long poll's queue ("" is the default queue) and wait
// (cut to the longest long poll).
func pollArgs(queue string, waitSeconds float64) (string, time.Duration, error) {
	if queue == "" {
		queue = events.DefaultQueue
	}
	if !(waitSeconds >= 0) {
		return "", 0, invalidArg("waitSeconds must be a number ≥ 0")
	}
	return queue, time.Duration(min(waitSeconds, service.MaxWait.Seconds()) * float64(time.Second)), nil
}

// batchItems renders a batch's outcomes in order: each item's status is
// what its single route would have answered.
func batchItems(outs []service.Outcome, okStatus func(service.Outcome) int) api.BatchAnswer {
	items := make([]api.BatchItem, len(outs))
	tasks := make([]api.Task, len(outs)) // one allocation, not one per item
	for i, o := range outs {
		if o.Err != nil {
			e := wireError(o.Err)
			items[i] = api.BatchItem{Status: e.Status, Code: e.Code, Reason: e.Reason, Message: e.Message, Task: e.Task}
			continue
		}
		tasks[i] = NewTask(o.State)
		items[i] = api.BatchItem{Status: okStatus(o), Task: &tasks[i]}
	}
	return api.BatchAnswer{Results: items}
}

func createdStatus(o service.Outcome) int { return createdCode(o.Created) }

// createdCode is 201 for a new task or schedule, 200 for the one a
// repeated request found.
func createdCode(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}

func okStatus(service.Outcome) int { return http.StatusOK }

// scheduleBatch schedules every task of the body as its own task (POST
// /v1/tasks/batch).
func (h *handler) scheduleBatch(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.BatchScheduleRequest
	if err := decode(r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	reqs := make([]service.ScheduleRequest, len(b.Tasks))
	for i, t := range b.Tasks {
		reqs[i] = scheduleRequest(t)
	}
	outs, err := h.Service.ScheduleBatch(r.Context(), p, reqs)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, batchItems(outs, createdStatus))
}

// recordResults records every result of the body (POST /v1/results).
func (h *handler) recordResults(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.ResultsRequest
	if err := decode(r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	items := make([]service.ResultItem, len(b.Results))
	for i, it := range b.Results {
		if err := events.ValidID(it.TaskID); err != nil {
			h.fail(w, r, invalidArg("results[%d].taskId: %v", i, err))
			return
		}
		items[i] = service.ResultItem{TaskID: it.TaskID, DeliveryID: it.DeliveryID, Result: result(it.ResultRequest)}
	}
	outs, err := h.Service.RecordResults(r.Context(), p, items)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, batchItems(outs, okStatus))
}

// result is the event form of a result body.
func result(b api.ResultRequest) events.Result {
	return events.Result{Success: b.Success, Summary: b.Summary, Error: b.Error, Effects: b.Effects, Retryable: b.Retryable, Output: b.Output}
}

// claimBatch long-polls a queue and claims up to max of its ready tasks
// (POST /v1/claims): 200 with the tasks, or 204 when none came in time.
func (h *handler) claimBatch(w http.ResponseWriter, r *http.Request, p service.Principal) {
	var b api.ClaimBatchRequest
	if err := decode(r, &b); err != nil {
		h.fail(w, r, err)
		return
	}
	queue, wait, err := pollArgs(b.Queue, b.WaitSeconds)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if b.Max == 0 {
		b.Max = 1
	}
	states, err := h.Service.ClaimBatch(r.Context(), p, queue, b.ExecutorID, b.Max, wait, api.WithHeartbeat(b.HeartbeatSeconds))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(states) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	out := api.ClaimedTasks{Tasks: make([]api.Task, len(states))}
	for i, st := range states {
		out.Tasks[i] = NewTask(st)
	}
	writeJSON(w, http.StatusOK, out)
}
