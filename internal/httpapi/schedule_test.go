package httpapi_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/taskledger/taskledger/api"
)

// TestIdempotentSchedule checks the HTTP status of a schedule: 201 for a
// new task, 200 with the same task for a repeated request id. (What a
// repeat answers, per customer and under races, is internal/scheduler's
// TestScheduleIdempotent.)
func TestIdempotentSchedule(t *testing.T) {
	t.Parallel()
	b := setup(t)

	body := `{"customerId":"repeat","requestId":"req-42","queue":"idem","message":{"id":"m1","content":[{"type":"text","text":"once"}]}}`
	first := rawDo(t, b, http.MethodPost, "/v1/tasks", body)
	var created api.Task
	if first.status != http.StatusCreated || json.Unmarshal(first.body, &created) != nil || created.ID == "" || created.RequestID != "req-42" {
		t.Fatalf("first schedule: %d %s, want 201", first.status, first.body)
	}
	second := rawDo(t, b, http.MethodPost, "/v1/tasks", body)
	var again api.Task
	if second.status != http.StatusOK || json.Unmarshal(second.body, &again) != nil || again.ID != created.ID {
		t.Fatalf("repeated schedule: %d %s, want 200 with id %s", second.status, second.body, created.ID)
	}
}
