package main

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/lease"
)

// rangeAddr returns a free loopback address with a port of this test's
// range (25600-25999).
func rangeAddr(t *testing.T) string {
	t.Helper()
	for port := 25600; port < 26000; port++ {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			ln.Close()
			return ln.Addr().String()
		}
	}
	t.Fatal("no free port in 25600-25999")
	return ""
}

// owned returns the timer partitions p's GET /v1/stats shows it holds.
func owned(t *testing.T, p *process) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := p.client.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Partitions == nil {
		t.Fatal("GET /v1/stats shows no partitions")
	}
	return s.Partitions.Owned
}

// TestPartitionTakeover runs two `taskledger serve` processes on one
// NATS server (the first one's, exposed with --nats-listen, both with
// the same --nats-token-file), waits until
// they split the timer partitions, schedules delayed tasks and kills the
// second with SIGKILL before they are due. The first takes over the dead
// process's partitions once their leases expire, and releases and
// delivers every task, those of the dead process's partitions too: none
// is lost, and the log verifies clean.
func TestPartitionTakeover(t *testing.T) {
	t.Parallel()
	const parts, total, ttl = 8, 40, 2 * time.Second
	bin := taskledgerBinary(t)
	data, natsAddr := t.TempDir(), rangeAddr(t)
	// The second process shares the first's log with taskledger's own
	// token: the exposed port admits no connection without one.
	flags := []string{"--timer-partitions", strconv.Itoa(parts), "--lease-ttl", ttl.String(), "--nats-token-file", writeTokenFile(t)}
	a := startServer(t, data, freeAddr(t), append(flags, "--nats-listen", natsAddr, "--name", "sched-a")...)
	// Every process of a log holds its chain key: b a copy of a's.
	b := startServer(t, t.TempDir(), freeAddr(t), append(flags, "--nats-url", "nats://"+natsAddr, "--name", "sched-b",
		"--chain-key-file", filepath.Join(data, chainkey.FileName))...)
	var ownedA, ownedB []int
	waitFor(t, "the partitions split 4 and 4", func() bool {
		ownedA, ownedB = owned(t, a), owned(t, b)
		return len(ownedA) == parts/2 && len(ownedB) == parts/2
	})

	// Due well after the kill below, so the dead process releases none.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runAt := time.Now().Add(5 * time.Second).UTC()
	reqs := make([]api.ScheduleRequest, total)
	for i := range reqs {
		reqs[i] = api.ScheduleRequest{Queue: "takeover", RunAt: &runAt}
	}
	items, err := a.client.ScheduleBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	b.kill()
	killed := time.Now()
	var ids, orphans []string
	for _, it := range items {
		if it.Task == nil {
			t.Fatalf("schedule: %+v", it)
		}
		ids = append(ids, it.Task.ID)
		if slices.Contains(ownedB, lease.Partition(it.Task.ID, parts)) {
			orphans = append(orphans, it.Task.ID)
		}
	}
	if len(orphans) == 0 {
		t.Fatalf("none of %d tasks fell in the killed process's partitions %v", total, ownedB)
	}

	waitFor(t, "the survivor holds every partition", func() bool { return len(owned(t, a)) == parts })
	t.Logf("partitions taken over %s after the kill (lease TTL %s); %d of %d tasks were the dead process's", time.Since(killed).Round(10*time.Millisecond), ttl, len(orphans), total)
	for _, id := range ids {
		waitFor(t, "task "+id+" queued", func() bool {
			task, err := a.client.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return task.Status == "queued"
		})
	}
	for _, id := range orphans {
		h, err := a.client.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range h.Events {
			if ev.Type == string(events.TypeDeliveryPending) && ev.Actor != "sched-a" {
				t.Errorf("task %s of the dead process's partition released by %s", id, ev.Actor)
			}
		}
	}

	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v", err)
	}
	mustVerify(t, bin, data)
}

// waitFor polls cond every 20ms until it holds, failing after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
