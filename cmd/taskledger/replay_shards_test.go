package main

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/events"
)

// TestShardedReplayCommands runs the offline log tools against a data
// directory of three shards: verify, history --offline (one task and a
// lineage) and rebuild read K from the log's metadata and every shard; a
// start with another --shards is refused, one with the same serves the
// rebuilt snapshot.
func TestShardedReplayCommands(t *testing.T) {
	t.Parallel()
	data, addr := t.TempDir(), freeAddr(t)
	srv := startServer(t, data, addr, "--shards", "3")
	roots := replayTraffic(t, srv.client)
	mailed, err := srv.client.History(context.Background(), roots[1])
	if err != nil {
		t.Fatal(err)
	}
	replayStopServer(t, srv)

	out, errOut, code := replayCLI(t, "replay", "verify", "--data", data)
	m := replayVerifySummary.FindStringSubmatch(out)
	if code != 0 || m == nil || m[3] != "0" || m[2] != "21" {
		t.Fatalf("verify: exit %d, output %q, want N events, 21 tasks, 0 violations\nstderr:\n%s", code, out, errOut)
	}
	nEvents := m[1]
	used := map[int]bool{}
	for _, root := range roots {
		used[events.Shards{K: 3}.Of("default", root)] = true
	}
	if n := strings.Count(out, "saved chain head: "); n != len(used) {
		t.Fatalf("verify named %d saved chain heads, want one a shard with events (%d):\n%s", n, len(used), out)
	}

	out, errOut, code = replayCLI(t, "history", roots[1], "--offline", "--data", data, "--ndjson")
	if code != 0 {
		t.Fatalf("history: exit %d\nstderr:\n%s", code, errOut)
	}
	var got, want []uint64
	for _, e := range mailed.Events {
		want = append(want, e.Seq)
	}
	for line := range strings.Lines(out) {
		var e struct {
			Seq uint64 `json:"seq"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		got = append(got, e.Seq)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("offline history positions %v, server said %v", got, want)
	}
	out, _, code = replayCLI(t, "history", roots[0], "--tree", "--offline", "--data", data)
	if code != 0 || strings.Count(out, "TaskScheduled") != 2 {
		t.Fatalf("tree history (exit %d):\n%s", code, out)
	}
	out, _, code = replayCLI(t, "history", "--customer", "default", "--offline", "--data", data, "--ndjson")
	if n := strings.Count(out, "\n"); code != 0 || strconv.Itoa(n) != nEvents {
		t.Fatalf("customer history (exit %d): %d lines, want %s (every shard's)", code, n, nEvents)
	}

	out, errOut, code = replayCLI(t, "replay", "rebuild", "--data", data)
	rebuilt := regexp.MustCompile(`^rebuilt (\d+) events in .*; snapshot written; digest ([0-9a-f]{64})\n$`).FindStringSubmatch(out)
	if code != 0 || rebuilt == nil || rebuilt[1] != nEvents {
		t.Fatalf("rebuild: exit %d, output %q, want %s events\nstderr:\n%s", code, out, nEvents, errOut)
	}

	_, errOut, code = replayCLI(t, "serve", "--data", data, "--http", freeAddr(t))
	if code == 0 || !strings.Contains(errOut, "another number of shards") {
		t.Fatalf("serve without --shards on a log of 3: exit %d, stderr:\n%s", code, errOut)
	}

	addr = freeAddr(t)
	srv = startServer(t, data, addr, "--shards", "3")
	defer replayStopServer(t, srv)
	resp, err := http.Get("http://" + addr + "/readyz?digest=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ready replayReadyz
	if err := json.NewDecoder(resp.Body).Decode(&ready); err != nil {
		t.Fatal(err)
	}
	if strconv.FormatUint(ready.Applied, 10) != nEvents || ready.Digest != rebuilt[2] {
		t.Fatalf("serving at %d with digest %s; rebuilt %s events with %s", ready.Applied, ready.Digest, nEvents, rebuilt[2])
	}
}
