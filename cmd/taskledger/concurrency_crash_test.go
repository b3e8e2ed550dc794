package main

import (
	"context"
	"slices"
	"strings"
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
	select {
	case <-srv.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not crash at %s within 30s\n%s", crashpoint.SlotAcquired, srv.out)
	}
	if !srv.killedBySIGKILL() || !strings.Contains(srv.out.String(), "crashpoint: killing the process at "+crashpoint.SlotAcquired) {
		t.Fatalf("the server did not die at the crash point: %v\n%s", srv.cmd.ProcessState, srv.out)
	}

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
