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

// Helpers shared by the end-to-end tests of the HTTP contract.

// text is a one-part text message with id.
func text(id, s string) events.Message {
	return events.Message{ID: id, Content: []events.ContentPart{{Type: "text", Text: s}}}
}

// mustSchedule schedules req and fails the test on any error.
func mustSchedule(t *testing.T, b *bundle, req api.ScheduleRequest) api.Task {
	t.Helper()
	task, _, err := b.client.Schedule(context.Background(), req)
	if err != nil {
		t.Fatalf("schedule %+v: %v", req, err)
	}
	return task
}

// queuedTask schedules req and waits until its ready notification is out.
func queuedTask(t *testing.T, b *bundle, req api.ScheduleRequest) api.Task {
	t.Helper()
	task := b.waitStatus(t, mustSchedule(t, b, req).ID, "queued")
	if task.Delivery == nil || task.Delivery.ID == "" {
		t.Fatalf("queued task without a delivery: %+v", task)
	}
	return task
}

// runningTask schedules req and claims it with its delivery token as
// executor "w1".
func runningTask(t *testing.T, b *bundle, req api.ScheduleRequest) api.Task {
	t.Helper()
	q := queuedTask(t, b, req)
	task, err := b.client.Claim(context.Background(), q.ID, q.Delivery.ID, "w1")
	if err != nil {
		t.Fatalf("claim %s: %v", q.ID, err)
	}
	if task.Status != "running" {
		t.Fatalf("claimed task is %s, want running", task.Status)
	}
	return task
}

// historyTypes returns the event types of a task's history in log order.
func historyTypes(t *testing.T, b *bundle, id string) []string {
	t.Helper()
	h, err := b.client.History(context.Background(), id)
	if err != nil {
		t.Fatalf("history %s: %v", id, err)
	}
	out := make([]string, len(h.Events))
	for i, ev := range h.Events {
		out[i] = ev.Type
	}
	return out
}

// countType counts the events of type typ in a task's history.
func countType(t *testing.T, b *bundle, id, typ string) int {
	t.Helper()
	n := 0
	for _, got := range historyTypes(t, b, id) {
		if got == typ {
			n++
		}
	}
	return n
}

// lastSeq returns the last sequence of the bundle's event stream, read
// from the server (not from the projections, which may lag).
func lastSeq(t *testing.T, b *bundle) uint64 {
	t.Helper()
	seq, err := b.node.Store.LastSeq(context.Background()) // every shard's
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// settled waits until the projections have applied everything in the log.
func settled(t *testing.T, b *bundle) {
	t.Helper()
	seq := lastSeq(t, b)
	eventually(t, "projections applied the log", func() bool { return b.node.Engine.Applied() >= seq })
}

// rawAnswer is an HTTP answer as it came over the wire.
type rawAnswer struct {
	status int
	header http.Header
	body   []byte
}

// rawDo sends body (as is, "" for none) and returns the answer unparsed.
func rawDo(t *testing.T, b *bundle, method, path, body string) rawAnswer {
	t.Helper()
	return authDo(t, b, "", method, path, body)
}

// requireErrorBody asserts a non-2xx answer with status and the JSON error
// body: {"error": code, "message": "..."}.
func requireErrorBody(t *testing.T, a rawAnswer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d; body %s", a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q, want application/json; body %s", ct, a.body)
	}
	var e struct {
		Error   *string `json:"error"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(a.body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", a.body, err)
	}
	if e.Error == nil || *e.Error != code || e.Message == nil || *e.Message == "" {
		t.Fatalf("error body %s, want error %q and a message", a.body, code)
	}
}

// mailIDs returns the ids of mailbox items in order.
func mailIDs(items []api.MailItem) []string {
	out := make([]string, len(items))
	for i, m := range items {
		out[i] = m.ID
	}
	return out
}

// taskIDs returns the ids of tasks, sorted.
func taskIDs(tasks []api.Task) []string {
	out := make([]string, len(tasks))
	for i, task := range tasks {
		out[i] = task.ID
	}
	slices.Sort(out)
	return out
}

// sorted returns ids sorted, for comparing sets.
func sorted(ids ...string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}
