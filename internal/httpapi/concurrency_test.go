package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/replay"
)

const storefront = "repo:example/storefront"

// keyed is a schedule body on queue cq with a concurrency limit.
func keyed(id, key string, limit int) api.ScheduleRequest {
	return api.ScheduleRequest{Queue: "cq", RequestID: id, Message: text("objective", id),
		Concurrency: &events.Concurrency{Key: key, Limit: limit}}
}

// slotTasks returns the task ids of holders or waiters.
func slotTasks(ks []api.KeySlotter) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.TaskID
	}
	return out
}

// waitKey polls a key until its holders and waiters are those given.
func waitKey(t *testing.T, c *api.Client, key string, holders, waiters []string) {
	t.Helper()
	var k api.ConcurrencyKey
	eventually(t, fmt.Sprintf("key %s holders %v waiters %v", key, holders, waiters), func() bool {
		var err error
		if k, err = c.Concurrency(context.Background(), key, ""); err != nil {
			t.Fatal(err)
		}
		return slices.Equal(slotTasks(k.Holders), holders) && slices.Equal(slotTasks(k.Waiters), waiters)
	})
}

// TestConcurrencyLimitOne: with limit 1 the second task of a key waits,
// visibly, while the first holds the slot, and is released when the first
// ends; cancelling a holder frees its slot for the next; other keys and
// unkeyed tasks on the same queue are never held behind the full key.
func TestConcurrencyLimitOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first := runningTask(t, b, keyed("first", storefront, 1))
	if first.Concurrency == nil || *first.Concurrency != (events.Concurrency{Key: storefront, Limit: 1}) || first.WaitingFor != "" {
		t.Fatalf("first task: concurrency %+v waitingFor %q", first.Concurrency, first.WaitingFor)
	}
	second := mustSchedule(t, b, keyed("second", storefront, 1))
	third := mustSchedule(t, b, keyed("third", storefront, 1))
	waitKey(t, b.client, storefront, []string{first.ID}, []string{second.ID, third.ID})

	// Neither another key nor an unkeyed task waits behind the full key.
	queuedTask(t, b, keyed("other-key", "repo:example/other", 1))
	queuedTask(t, b, api.ScheduleRequest{Queue: "cq", Message: text("objective", "unkeyed")})
	settled(t, b)
	got, err := b.client.Get(ctx, second.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "scheduled" || got.Delivery != nil || got.WaitingFor != api.WaitingForConcurrency {
		t.Fatalf("second task while the key is full: status %s delivery %+v waitingFor %q", got.Status, got.Delivery, got.WaitingFor)
	}

	if _, err := b.client.RecordResult(ctx, first.ID, api.ResultRequest{DeliveryID: first.Claim.DeliveryID, Success: true}); err != nil {
		t.Fatal(err)
	}
	got = b.waitStatus(t, second.ID, "queued")
	if got.WaitingFor != "" {
		t.Fatalf("released task still waitingFor %q", got.WaitingFor)
	}
	waitKey(t, b.client, storefront, []string{second.ID}, []string{third.ID})

	// Cancelling the holder (queued, not even claimed) frees its slot.
	if _, err := b.client.Cancel(ctx, second.ID, "not needed"); err != nil {
		t.Fatal(err)
	}
	b.waitStatus(t, third.ID, "queued")
	waitKey(t, b.client, storefront, []string{third.ID}, []string{})
	// A canceled waiter leaves the waiters without taking a slot.
	fourth := mustSchedule(t, b, keyed("fourth", storefront, 1))
	waitKey(t, b.client, storefront, []string{third.ID}, []string{fourth.ID})
	if _, err := b.client.Cancel(ctx, fourth.ID, ""); err != nil {
		t.Fatal(err)
	}
	waitKey(t, b.client, storefront, []string{third.ID}, []string{})

	// The history shows when the second task took and gave back its slot.
	want := []string{"TaskScheduled", "SlotAcquired", "DeliveryPending", "ReadyPublished", "Canceled", "SlotReleased"}
	if got := historyTypes(t, b, second.ID); !slices.Equal(got, want) {
		t.Fatalf("history %v, want %v", got, want)
	}
}

