package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
)

// TestTamperedRunIsDetected saves a Run three times, checks that replay
// verify reads every revision back clean, then alters one stored
// revision and removes another: verify must fail and name each.
func TestTamperedRunIsDetected(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	srv, _, _ := replayStartServer(t, data, freeAddr(t))
	ctx := context.Background()
	if _, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "tamper-runs",
		Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "run"}}}}); err != nil {
		t.Fatal(err)
	}
	task, ok, err := srv.client.ClaimNext(ctx, "tamper-runs", "w1", 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	for n := 1; n <= 3; n++ {
		run := api.RunState{Phase: fmt.Sprintf("phase-%d", n), Turn: n}
		for i := range n {
			run.Transcript = append(run.Transcript, api.TranscriptItem{ID: fmt.Sprintf("note-%d", i), Kind: api.ItemNote, Turn: i + 1})
		}
		if _, err := srv.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: uint64(n - 1), Run: run}); err != nil {
			t.Fatal(err)
		}
	}
	replayStopServer(t, srv)
	if out, errOut, code := replayCLI(t, "replay", "verify", "--data", data); code != 0 {
		t.Fatalf("an untouched log: exit %d\n%s\n%s", code, out, errOut)
	}

	// Alter revision 2's stored change (its new transcript item), with
	// the server down, as someone with access to the bucket could.
	withRuns := func(fn func(kv jetstream.KeyValue)) {
		t.Helper()
		nf := natsFlags{data: data, stream: events.DefaultStream}
		nc, _, closeNATS, err := nf.connect(zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer closeNATS()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, store.RunsBucket(events.DefaultStream))
		if err != nil {
			t.Fatal(err)
		}
		fn(kv)
	}
	withRuns(func(kv jetstream.KeyValue) {
		e, err := kv.Get(ctx, task.ID+".2")
		if err != nil {
			t.Fatal(err)
		}
		altered := strings.Replace(string(e.Value()), `"note-1"`, `"note-X"`, 1)
		if altered == string(e.Value()) {
			t.Fatalf("revision 2 holds no note-1: %s", e.Value())
		}
		if _, err := kv.Put(ctx, task.ID+".2", []byte(altered)); err != nil {
			t.Fatal(err)
		}
	})
	if kinds := verifyKinds(t, data); kinds["run_mismatch"] == 0 || len(kinds) != 1 {
		t.Fatalf("an altered Run revision: violations %v, want run_mismatch only", kinds)
	}

	withRuns(func(kv jetstream.KeyValue) {
		if err := kv.Purge(ctx, task.ID+".1"); err != nil {
			t.Fatal(err)
		}
	})
	if kinds := verifyKinds(t, data); kinds["run_unreadable"] != 1 {
		t.Fatalf("a removed Run revision: violations %v, want run_unreadable", kinds)
	}
}
