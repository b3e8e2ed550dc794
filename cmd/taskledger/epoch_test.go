package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
)

// TestEpochCommands runs a server whose log has epochs of a second: an
// epoch whose lineage ended is sealed, archived, verified against the
// log, removed, and its task's history still answers from the archive,
// while the log, now without it, verifies clean.
func TestEpochCommands(t *testing.T) {
	t.Parallel()
	for _, k := range []int{1, 3} {
		t.Run("shards="+strconv.Itoa(k), func(t *testing.T) {
			t.Parallel()
			testEpochCommands(t, k)
		})
	}
}

func testEpochCommands(t *testing.T, k int) {
	ctx := context.Background()
	data, addr := t.TempDir(), freeAddr(t)
	srv := startServer(t, data, addr, "--shards", strconv.Itoa(k), "--epoch-slots", "2", "--epoch-period", "1s", "--retain-epochs", "1", "--epoch-check", "50ms")
	c := srv.client
	root, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "epochs", RequestID: "first"})
	if err != nil {
		t.Fatal(err)
	}
	child, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "epochs", ParentID: root.ID})
	if err != nil {
		t.Fatal(err)
	}
	// Both run, unless the root ended first: the claim that finds the
	// child then cancels it (ancestor_terminal).
	deadline := time.Now().Add(60 * time.Second)
	runTask := "" // the first task claimed saves a Run twice: its Runs go with the epoch
	for done := 0; done < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 tasks ran after 60s", done)
		}
		if done == 1 {
			ch, err := c.Get(ctx, child.ID)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Status == "canceled" {
				break
			}
		}
		task, ok, err := c.ClaimNext(ctx, "epochs", "x", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok && runTask == "" {
			runTask = task.ID
			for rev, phase := range []string{"planning", "done"} {
				run := api.RunState{Phase: phase, Transcript: []api.TranscriptItem{{ID: "note-" + phase, Kind: api.ItemNote}}}
				if _, err := c.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: uint64(rev), Run: run}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if ok {
			if _, err := c.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
				t.Fatal(err)
			}
			done++
		}
	}
	h, err := c.History(ctx, root.ID)
	if err != nil {
		t.Fatal(err)
	}
	layout := events.Shards{K: k, Slots: 2}
	part, _ := layout.Split(events.Position(h.Events[0].Seq))
	slot, _ := layout.SlotOf(part)
	var epoch int64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		stats, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s := stats.Epochs.Slots[slot]; s.State == eventlog.SlotSealed {
			epoch = *s.Epoch
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %d not sealed: %+v", slot, stats.Epochs)
		}
	}
	name := strconv.FormatInt(epoch, 10)
	replayStopServer(t, srv)
	live, _, code := replayCLI(t, "history", root.ID, "--tree", "--offline", "--data", data)
	if code != 0 {
		t.Fatalf("history of the live epoch: exit %d", code)
	}

	dir := filepath.Join(t.TempDir(), "epoch-"+name)
	if out, errOut, code := replayCLI(t, "epoch", "remove", name, "--archive", dir, "--data", data); code == 0 {
		t.Fatalf("removed without an archive: %s", out)
	} else if !strings.Contains(errOut, "manifest") {
		t.Fatalf("remove without an archive: exit %d, stderr:\n%s", code, errOut)
	}
	if out, errOut, code := replayCLI(t, "archive", name, "--to", dir, "--data", data); code != 0 || !strings.Contains(out, "archived epoch "+name) ||
		!strings.Contains(out, "runs: 2 stored Run revisions") {
		t.Fatalf("archive: exit %d, output %q\nstderr:\n%s", code, out, errOut)
	}
	if out, errOut, code := replayCLI(t, "archive", "verify", dir, "--live", "--data", data); code != 0 || !strings.Contains(out, "verified") {
		t.Fatalf("archive verify --live: exit %d, output %q\nstderr:\n%s", code, out, errOut)
	}
	heads := stopRemoval(t, data, layout, slot, epoch)
	// The archive's content is checked on this path too: a removed
	// stream's events only through the chain head the removal recorded.
	if out, errOut, code := replayCLI(t, "epoch", "remove", name, "--archive", dir, "--data", data); code != 1 || !strings.Contains(errOut, "recorded no chain heads") {
		t.Fatalf("epoch remove of a removal without chain heads: exit %d, output %q\nstderr:\n%s", code, out, errOut)
	}
	forged := slices.Clone(heads)
	for i := range forged {
		forged[i].Hash[0] ^= 1
	}
	setRemovalHeads(t, data, slot, forged)
	if out, errOut, code := replayCLI(t, "epoch", "remove", name, "--archive", dir, "--data", data); code != 1 || !strings.Contains(errOut, "is not the archive's") {
		t.Fatalf("epoch remove against other chain heads: exit %d, output %q\nstderr:\n%s", code, out, errOut)
	}
	setRemovalHeads(t, data, slot, heads)
	if out, errOut, code := replayCLI(t, "epoch", "remove", name, "--archive", dir, "--data", data); code != 0 || !strings.Contains(out, "removed epoch "+name) ||
		!strings.Contains(out, "removed the Runs of 1 tasks") {
		t.Fatalf("epoch remove: exit %d, output %q\nstderr:\n%s", code, out, errOut)
	}
	func() { // the Runs left the bucket with the epoch
		js, closeJS := dataJS(t, data)
		defer closeJS()
		kv, err := js.KeyValue(ctx, store.RunsBucket(events.DefaultStream))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Get(ctx, runTask+".1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("revision 1 of %s after the removal: %v, want gone", runTask, err)
		}
	}()
	out, errOut, code := replayCLI(t, "epoch", "list", "--json", "--data", data)
	var e eventlog.Epochs
	// (An empty epoch may have been removed before, by the server.)
	if code != 0 || json.Unmarshal([]byte(out), &e) != nil || !slices.Contains(e.Removed, epoch) || e.Slots[slot].State != eventlog.SlotFree {
		t.Fatalf("epoch list after the removal: exit %d, %s\nstderr:\n%s", code, out, errOut)
	}

	if _, _, code := replayCLI(t, "history", root.ID, "--offline", "--data", data); code == 0 {
		t.Fatal("the removed epoch's task is still in the log")
	}
	archived, errOut, code := replayCLI(t, "history", root.ID, "--tree", "--archive", dir)
	if code != 0 || archived != live {
		t.Fatalf("history from the archive (exit %d):\n%s\nfrom the live epoch:\n%s\nstderr:\n%s", code, archived, live, errOut)
	}
	key := filepath.Join(data, chainkey.FileName) // the archived events are keyed: verifying them takes the log's key
	for _, args := range [][]string{{"replay", "verify", "--data", data}, {"replay", "verify", "--archive", dir, "--chain-key-file", key}} {
		if out, errOut, code := replayCLI(t, args...); code != 0 || !strings.Contains(out, " 0 violations") {
			t.Fatalf("%v: exit %d, output %q\nstderr:\n%s", args, code, out, errOut)
		}
	}
	// The archive's Runs are checked against its events' digests.
	runsPath := filepath.Join(dir, "runs.ndjson")
	b, err := os.ReadFile(runsPath)
	if err != nil || !strings.Contains(string(b), "note-done") {
		t.Fatalf("runs.ndjson: %v\n%s", err, b)
	}
	if err := os.WriteFile(runsPath, []byte(strings.Replace(string(b), "note-done", "note-gone", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, code := replayCLI(t, "replay", "verify", "--archive", dir, "--chain-key-file", key); code == 0 || !strings.Contains(out, "run_mismatch") {
		t.Fatalf("an altered archived Run: exit %d, output %q", code, out)
	}
}

// stopRemoval leaves the log in data as a removal of epoch (in slot) that
// crashed half way does, but without the chain heads a removal records
// (as an older taskledger's): the next sequences recorded, one stream
// with events deleted, the slot still sealed. It returns the heads the
// removal would have recorded, for setRemovalHeads.
func stopRemoval(t *testing.T, data string, layout events.Shards, slot int, epoch int64) []eventlog.Head {
	t.Helper()
	js, closeJS := dataJS(t, data)
	defer closeJS()
	ctx := context.Background()
	var next []uint64
	var heads []eventlog.Head
	deleted := ""
	for _, part := range layout.SlotParts(slot) {
		name := layout.Stream(events.DefaultStream, part)
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		last := s.CachedInfo().State.LastSeq
		next = append(next, last+1)
		var head eventlog.Head
		if s.CachedInfo().State.Msgs > 0 {
			msg, err := s.GetMsg(ctx, last)
			if err != nil {
				t.Fatal(err)
			}
			head = eventlog.Head{Pos: layout.Position(part, last), Hash: events.HashOf(msg.Data)}
		}
		heads = append(heads, head)
		if deleted == "" && s.CachedInfo().State.Msgs > 0 {
			deleted = name
		}
	}
	if _, err := eventlog.UpdateEpochs(ctx, js, events.DefaultStream, func(e *eventlog.Epochs) bool {
		e.Slots[slot].NextSeqs = next
		return e.Slots[slot].Epoch == epoch
	}); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	return heads
}

// setRemovalHeads records heads as the chain heads of slot's removal in
// progress.
func setRemovalHeads(t *testing.T, data string, slot int, heads []eventlog.Head) {
	t.Helper()
	js, closeJS := dataJS(t, data)
	defer closeJS()
	if _, err := eventlog.UpdateEpochs(context.Background(), js, events.DefaultStream, func(e *eventlog.Epochs) bool {
		e.Slots[slot].Heads = heads
		return true
	}); err != nil {
		t.Fatal(err)
	}
}