// TestConcurrencyInputs: every client-given part of a concurrency limit
// and of GET /v1/concurrency is bounded and answers 400 with a reason.
func TestConcurrencyInputs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct{ name, body string }{
		{"EmptyKey", `{"concurrency":{"key":"","limit":1}}`},
		{"NoKey", `{"concurrency":{"limit":1}}`},
		{"HugeKey", `{"concurrency":{"key":"` + strings.Repeat("k", 257) + `","limit":1}}`},
		{"LimitZero", `{"concurrency":{"key":"k","limit":0}}`},
		{"NoLimit", `{"concurrency":{"key":"k"}}`},
		{"LimitTooLarge", `{"concurrency":{"key":"k","limit":1001}}`},
		{"NegativeLimit", `{"concurrency":{"key":"k","limit":-1}}`},
		{"LimitNotANumber", `{"concurrency":{"key":"k","limit":"1"}}`},
		{"NotAnObject", `{"concurrency":"k"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			requireErrorBody(t, rawDo(t, b, http.MethodPost, "/v1/tasks", tc.body), http.StatusBadRequest, "invalid_argument")
		})
	}
	t.Run("LargestKeyAndLimit", func(t *testing.T) {
		t.Parallel()
		task := mustSchedule(t, b, keyed("largest", strings.Repeat("k", 256), 1000))
		if task.Concurrency.Limit != 1000 {
			t.Fatalf("concurrency %+v", task.Concurrency)
		}
	})
	for _, tc := range []struct{ name, query string }{
		{"GetWithoutKey", ""},
		{"GetHugeKey", "key=" + strings.Repeat("k", 257)},
		{"GetBadCustomer", "key=k&customerId=" + url.QueryEscape("a b")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			requireErrorBody(t, rawDo(t, b, http.MethodGet, "/v1/concurrency?"+tc.query, ""), http.StatusBadRequest, "invalid_argument")
		})
	}
}

// TestConcurrencyTenancy: a customer sees only its own keys; keys of the
// same name of two customers are two keys; the operator may name one.
func TestConcurrencyTenancy(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	a, bb, op := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b"), tokenClient(t, b, "tok-op")
	ctx := context.Background()
	held, _, err := a.Schedule(ctx, keyed("a-held", storefront, 1))
	if err != nil {
		t.Fatal(err)
	}
	waitKey(t, a, storefront, []string{held.ID}, []string{})
	// B's key of the same name is free: B's task is released at once.
	own, _, err := bb.Schedule(ctx, keyed("b-own", storefront, 1))
	if err != nil {
		t.Fatal(err)
	}
	waitKey(t, bb, storefront, []string{own.ID}, []string{})
	requireErrorBody(t, authDo(t, b, "Bearer tok-b", http.MethodGet, "/v1/concurrency?key=k&customerId=A", ""), http.StatusNotFound, "not_found")
	k, err := op.Concurrency(ctx, storefront, "A")
	if err != nil {
		t.Fatal(err)
	}
	if k.CustomerID != "A" || !slices.Equal(slotTasks(k.Holders), []string{held.ID}) {
		t.Fatalf("operator sees %+v", k)
	}
}

// TestConcurrencyWithRetry: a keyed task retried after a failure gives
// its slot back for its backoff, so the key's waiter, due first, takes it;
// the retried task then waits for a slot (waitingFor "concurrency") and
// runs its next attempt under a slot of its own once the waiter ends.
// Never two holders; history shows each slot taken and given back.
func TestConcurrencyWithRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const key = "repo:example/retried"
	req := keyed("flaky", key, 1)
	req.Retry = &api.RetryRequest{MaxAttempts: refOf(2), BackoffSeconds: refOf(0)}
	first := runningTask(t, b, req)
	waiter := mustSchedule(t, b, keyed("waiter", key, 1))
	waitKey(t, b.client, key, []string{first.ID}, []string{waiter.ID})

	if _, err := b.client.RecordResult(ctx, first.ID, api.ResultRequest{DeliveryID: first.Claim.DeliveryID, Error: "flaky tool"}); err != nil {
		t.Fatal(err)
	}
	queued := b.waitStatus(t, waiter.ID, "queued") // the retried task's slot, given back
	waitKey(t, b.client, key, []string{waiter.ID}, []string{first.ID})
	if got, err := b.client.Get(ctx, first.ID); err != nil || got.Status != "scheduled" || got.Attempt != 2 || got.WaitingFor != api.WaitingForConcurrency {
		t.Fatalf("retried task %s attempt %d waitingFor %q (%v), want scheduled attempt 2 waiting for concurrency", got.Status, got.Attempt, got.WaitingFor, err)
	}
	claimed, err := b.client.Claim(ctx, queued.ID, queued.Delivery.ID, "w2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.RecordResult(ctx, claimed.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true}); err != nil {
		t.Fatal(err)
	}
	again := b.waitStatus(t, first.ID, "queued")
	if again.Attempt != 2 {
		t.Fatalf("attempt %d after one failure, want 2", again.Attempt)
	}
	waitKey(t, b.client, key, []string{first.ID}, nil)
	claimed, err = b.client.Claim(ctx, again.ID, again.Delivery.ID, "w3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.RecordResult(ctx, claimed.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true}); err != nil {
		t.Fatal(err)
	}
	waitKey(t, b.client, key, nil, nil)

	h, err := b.client.History(ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	var slots []string
	for _, ev := range h.Events {
		if strings.HasPrefix(ev.Type, "Slot") || ev.Type == string(events.TypeRetryScheduled) {
			slots = append(slots, ev.Type+": "+ev.Detail)
		}
	}
	want := []string{
		`SlotAcquired: took a slot of concurrency key "repo:example/retried" (limit 1)`,
		"RetryScheduled: " + h.Events[slices.IndexFunc(h.Events, func(e api.Event) bool { return e.Type == string(events.TypeRetryScheduled) })].Detail,
		`SlotReleased: gave back its slot of concurrency key "repo:example/retried" (retried)`,
		`SlotAcquired: took a slot of concurrency key "repo:example/retried" (limit 1) for attempt 2`,
		`SlotReleased: gave back its slot of concurrency key "repo:example/retried" (task succeeded) for attempt 2`,
	}
	if !slices.Equal(slots, want) {
		t.Fatalf("slot history\n%s\nwant\n%s", strings.Join(slots, "\n"), strings.Join(want, "\n"))
	}
	verifyStore(t, b)
}

// verifyStore runs replay verify over the whole log of b's node.
func verifyStore(t *testing.T, b *bundle) {
	t.Helper()
	st := b.node.Store
	v := replay.NewVerifier(st.Subjects())
	err := eventlog.Log{JS: st.JetStream(), Stream: st.Config().Stream, Subjects: st.Subjects()}.Read(context.Background(), eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := v.Report(); !r.Clean() {
		t.Fatalf("replay verify: %+v", r.Violations)
	}
}
