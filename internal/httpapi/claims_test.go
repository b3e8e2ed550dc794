package httpapi_test

import (
	"context"
	"net/http"
	"testing"
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
