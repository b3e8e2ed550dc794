package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/httpapi"
)

// The Run state routes: PUT and GET /v1/tasks/{id}/run.

// sampleRun is a Run with every kind of field set.
func sampleRun(phase string, turn int) api.RunState {
	return api.RunState{
		ExecutorID: "w1", Phase: phase, Turn: turn,
		Transcript: []api.TranscriptItem{
			{ID: "mail-m1", Kind: api.ItemMailbox, Turn: 1, Content: []events.ContentPart{{Type: "text", Text: "fix it"}}},
			{ID: "t1-call-1", Kind: api.ItemToolCall, Turn: 1, Tool: &api.ToolCall{ID: "t1-call-1", Name: "grep", Turn: 1, Status: api.ToolPending, Input: json.RawMessage(`{"q":"flaky"}`)}},
		},
		Contexts:     map[string]api.RunContext{"issue": {Version: 1, Value: json.RawMessage(`{"title":"flaky"}`)}},
		PendingTools: []api.ToolCall{{ID: "t1-call-1", Name: "grep", Turn: 1, Status: api.ToolPending}},
		Steps:        []string{"fetch"},
		Effects:      map[string]api.EffectRecord{"pr": {Outcome: &events.Effect{Kind: "pull_request", Ref: "42"}}},
		Children:     map[string]string{"review": "child1"},
	}
}

// runPath is the run route of task id.
func runPath(id string) string { return "/v1/tasks/" + id + "/run" }

