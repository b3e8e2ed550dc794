package httpapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

func TestLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	task, created, err := b.client.Schedule(ctx, api.ScheduleRequest{
		Queue: "build", Repo: "example/storefront",
		Message: events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "fix the flaky test"}}},
	})
	if err != nil || !created {
		t.Fatalf("schedule: %v created=%v", err, created)
	}
	// Due at once: released before the answer, published right after it.
	if task.Status != "scheduled" && task.Status != "queued" || task.Delivery == nil || task.CustomerID != "default" || task.RootID != task.ID || task.TimeoutSeconds != 3600 {
		t.Fatalf("scheduled task: %+v", task)
	}
	queued := b.waitStatus(t, task.ID, "queued")
	if queued.Delivery == nil || queued.Delivery.ID == "" {
		t.Fatalf("queued without delivery: %+v", queued)
	}

	claimed, ok, err := b.client.ClaimNext(ctx, "build", "w1", 5*time.Second)
	if err != nil || !ok {
		t.Fatalf("claims/next: ok=%v err=%v", ok, err)
	}
	if claimed.ID != task.ID || claimed.Status != "running" || claimed.Claim == nil || claimed.Claim.ExecutorID != "w1" ||
		claimed.Claim.DeliveryID != queued.Delivery.ID || claimed.StartedAt.IsZero() {
		t.Fatalf("claimed: %+v", claimed)
	}
	if claimed.TimeoutSeconds != 3600 || !claimed.Deadline.After(claimed.StartedAt) {
		t.Fatalf("running task without its deadline: timeout %d, started %v, deadline %v", claimed.TimeoutSeconds, claimed.StartedAt, claimed.Deadline)
	}
	if len(claimed.Message.Content) != 1 || claimed.Message.Content[0].Text != "fix the flaky test" {
		t.Fatalf("claimed task lost its message: %+v", claimed.Message)
	}
	done, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{
		DeliveryID: claimed.Claim.DeliveryID, Success: true, Summary: "fixed",
		Effects: []events.Effect{{Kind: "pull_request", Ref: "42", URL: "https://example.invalid/pr/42"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != "succeeded" || done.Result == nil || done.Result.Summary != "fixed" || len(done.Result.Effects) != 1 ||
		done.CompletedAt.IsZero() || !done.Deadline.IsZero() {
		t.Fatalf("result: %+v", done)
	}
	h, err := b.client.History(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range h.Events {
		types = append(types, ev.Type)
	}
	want := []string{"TaskScheduled", "ReadyPublished", "Claimed", "ResultRecorded"} // released in TaskScheduled
	if len(types) != len(want) {
		t.Fatalf("history %v, want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("history %v, want %v", types, want)
		}
	}
	if done.Version != len(want) {
		t.Fatalf("version %d, want %d", done.Version, len(want))
	}
}
