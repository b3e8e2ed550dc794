package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// TestKindAndPayload: a task's kind and payload go in through schedule,
// batch, manual retry and schedules, and come out in the task, its
// history and the kind filter; a result's output is kept in the result;
// each limit is a clear 4xx that changes nothing.
func TestKindAndPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	payload := json.RawMessage(`{"src": "s3://bucket/cat.png", "width": 640}`)
	const compact = `{"src":"s3://bucket/cat.png","width":640}`

	task := runningTask(t, b, api.ScheduleRequest{Queue: "img", Kind: "resize", Payload: payload})
	if task.Kind != "resize" || string(task.Payload) != compact {
		t.Fatalf("claimed task kind %q payload %s, want resize %s", task.Kind, task.Payload, compact)
	}
	done, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true,
		Output: json.RawMessage(`{ "thumb": "s3://bucket/cat-640.png" }`)})
	if err != nil || done.Result == nil || string(done.Result.Output) != `{"thumb":"s3://bucket/cat-640.png"}` {
		t.Fatalf("result with output: %+v, %v", done.Result, err)
	}
	h, err := b.client.History(ctx, task.ID)
	if err != nil || !strings.Contains(h.Events[0].Detail, "kind resize, payload 41 bytes") ||
		!strings.Contains(h.Events[len(h.Events)-1].Detail, "output 35 bytes") {
		t.Fatalf("history does not show the kind, the payload and the output: %+v, %v", h.Events, err)
	}

	items, err := b.client.ScheduleBatch(ctx, []api.ScheduleRequest{
		{Queue: "img", Kind: "resize", Payload: json.RawMessage(`[1, 2]`)},
		{Queue: "img", Kind: "Bad Kind"},
		{Queue: "img", Kind: "thumb"},
	})
	if err != nil || len(items) != 3 || items[0].Task == nil || string(items[0].Task.Payload) != `[1,2]` ||
		items[1].Status != http.StatusBadRequest || items[2].Task == nil || items[2].Task.Kind != "thumb" {
		t.Fatalf("batch: %+v, %v", items, err)
	}
	retried, _, err := b.client.RetryTask(ctx, task.ID, api.RetryTaskRequest{})
	if err != nil || retried.Kind != "resize" || string(retried.Payload) != compact {
		t.Fatalf("a manual retry keeps kind and payload: %+v, %v", retried, err)
	}
	s, _, err := b.client.CreateSchedule(ctx, api.ScheduleCreateRequest{ID: "nightly-resize", Every: "1h",
		Task: api.ScheduleTask{Queue: "img", Kind: "resize", Payload: payload}})
	if err != nil || s.Task.Kind != "resize" || string(s.Task.Payload) != compact {
		t.Fatalf("schedule: %+v, %v", s.Task, err)
	}
	run, err := b.client.TriggerSchedule(ctx, s.ID, api.ScheduleOptions{})
	if err != nil || run.Kind != "resize" || string(run.Payload) != compact {
		t.Fatalf("a schedule's run: %+v, %v", run, err)
	}

	t.Run("ListByKind", func(t *testing.T) {
		settled(t, b)
		l, err := b.client.List(ctx, api.ListOptions{Kind: "resize"})
		if err != nil {
			t.Fatal(err)
		}
		want := sorted(task.ID, items[0].Task.ID, retried.ID, run.ID)
		if got := taskIDs(l.Tasks); !slices.Equal(got, want) {
			t.Fatalf("kind=resize lists %v, want %v", got, want)
		}
		for _, lt := range l.Tasks {
			if lt.Kind != "resize" || lt.Payload != nil {
				t.Fatalf("a listed task has kind %q and payload %s, want resize and no payload", lt.Kind, lt.Payload)
			}
		}
		if l, err := b.client.List(ctx, api.ListOptions{Kind: "resize", Status: "succeeded"}); err != nil || !slices.Equal(taskIDs(l.Tasks), []string{task.ID}) {
			t.Fatalf("kind and status: %v, %v", taskIDs(l.Tasks), err)
		}
		requireErrorBody(t, rawDo(t, b, http.MethodGet, "/v1/tasks?kind=Resize", ""), http.StatusBadRequest, "invalid_argument")
	})

	t.Run("TreeWithoutPayloads", func(t *testing.T) {
		child := mustSchedule(t, b, api.ScheduleRequest{Queue: "img-tree", ParentID: run.ID, Kind: "thumb", Payload: payload})
		tr, err := b.client.Tree(ctx, child.ID)
		if err != nil || tr.Task.ID != run.ID || len(tr.Children) != 1 {
			t.Fatalf("tree: %+v, %v", tr, err)
		}
		if c := tr.Children[0].Task; tr.Task.Kind != "resize" || tr.Task.Payload != nil || c.Kind != "thumb" || c.Payload != nil {
			t.Fatalf("tree nodes %+v and %+v, want their kinds without payloads", tr.Task, c)
		}
	})

	t.Run("Limits", func(t *testing.T) {
		big := `"` + strings.Repeat("x", events.MaxPayloadBytes-1) + `"` // one byte over
		for _, tc := range []struct {
			name, body string
			status     int
			code       string
		}{
			{"KindUpperCase", `{"kind":"Resize"}`, http.StatusBadRequest, "invalid_argument"},
			{"KindTooLong", `{"kind":"` + strings.Repeat("k", 65) + `"}`, http.StatusBadRequest, "invalid_argument"},
			{"PayloadNotJSON", `{"payload": {"a": }`, http.StatusBadRequest, "invalid_argument"},
			{"PayloadTooLarge", `{"payload":` + big + `}`, http.StatusRequestEntityTooLarge, "payload_too_large"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				requireErrorBody(t, rawDo(t, b, http.MethodPost, "/v1/tasks", tc.body), tc.status, tc.code)
			})
		}
		at := `"` + strings.Repeat("x", events.MaxPayloadBytes-2) + `"`
		if got, _, err := b.client.Schedule(ctx, api.ScheduleRequest{Payload: json.RawMessage(at)}); err != nil || len(got.Payload) != events.MaxPayloadBytes {
			t.Fatalf("a payload at the limit: %d bytes, %v", len(got.Payload), err)
		}
		r := runningTask(t, b, api.ScheduleRequest{Queue: "img-limits"})
		_, err := b.client.RecordResult(ctx, r.ID, api.ResultRequest{DeliveryID: r.Claim.DeliveryID, Success: true, Output: json.RawMessage(big)})
		apiError(t, err, http.StatusRequestEntityTooLarge, "")
		if got, _ := b.client.Get(ctx, r.ID); got.Status != "running" {
			t.Fatalf("a refused result changed the task: %s", got.Status)
		}
	})
}
