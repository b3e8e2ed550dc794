package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// Customer B holding its whole allowance of long polls on a shared queue
// gets 429 too_many_polls for one more, with Retry-After, while customer
// A's claims there succeed, every one.
func TestLongPollsPerCustomerOverHTTP(t *testing.T) {
	t.Parallel()
	const bound = 40
	b := setup(t, func(c *node.Config) {
		c.Tokens = tenantTokens
		c.Limits = scheduler.Limits{MaxPollsPerCustomer: bound}
	})
	a, bee := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b")
	bee.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: bound}}
	t.Cleanup(bee.HTTP.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	if _, _, err := bee.Schedule(ctx, api.ScheduleRequest{Queue: "shared", DelaySeconds: new(3600.0)}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range bound {
		wg.Go(func() {
			if _, _, err := bee.ClaimNext(ctx, "shared", "b", 60*time.Second); err != nil && ctx.Err() == nil {
				t.Errorf("one of B's polls: %v", err)
			}
		})
	}
	eventually(t, "B's polls waiting", func() bool { return b.node.Service.Waiting("shared") == bound })

	ans := authDo(t, b, "Bearer tok-b", http.MethodPost, "/v1/claims/next", `{"queue":"shared","executorId":"b","waitSeconds":1}`)
	if ans.status != http.StatusTooManyRequests || ans.header.Get("Retry-After") == "" ||
		!strings.Contains(string(ans.body), `"reason":"too_many_polls"`) || !strings.Contains(string(ans.body), "at most 40") {
		t.Fatalf("B's extra poll: %d %q %v, want 429 too_many_polls with Retry-After", ans.status, ans.body, ans.header)
	}
	if _, _, err := bee.ClaimNext(ctx, "shared", "b", time.Second); !errors.Is(err, api.ErrTooManyPolls) {
		t.Fatalf("B's extra poll through the client: %v, want ErrTooManyPolls", err)
	}

	for range 20 {
		task, _, err := a.Schedule(ctx, api.ScheduleRequest{Queue: "shared"})
		if err != nil {
			t.Fatal(err)
		}
		got, ok, err := a.ClaimNext(ctx, "shared", "a", 5*time.Second)
		if err != nil || !ok || got.ID != task.ID {
			t.Fatalf("A's claim: %s ok %v err %v, want %s", got.ID, ok, err, task.ID)
		}
	}
}
