package httpapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// Run history and live progress: GET /v1/tasks/{id}/run?revision=N,
// GET /v1/tasks/{id}/run/stream and POST /v1/tasks/{id}/progress.

// growingRun is sampleRun at turn n with n notes more in its transcript.
func growingRun(n int) api.RunState {
	r := sampleRun(fmt.Sprintf("phase-%d", n), n)
	for i := range n {
		r.Transcript = append(r.Transcript, api.TranscriptItem{ID: fmt.Sprintf("note-%d", i), Kind: api.ItemNote, Turn: i + 1})
	}
	r.Contexts["issue"] = api.RunContext{Version: n, Value: json.RawMessage(fmt.Sprintf(`{"title":"v%d"}`, n))}
	return r
}

func TestRunHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	task := runningTask(t, b, api.ScheduleRequest{Queue: "run-history"})
	var saved []api.RunDocument
	for n := 1; n <= 3; n++ {
		d, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: uint64(n - 1), Run: growingRun(n)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Revision != uint64(n) || len(d.Digest) != 64 {
			t.Fatalf("save %d answered revision %d digest %q", n, d.Revision, d.Digest)
		}
		saved = append(saved, d)
	}

	t.Run("EveryRevisionReadable", func(t *testing.T) {
		for i, want := range saved {
			got, err := b.client.GetRunRevision(ctx, task.ID, uint64(i+1))
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("revision %d: %+v %v\nwant %+v", i+1, got, err, want)
			}
		}
		requireRun(t, b.client, task.ID, saved[2])
		_, err := b.client.GetRunRevision(ctx, task.ID, 4)
		apiError(t, err, http.StatusNotFound, "")
		for _, bad := range []string{"x", "-1", "1.5"} {
			requireErrorBody(t, rawDo(t, b, http.MethodGet, runPath(task.ID)+"?revision="+bad, ""), http.StatusBadRequest, "invalid_argument")
		}
	})

	t.Run("LogRecordsEachDigest", func(t *testing.T) {
		h, err := b.client.History(ctx, task.ID)
		if err != nil {
			t.Fatal(err)
		}
		var digests []string
		for _, ev := range h.Events {
			if ev.Type == string(events.TypeRunSaved) {
				data := ev.Data.(map[string]any)
				digests = append(digests, data["digest"].(string))
				if want := float64(len(digests)); data["revision"] != want {
					t.Fatalf("RunSaved %d names revision %v", len(digests), data["revision"])
				}
			}
		}
		if len(digests) != 3 {
			t.Fatalf("%d RunSaved events, want 3", len(digests))
		}
		for i, d := range saved {
			raw := rawDo(t, b, http.MethodGet, fmt.Sprintf("%s?revision=%d", runPath(task.ID), i+1), "")
			var doc struct{ Run json.RawMessage }
			if err := json.Unmarshal(raw.body, &doc); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(doc.Run)
			if got := hex.EncodeToString(sum[:]); got != digests[i] || got != d.Digest {
				t.Fatalf("revision %d: bytes hash to %s, the log records %s, the save answered %s", i+1, got, digests[i], d.Digest)
			}
		}
	})

	t.Run("RetryAnswersTheSave", func(t *testing.T) {
		again, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: 2, Run: growingRun(3)})
		if err != nil || !reflect.DeepEqual(again, saved[2]) {
			t.Fatalf("a repeated save: %+v %v, want %+v", again, err, saved[2])
		}
		if n := countType(t, b, task.ID, string(events.TypeRunSaved)); n != 3 {
			t.Fatalf("%d RunSaved after a repeated save, want 3", n)
		}
	})
}

func TestRunStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	task := runningTask(t, b, api.ScheduleRequest{Queue: "run-stream"})
	token := task.Claim.DeliveryID
	streamPath := b.url + runPath(task.ID) + "/stream"
	if _, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: token, Run: growingRun(1)}); err != nil {
		t.Fatal(err)
	}
	saved := func(t *testing.T, m sseMsg, rev uint64) api.RunChange {
		t.Helper()
		var c api.RunChange
		if m.event != api.RunSavedEvent || m.id != fmt.Sprint(rev) || json.Unmarshal([]byte(m.data), &c) != nil || c.Revision != rev || c.TaskID != task.ID {
			t.Fatalf("message %+v, want revision %d saved", m, rev)
		}
		return c
	}
	progress := func(t *testing.T, m sseMsg, text string) {
		t.Helper()
		var p api.RunProgress
		if m.event != api.RunProgressEvent || m.id != "" || json.Unmarshal([]byte(m.data), &p) != nil || p.Text != text || p.At.IsZero() {
			t.Fatalf("message %+v, want progress %q", m, text)
		}
	}

	s := openSSE(t, streamPath, "", "")
	// Revision 1 is sent first (it was saved before the stream opened);
	// from then on the stream follows the task live.
	first := saved(t, s.next(t), 1)
	if first.Transcript == nil || first.Transcript.Keep != 0 || len(first.Transcript.Append) != 3 {
		t.Fatalf("revision 1's transcript change %+v", first.Transcript)
	}
	if err := b.client.Progress(ctx, task.ID, token, "thinking…"); err != nil {
		t.Fatal(err)
	}
	progress(t, s.next(t), "thinking…")
	if _, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: token, Revision: 1, Run: growingRun(2)}); err != nil {
		t.Fatal(err)
	}
	second := saved(t, s.next(t), 2)
	if second.Transcript == nil || second.Transcript.Keep != 3 || len(second.Transcript.Append) != 1 || second.Transcript.Append[0].ID != "note-1" {
		t.Fatalf("revision 2's transcript change %+v: want the one new item", second.Transcript)
	}
	if ctxs := second.Members["contexts"]; len(ctxs.Set) != 1 || second.Set["phase"] == nil {
		t.Fatalf("revision 2's change %+v: want the new context version and phase", second)
	}
	if err := b.client.Progress(ctx, task.ID, token, "token 1"); err != nil {
		t.Fatal(err)
	}
	progress(t, s.next(t), "token 1")

	// A client that reconnects after revision 1 gets revision 2, and
	// nothing twice.
	resumed := openSSE(t, streamPath, "", "1")
	saved(t, resumed.next(t), 2)
	if _, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: token, Success: true}); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*stream{s, resumed} {
		var end api.RunEnd
		if m := st.next(t); m.event != api.RunEndEvent || json.Unmarshal([]byte(m.data), &end) != nil || end.Status != "succeeded" {
			t.Fatalf("message %+v, want the end", m)
		}
		for m := range st.msgs {
			if m.comment == "" {
				t.Fatalf("message %+v after the end", m)
			}
		}
	}
	// A stream of an ended task sends its whole Run, then the end.
	after := openSSE(t, streamPath+"?after=0", "", "")
	saved(t, after.next(t), 1)
	saved(t, after.next(t), 2)
	if m := after.next(t); m.event != api.RunEndEvent {
		t.Fatalf("message %+v, want the end", m)
	}
	requireErrorBody(t, rawDo(t, b, http.MethodGet, runPath(task.ID)+"/stream?after=x", ""), http.StatusBadRequest, "invalid_argument")
	requireErrorBody(t, rawDo(t, b, http.MethodGet, runPath(events.NewID())+"/stream", ""), http.StatusNotFound, "not_found")
}

func TestRunProgressLimits(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	ca, cb := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b")
	q := tenantQueued(t, ca, api.ScheduleRequest{Queue: "progress"})
	task, err := ca.Claim(ctx, q.ID, q.Delivery.ID, "wa")
	if err != nil {
		t.Fatal(err)
	}
	token := task.Claim.DeliveryID

	t.Run("Size", func(t *testing.T) {
		err := ca.Progress(ctx, task.ID, token, strings.Repeat("x", api.MaxProgressBytes+1))
		apiError(t, err, http.StatusRequestEntityTooLarge, "")
		if err := ca.Progress(ctx, task.ID, token, strings.Repeat("x", api.MaxProgressBytes)); err != nil {
			t.Fatal(err)
		}
		a := authDo(t, b, "Bearer tok-a", http.MethodPost, "/v1/tasks/"+task.ID+"/progress", `{"deliveryId":"`+token+`","text":"\xff"}`)
		requireErrorBody(t, a, http.StatusBadRequest, "invalid_argument")
	})

	t.Run("OnlyTheClaimHolder", func(t *testing.T) {
		apiError(t, ca.Progress(ctx, task.ID, events.NewID(), "stale"), http.StatusConflict, "token_mismatch")
		apiError(t, cb.Progress(ctx, task.ID, token, "not mine"), http.StatusNotFound, "")
		a := authDo(t, b, "Bearer tok-b", http.MethodGet, runPath(task.ID)+"/stream", "")
		requireErrorBody(t, a, http.StatusNotFound, "not_found")
		requireNoLeak(t, a, task.ID, token)
	})

	t.Run("Rate", func(t *testing.T) {
		sent := 0
		for range 10 * api.ProgressBurst {
			err := ca.Progress(ctx, task.ID, token, "tok")
			if err != nil {
				apiError(t, err, http.StatusTooManyRequests, "progress_rate")
				break
			}
			sent++
		}
		// The burst, less the line of Size, and what the rate refilled
		// meanwhile: never all of them.
		if sent < api.ProgressBurst-2 || sent >= 10*api.ProgressBurst {
			t.Fatalf("%d lines sent before a 429, want about %d", sent, api.ProgressBurst)
		}
	})

	t.Run("Terminal", func(t *testing.T) {
		if _, err := ca.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: token, Success: true}); err != nil {
			t.Fatal(err)
		}
		apiError(t, ca.Progress(ctx, task.ID, token, "late"), http.StatusConflict, "terminal")
	})
}
