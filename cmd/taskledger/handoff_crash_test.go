package main

import (
	"bufio"
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/crashpoint"
)

// TestCrashAtHandedClaim kills the server (a crashpoints binary) after it
// handed a released task straight to a waiting long poll (no ready
// notification) and before that claim was appended. The log holds the
// task released and unpublished, as after a crash right after a release:
// on restart the alarm publishes its delivery once the grace ends, a new
// claimer claims it, and the log verifies clean.
func TestCrashAtHandedClaim(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, "crashpoints")
	data, addr := t.TempDir(), freeAddr(t)
	srv := mustLaunch(t, bin, data, addr, "TASKLEDGER_CRASH_AT="+crashpoint.ClaimReceived)
	ctx := context.Background()
	later := 3600.0
	if _, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "handed", DelaySeconds: &later}); err != nil {
		t.Fatal(err) // the queue exists: a long poll waits in its dispatcher
	}
	go srv.client.ClaimNext(ctx, "handed", "w1", 30*time.Second) // cut off by the crash
	for deadline := time.Now().Add(10 * time.Second); metric(t, addr, "taskledger_claimers_waiting")[""] < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the long poll is not waiting after 10s")
		}
	}
	req := api.ScheduleRequest{Queue: "handed", RequestID: "handed"}
	srv.client.Schedule(ctx, req) // the crash may cut the answer off: repeated below
	srv.mustCrashAt(t, crashpoint.ClaimReceived)

	restarted := time.Now()
	srv = mustLaunch(t, bin, data, addr)
	c := srv.client
	task, created, err := c.Schedule(ctx, req)
	if err != nil || created {
		t.Fatalf("the handed task after the restart: created %v, %v", created, err)
	}
	got, ok, err := c.ClaimNext(ctx, "handed", "w2", 30*time.Second)
	if err != nil || !ok || got.ID != task.ID {
		t.Fatalf("claim after the restart: %s (ok %v, %v), want %s", got.ID, ok, err, task.ID)
	}
	h, err := c.History(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range h.Events {
		types = append(types, ev.Type)
		// Published only after the restart: before the crash the delivery
		// was handed off, not published.
		if ev.Type == "ReadyPublished" && ev.At.Before(restarted) {
			t.Fatalf("ReadyPublished at %s, before the restart at %s: the task was not handed off", ev.At, restarted)
		}
	}
	// After the restart the alarm publishes the delivery, or hands it to
	// w2's claim when that already waits: either way one claim.
	published := []string{"TaskScheduled", "ReadyPublished", "Claimed"}
	if handed := []string{"TaskScheduled", "Claimed"}; !slices.Equal(types, published) && !slices.Equal(types, handed) {
		t.Fatalf("history %v, want %v or %v", types, published, handed)
	}
	srv.mustStop(t)
	mustVerify(t, bin, data)
}

// metric reads every series of the counter or gauge name from the
// /metrics of the taskledger process on addr, by its labels as written
// ("" for none, `event="Claimed"` for one label).
func metric(t *testing.T, addr, name string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", addr, err)
	}
	defer resp.Body.Close()
	series := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name)
		if !ok || rest == "" || rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			labels, rest, _ = strings.Cut(rest[1:], "}")
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			t.Fatalf("%s on %s: %v", name, addr, err)
		}
		series[labels] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("metrics of %s: %v", addr, err)
	}
	return series
}