// requireRun asserts the stored run of task id is want.
func requireRun(t *testing.T, c *api.Client, id string, want api.RunDocument) {
	t.Helper()
	got, err := c.GetRun(context.Background(), id)
	if err != nil {
		t.Fatalf("get run %s: %v", id, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("run of %s:\n got %+v\nwant %+v", id, got, want)
	}
}

// requireNoRun asserts task id has no run stored.
func requireNoRun(t *testing.T, c *api.Client, id string) {
	t.Helper()
	_, err := c.GetRun(context.Background(), id)
	apiError(t, err, http.StatusNotFound, "")
}

func TestRunState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	running := func(t *testing.T) api.Task {
		return runningTask(t, b, api.ScheduleRequest{Queue: "runs"})
	}

	t.Run("SaveUpdateAndStale", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		requireNoRun(t, b.client, task.ID)
		first, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("planning", 1)})
		if err != nil {
			t.Fatal(err)
		}
		if first.TaskID != task.ID || first.Revision == 0 || first.DeliveryID != task.Claim.DeliveryID || first.UpdatedAt.IsZero() ||
			!reflect.DeepEqual(first.Run, sampleRun("planning", 1)) {
			t.Fatalf("first save answered %+v", first)
		}
		requireRun(t, b.client, task.ID, first)

		second, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: first.Revision, Run: sampleRun("acting", 2)})
		if err != nil {
			t.Fatal(err)
		}
		if second.Revision <= first.Revision || second.Run.Phase != "acting" || second.Run.Turn != 2 {
			t.Fatalf("update answered %+v after revision %d", second, first.Revision)
		}
		requireRun(t, b.client, task.ID, second)

		for _, rev := range []uint64{0, first.Revision, second.Revision + 1} {
			_, err = b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: rev, Run: sampleRun("stale", 9)})
			if !errors.Is(err, api.ErrStaleRevision) {
				t.Fatalf("save with revision %d (stored %d): %v, want stale_revision", rev, second.Revision, err)
			}
			apiError(t, err, http.StatusConflict, "stale_revision")
		}
		requireRun(t, b.client, task.ID, second)
	})

	t.Run("RacingSavesOneWins", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		base, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("base", 1)})
		if err != nil {
			t.Fatal(err)
		}
		const racers = 4
		docs := make([]api.RunDocument, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				docs[i], errs[i] = b.client.SaveRun(ctx, task.ID, api.RunSave{
					DeliveryID: task.Claim.DeliveryID, Revision: base.Revision, Run: sampleRun(fmt.Sprintf("racer-%d", i), 2),
				})
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("racers %d and %d both saved on revision %d", winner, i, base.Revision)
			case err == nil:
				winner = i
			case !errors.Is(err, api.ErrStaleRevision):
				t.Fatalf("racer %d: %v, want stale_revision", i, err)
			}
		}
		if winner < 0 {
			t.Fatal("no racer saved")
		}
		requireRun(t, b.client, task.ID, docs[winner])
	})

	t.Run("WrongTokenRefused", func(t *testing.T) {
		t.Parallel()
		task, other := running(t), running(t)
		saved, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("mine", 1)})
		if err != nil {
			t.Fatal(err)
		}
		for _, token := range []string{other.Claim.DeliveryID, events.NewID()} {
			_, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: token, Revision: saved.Revision, Run: sampleRun("theirs", 2)})
			apiError(t, err, http.StatusConflict, "token_mismatch")
		}
		requireRun(t, b.client, task.ID, saved)
		requireNoRun(t, b.client, other.ID)
	})

	t.Run("QueuedTaskRefused", func(t *testing.T) {
		t.Parallel()
		task := queuedTask(t, b, api.ScheduleRequest{Queue: "runs-unclaimed"})
		_, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Delivery.ID, Run: sampleRun("early", 0)})
		apiError(t, err, http.StatusConflict, "token_mismatch")
		requireNoRun(t, b.client, task.ID)
	})

	t.Run("TerminalTaskRefusedAndReadable", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		saved, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("done", 3)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
			t.Fatal(err)
		}
		_, err = b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: saved.Revision, Run: sampleRun("after", 4)})
		apiError(t, err, http.StatusConflict, "terminal")
		requireRun(t, b.client, task.ID, saved)
	})

	t.Run("ReadableAfterTimeout", func(t *testing.T) {
		t.Parallel()
		timeout := 2
		task := runningTask(t, b, api.ScheduleRequest{Queue: "runs-timeout", TimeoutSeconds: &timeout})
		saved, err := b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("slow", 1)})
		if errors.Is(err, api.ErrTerminal) {
			t.Skip("the task timed out before its first save")
		}
		if err != nil {
			t.Fatal(err)
		}
		b.waitStatus(t, task.ID, "timed_out")
		requireRun(t, b.client, task.ID, saved)
		_, err = b.client.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: saved.Revision, Run: sampleRun("late", 2)})
		apiError(t, err, http.StatusConflict, "terminal")
	})

	t.Run("UnknownFieldsKept", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		run := `{"phase":"p","turn":1,"future":{"nested":[1,"two",{"three":3}]},` +
			`"transcript":[{"id":"i1","kind":"note","turn":1,"extra":"kept"}],"contexts":{"c":{"version":1,"value":[1,2],"note":"x"}}}`
		a := rawDo(t, b, http.MethodPut, runPath(task.ID), `{"deliveryId":"`+task.Claim.DeliveryID+`","revision":0,"run":`+run+`}`)
		if a.status != http.StatusOK {
			t.Fatalf("save: %d %s", a.status, a.body)
		}
		for _, answer := range []rawAnswer{a, rawDo(t, b, http.MethodGet, runPath(task.ID), "")} {
			var doc struct{ Run json.RawMessage }
			if err := json.Unmarshal(answer.body, &doc); err != nil {
				t.Fatal(err)
			}
			if want := canonicalJSON(t, run); string(doc.Run) != want {
				t.Fatalf("run answered as %s, want %s (canonical)", doc.Run, want)
			}
		}
	})

	t.Run("NullsAnsweredAsSent", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		run := `{"phase":null,"turn":null,"transcript":[null,{"id":"i","content":[null,{"type":null,"text":"t"}],"tool":null}],` +
			`"contexts":{"c":null},"effects":{"k":null,"o":{"outcome":{"kind":null}}},"children":{"x":null}}`
		a := rawDo(t, b, http.MethodPut, runPath(task.ID), `{"deliveryId":"`+task.Claim.DeliveryID+`","run":`+run+`}`)
		if a.status != http.StatusOK || !strings.Contains(string(a.body), canonicalJSON(t, run)) {
			t.Fatalf("save: %d %s", a.status, a.body)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		body := func(run string) string {
			return `{"deliveryId":"` + task.Claim.DeliveryID + `","revision":0,"run":` + run + `}`
		}
		for _, c := range []struct{ name, body, reason string }{
			{"RunString", body(`"text"`), "JSON object"},
			{"RunArray", body(`[]`), "JSON object"},
			{"RunNull", body(`null`), "JSON object"},
			{"RunMissing", `{"deliveryId":"` + task.Claim.DeliveryID + `"}`, "JSON object"},
			{"TurnString", body(`{"turn":"one"}`), "turn"},
			{"TurnFraction", body(`{"turn":1.5}`), "turn"},
			{"TranscriptObject", body(`{"transcript":{"id":"x"}}`), "transcript"},
			{"ToolInputNotJSONHere", body(`{"pendingTools":[{"id":"t","turn":"x"}]}`), "turn"},
			{"EffectsArray", body(`{"effects":[]}`), "effects"},
			{"ChildrenNumbers", body(`{"children":{"k":1}}`), "children"},
			{"NoDeliveryID", `{"run":{}}`, "deliveryId"},
			{"BadDeliveryID", `{"deliveryId":"a.b","run":{}}`, "deliveryId"},
			{"NegativeRevision", `{"deliveryId":"` + task.Claim.DeliveryID + `","revision":-1,"run":{}}`, "revision"},
			{"Malformed", `{"deliveryId":`, "malformed"},
			{"Empty", ``, "deliveryId"},
		} {
			t.Run(c.name, func(t *testing.T) {
				a := rawDo(t, b, http.MethodPut, runPath(task.ID), c.body)
				requireErrorBody(t, a, http.StatusBadRequest, "invalid_argument")
				if !strings.Contains(string(a.body), c.reason) {
					t.Fatalf("answer %s does not name %q", a.body, c.reason)
				}
			})
		}
		requireNoRun(t, b.client, task.ID)
	})

	t.Run("Oversized", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		big := `{"deliveryId":"` + task.Claim.DeliveryID + `","run":{"phase":"` + strings.Repeat("x", api.MaxRunBytes) + `"}}`
		requireErrorBody(t, rawDo(t, b, http.MethodPut, runPath(task.ID), big), http.StatusRequestEntityTooLarge, "payload_too_large")
		requireNoRun(t, b.client, task.ID)
	})

	t.Run("LocalSameAnswers", func(t *testing.T) {
		t.Parallel()
		task := running(t)
		local := httpapi.NewLocal(b.node.Service)
		if _, err := local.GetRun(ctx, task.ID); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("local get before a save: %v, want not found", err)
		}
		saved, err := local.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("local", 1)})
		if err != nil {
			t.Fatal(err)
		}
		requireRun(t, b.client, task.ID, saved)
		if got, err := local.GetRun(ctx, task.ID); err != nil || !reflect.DeepEqual(got, saved) {
			t.Fatalf("local get: %+v %v, want %+v", got, err, saved)
		}
		_, err = local.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("stale", 2)})
		apiError(t, err, http.StatusConflict, "stale_revision")
		_, err = local.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: events.NewID(), Revision: saved.Revision, Run: sampleRun("theirs", 2)})
		apiError(t, err, http.StatusConflict, "token_mismatch")
	})

	t.Run("UnknownTask", func(t *testing.T) {
		t.Parallel()
		id := events.NewID()
		requireNoRun(t, b.client, id)
		_, err := b.client.SaveRun(ctx, id, api.RunSave{DeliveryID: events.NewID(), Run: sampleRun("x", 1)})
		apiError(t, err, http.StatusNotFound, "")
		requireErrorBody(t, rawDo(t, b, http.MethodGet, "/v1/tasks/a.b/run", ""), http.StatusBadRequest, "invalid_argument")
	})
}

