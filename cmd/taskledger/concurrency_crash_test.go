package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
)

// TestCrashAtSlotAcquired kills the server (a crashpoints binary) right
// after it took a concurrency slot for a task and before it released the
// task. On restart the slot is still the task's, from the log: the task is
// released with it (not given a second one), a second task of the key
// waits until the first ends, and the log verifies clean.
func TestCrashAtSlotAcquired(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "crashpoints")
	data, addr := t.TempDir(), freeAddr(t)
	srv := mustLaunch(t, bin, data, addr, "TASKLEDGER_CRASH_AT="+crashpoint.SlotAcquired)
	conc := &events.Concurrency{Key: "repo:example/storefront", Limit: 1}
	first := api.ScheduleRequest{Queue: "cc", RequestID: "first", Concurrency: conc}
	second := api.ScheduleRequest{Queue: "cc", RequestID: "second", Concurrency: conc}
	ctx := context.Background()
	srv.client.Schedule(ctx, first) // the crash may cut the answer off: retried below
	srv.mustCrashAt(t, crashpoint.SlotAcquired)

	srv = mustLaunch(t, bin, data, addr)
	c := srv.client
	a, created, err := c.Schedule(ctx, first)
	if err != nil || created {
		t.Fatalf("first task after the restart: created %v, %v", created, err)
	}
	b, _, err := c.Schedule(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(want string) {
		t.Helper()
		task, ok, err := c.ClaimNext(ctx, "cc", "w1", 30*time.Second)
		if err != nil || !ok || task.ID != want {
			t.Fatalf("claim: got %s (ok %v, %v), want %s", task.ID, ok, err, want)
		}
		if _, err := c.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
			t.Fatal(err)
		}
	}
	claim(a.ID) // released after the restart, with the slot it took before the crash
	k, err := c.Concurrency(ctx, conc.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(k.Holders) > 1 {
		t.Fatalf("holders %+v", k.Holders)
	}
	claim(b.ID)
	h, err := c.History(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range h.Events {
		// A claim that beats the publisher's ReadyPublished leaves it out.
		if ev.Type != "ReadyPublished" {
			types = append(types, ev.Type)
		}
	}
	want := []string{"TaskScheduled", "SlotAcquired", "DeliveryPending", "Claimed", "ResultRecorded", "SlotReleased"}
	if !slices.Equal(types, want) {
		t.Fatalf("history of the first task %v, want %v", types, want)
	}
	srv.mustStop(t)
	mustVerify(t, bin, data)
}

// TestCrashAtRetryScheduledKeyed kills the server right after the alarm
// appended a RetryScheduled for a keyed task's timed-out attempt, before
// the task gave that attempt's slot back. On restart the slot is given
// back from the log, once: the key's waiter, due first, runs under it;
// then the retried task takes a slot for its second attempt and runs; the
// log verifies clean.
func TestCrashAtRetryScheduledKeyed(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "crashpoints")
	data, addr := t.TempDir(), freeAddr(t)
	srv := mustLaunch(t, bin, data, addr, "TASKLEDGER_CRASH_AT="+crashpoint.RetryScheduled)
	ctx := context.Background()
	conc := &events.Concurrency{Key: "repo:example/flaky", Limit: 1}
	one, two, zero := 1, 2, 0
	flaky, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "cc-retry", RequestID: "flaky", TimeoutSeconds: &one, Concurrency: conc,
		Retry: &api.RetryRequest{MaxAttempts: &two, BackoffSeconds: &zero, On: []string{events.RetryOnTimedOut}}})
	if err != nil {
		t.Fatal(err)
	}
	ready, ok, err := awaitClaimable(ctx, srv.client, flaky.ID, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("first attempt not claimable: %v", err)
	}
	if _, err := srv.client.Claim(ctx, flaky.ID, ready.Delivery.ID, "w1"); err != nil {
		t.Fatal(err)
	}
	waiter, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "cc-retry", RequestID: "waiter", Concurrency: conc})
	if err != nil {
		t.Fatal(err)
	}
	// Abandoned: the alarm times the attempt out, retries it and dies.
	srv.mustCrashAt(t, crashpoint.RetryScheduled)

	srv = mustLaunch(t, bin, data, addr)
	c := srv.client
	run := func(want string, attempt int) {
		t.Helper()
		task, ok, err := c.ClaimNext(ctx, "cc-retry", "w2", 30*time.Second)
		if err != nil || !ok || task.ID != want || task.Attempt != attempt {
			t.Fatalf("claim: got %s attempt %d (ok %v, %v), want %s attempt %d", task.ID, task.Attempt, ok, err, want, attempt)
		}
		if _, err := c.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
			t.Fatal(err)
		}
	}
	run(waiter.ID, 1) // under the slot the retried task gave back after the restart
	run(flaky.ID, 2)
	// The second slot is given back by the alarm after the result, so the
	// history may lack its SlotReleased for a moment.
	var counts map[string]int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		h, err := c.History(ctx, flaky.ID)
		if err != nil {
			t.Fatal(err)
		}
		counts = map[string]int{}
		for _, ev := range h.Events {
			counts[ev.Type]++
		}
		if counts[string(events.TypeSlotReleased)] >= 2 || time.Now().After(deadline) {
			break
		}
	}
	if counts[string(events.TypeSlotAcquired)] != 2 || counts[string(events.TypeSlotReleased)] != 2 || counts[string(events.TypeRetryScheduled)] != 1 {
		t.Fatalf("history event counts %v, want two slots taken and given back, one retry", counts)
	}
	srv.mustStop(t)
	mustVerify(t, bin, data)
}
