package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

// TestClaimNext checks the HTTP answer of claims/next when nothing is
// ready: 204 without a body. (What claims/next claims is
// internal/scheduler's TestClaimNext; the 200 answer is TestLifecycle's.)
func TestClaimNext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("EmptyQueueAnswersNoContent", func(t *testing.T) {
		t.Parallel()
		a := rawDo(t, b, http.MethodPost, "/v1/claims/next", `{"queue":"empty","executorId":"w1","waitSeconds":0}`)
		if a.status != http.StatusNoContent || len(a.body) != 0 {
			t.Fatalf("claims/next on an empty queue: %d %q, want 204 and no body", a.status, a.body)
		}
		_, ok, err := b.client.ClaimNext(ctx, "empty", "w1", 0)
		if err != nil || ok {
			t.Fatalf("client claims/next on an empty queue: ok=%v err=%v", ok, err)
		}
	})
}

// TestClaimNextGoneClient: a long poll whose client hangs up leaves no
// notification taken. A task scheduled after the hang-up is claimed by
// the next poll within its 5 s, although a notification taken and never
// acknowledged would stay hidden for the consumer's 30 s ack wait.
func TestClaimNextGoneClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A queue gets its consumer, and polls their place in its line, once
	// it has a task.
	mustSchedule(t, b, api.ScheduleRequest{Queue: "hangup", DelaySeconds: new(3600.0)})
	ctx, hangUp := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, _, err := b.client.ClaimNext(ctx, "hangup", "w-gone", 30*time.Second)
		gone <- err
	}()
	eventually(t, "the poll waiting", func() bool { return b.node.Service.Waiting("hangup") == 1 })
	hangUp()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the hung-up poll returned %v", err)
	}
	eventually(t, "the server noticing the hang-up", func() bool { return b.node.Service.Waiting("hangup") == 0 })
	task := mustSchedule(t, b, api.ScheduleRequest{Queue: "hangup"})
	got, ok, err := b.client.ClaimNext(context.Background(), "hangup", "w-next", 5*time.Second)
	if err != nil || !ok || got.ID != task.ID {
		t.Fatalf("the next poll got %v, %v, %v; want task %s", got.ID, ok, err, task.ID)
	}
}
