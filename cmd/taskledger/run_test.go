package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// TestRunCommand checks `taskledger run ID` (text and --json) and the
// run summary at the end of `taskledger history ID`, against a served
// node.
func TestRunCommand(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	srv := startServer(t, t.TempDir(), addr, "--run-retention", "1h")
	ctx := context.Background()
	server := "http://" + addr
	cli := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(ctx, append(args, "--server", server), &out)
		return out.String(), err
	}

	task, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "cli-run"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, "run", task.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("run before a save: %v, want not found", err)
	}
	out, err := cli(t, "history", task.ID)
	if err != nil || strings.Contains(out, "run (revision") {
		t.Fatalf("history without a run: %v\n%s", err, out)
	}
	claimed, ok, err := srv.client.ClaimNext(ctx, "cli-run", "w1", 30*time.Second)
	if err != nil || !ok || claimed.ID != task.ID {
		t.Fatalf("claim: %v ok=%v %s", err, ok, claimed.ID)
	}
	state := api.RunState{
		ExecutorID: "w1", Phase: "awaiting tools", Turn: 2,
		Transcript: []api.TranscriptItem{
			{ID: "mail-m1", Kind: api.ItemMailbox, Turn: 1, Content: []events.ContentPart{{Type: "text", Text: "fix the\nflaky test"}}},
			{ID: "t2-call-1", Kind: api.ItemToolCall, Turn: 2, Tool: &api.ToolCall{ID: "t2-call-1", Name: "grep", Turn: 2, Status: api.ToolPending}},
		},
		Contexts:     map[string]api.RunContext{"issue": {Version: 3, Value: json.RawMessage(`"x"`)}},
		PendingTools: []api.ToolCall{{ID: "t2-call-1", Name: "grep", Turn: 2, Status: api.ToolPending}},
		Effects:      map[string]api.EffectRecord{"pr": {Outcome: &events.Effect{Kind: "pull_request", Ref: "42"}}, "comment": {Uncertain: true}},
		Children:     map[string]string{"review": "child-task"},
	}
	saved := saveWithExtra(t, server, task.ID, api.RunSave{DeliveryID: claimed.Claim.DeliveryID, Run: state}, `"future":{"kept":true}`)

	t.Run("Text", func(t *testing.T) {
		out, err := cli(t, "run", task.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"task      " + task.ID, "phase     awaiting tools", "turn      2", "contexts  issue@3",
			"mail-m1    mailbox    turn 1  fix the flaky test",
			"t2-call-1  tool_call  turn 2  grep pending",
			"pending tools:\n  t2-call-1  grep  turn 2  pending",
			"comment  intent (uncertain)", "pr       pull_request 42",
			"children:\n  review  child-task",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("JSON", func(t *testing.T) {
		out, err := cli(t, "run", task.ID, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var got api.RunDocument
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		if !reflect.DeepEqual(got, saved) {
			t.Fatalf("--json printed %+v, want %+v", got, saved)
		}
		if !strings.Contains(out, `"future": {`) {
			t.Fatalf("--json dropped the field the server does not know:\n%s", out)
		}
	})

	t.Run("HistoryEndsWithRun", func(t *testing.T) {
		out, err := cli(t, "history", task.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "Claimed") || !strings.HasSuffix(out, `phase="awaiting tools" turn=2 pending tools: 1`+"\n  t2-call-1 grep\n") {
			t.Fatalf("history:\n%s", out)
		}
	})

	t.Run("RevisionAndFollow", func(t *testing.T) {
		next := state
		next.Phase = "reviewing"
		next.Transcript = append(next.Transcript, api.TranscriptItem{ID: "t2-out", Kind: api.ItemModelOutput, Turn: 2,
			Content: []events.ContentPart{{Type: "text", Text: "looks fine"}}})
		if _, err := srv.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: claimed.Claim.DeliveryID, Revision: saved.Revision, Run: next}); err != nil {
			t.Fatal(err)
		}
		if out, err := cli(t, "run", task.ID, "--revision", "1"); err != nil || !strings.Contains(out, "phase     awaiting tools") {
			t.Fatalf("run --revision 1: %v\n%s", err, out)
		}
		if out, err := cli(t, "run", task.ID); err != nil || !strings.Contains(out, "phase     reviewing") {
			t.Fatalf("run (the latest): %v\n%s", err, out)
		}
		if _, err := cli(t, "run", task.ID, "--revision", "3"); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("run --revision 3: %v, want not found", err)
		}
		var out lockedBuffer
		done := make(chan error, 1)
		go func() { done <- run(ctx, []string{"run", task.ID, "--follow", "--server", server}, &out) }()
		// Once the saved revisions are out the follower listens live.
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out.String(), "revision 2 saved") {
			if time.Now().After(deadline) {
				t.Fatalf("run --follow printed no revision 2 within 30s:\n%s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := srv.client.Progress(ctx, task.ID, claimed.Claim.DeliveryID, "tokens…"); err != nil {
			t.Fatal(err)
		}
		for !strings.Contains(out.String(), "tokens…") {
			if time.Now().After(deadline) {
				t.Fatalf("run --follow printed no progress within 30s:\n%s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := srv.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("run --follow did not end with the task")
		}
		for _, want := range []string{"revision 1 saved", "revision 2 saved", `phase "reviewing"`, "t2-out", "looks fine", "tokens…\nended: succeeded"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("run --follow lacks %q:\n%s", want, out.String())
			}
		}
	})
}

// lockedBuffer is a bytes.Buffer safe for one writer and other readers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// saveWithExtra saves s's run with the JSON member extra added (a field
// api.RunState does not know) and returns the answer.
func saveWithExtra(t *testing.T, server, id string, s api.RunSave, extra string) api.RunDocument {
	t.Helper()
	run, err := json.Marshal(s.Run)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(map[string]any{"deliveryId": s.DeliveryID, "revision": s.Revision, "run": json.RawMessage(`{` + extra + `,` + string(run[1:]))})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPut, server+"/v1/tasks/"+id+"/run", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d api.RunDocument
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("save: %d %v", resp.StatusCode, err)
	}
	return d
}