// TestRunStateTenancy checks that another customer's task answers 404 on
// both run routes, changing nothing, and that the auditors (the
// customer's token, an operator's) read the run after the task ended.
func TestRunStateTenancy(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	ca, cb, op := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b"), tokenClient(t, b, "tok-op")
	q := tenantQueued(t, ca, api.ScheduleRequest{Queue: "qa"})
	task, err := ca.Claim(ctx, q.ID, q.Delivery.ID, "wa")
	if err != nil {
		t.Fatal(err)
	}
	saved, err := ca.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Run: sampleRun("secret phase of A", 1)})
	if err != nil {
		t.Fatal(err)
	}

	_, err = cb.GetRun(ctx, task.ID)
	apiError(t, err, http.StatusNotFound, "")
	_, err = cb.SaveRun(ctx, task.ID, api.RunSave{DeliveryID: task.Claim.DeliveryID, Revision: saved.Revision, Run: sampleRun("B was here", 2)})
	apiError(t, err, http.StatusNotFound, "")
	a := authDo(t, b, "Bearer tok-b", http.MethodGet, runPath(task.ID), "")
	requireErrorBody(t, a, http.StatusNotFound, "not_found")
	requireNoLeak(t, a, task.ID, task.Claim.DeliveryID, "secret phase of A")
	requireRun(t, ca, task.ID, saved)

	if _, err := ca.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
		t.Fatal(err)
	}
	requireRun(t, ca, task.ID, saved)
	requireRun(t, op, task.ID, saved)
	_, err = cb.GetRun(ctx, task.ID)
	apiError(t, err, http.StatusNotFound, "")
}

// canonicalJSON is doc as the server answers a run: compact, object
// keys sorted, numbers as written.
func canonicalJSON(t *testing.T, doc string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
