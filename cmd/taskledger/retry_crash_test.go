package main

import (
	"context"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
)

// TestCrashAtRetryScheduled kills the server right after the alarm
// appended a RetryScheduled for a timed-out attempt: after the restart the
// log verifies clean, the task is released for its second attempt (once),
// and that attempt runs to the end.
func TestCrashAtRetryScheduled(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "crashpoints")
	data, addr := t.TempDir(), freeAddr(t)
	srv := mustLaunch(t, bin, data, addr, "TASKLEDGER_CRASH_AT="+crashpoint.RetryScheduled)
	ctx := context.Background()
	one := 1
	task, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "cp-retry", TimeoutSeconds: &one,
		Retry: &api.RetryRequest{MaxAttempts: &[]int{2}[0], BackoffSeconds: &[]int{0}[0], On: []string{events.RetryOnTimedOut}}})
	if err != nil {
		t.Fatal(err)
	}
	ready, ok, err := awaitClaimable(ctx, srv.client, task.ID, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("first attempt not claimable: %v", err)
	}
	if _, err := srv.client.Claim(ctx, task.ID, ready.Delivery.ID, "w1"); err != nil {
		t.Fatal(err)
	}
	// Abandoned: the alarm times it out, retries it and dies.
	srv.mustCrashAt(t, crashpoint.RetryScheduled)

	srv = mustLaunch(t, bin, data, addr)
	srv.mustStop(t)
	mustVerify(t, bin, data)
	srv = mustLaunch(t, bin, data, addr)
	c := srv.client
	ready, ok, err = awaitClaimable(ctx, c, task.ID, 10*time.Second)
	if err != nil || !ok || ready.Attempt != 2 || len(ready.Attempts) != 1 || ready.Attempts[0].Outcome != "timed_out" {
		t.Fatalf("second attempt after the restart: %+v, %v, %v", ready, ok, err)
	}
	claimed, err := c.Claim(ctx, task.ID, ready.Delivery.ID, "w2")
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true})
	if err != nil || done.Status != "succeeded" || len(done.Attempts) != 2 {
		t.Fatalf("second attempt's result: %+v, %v", done, err)
	}
	h, err := c.History(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, ev := range h.Events {
		counts[ev.Type]++
	}
	// Two deliveries: the first in TaskScheduled (due at once), the
	// second a DeliveryPending. A claim may get to a delivery before its
	// ReadyPublished, which is then not written: one or two of those.
	if counts[string(events.TypeRetryScheduled)] != 1 || counts[string(events.TypeDeliveryPending)] != 1 ||
		counts[string(events.TypeReadyPublished)] < 1 || counts[string(events.TypeReadyPublished)] > 2 ||
		counts[string(events.TypeClaimed)] != 2 || counts[string(events.TypeTimedOut)] != 0 {
		t.Fatalf("history event counts %v, want one retry, two deliveries and two claims", counts)
	}
	srv.mustStop(t)
	mustVerify(t, bin, data)
}
