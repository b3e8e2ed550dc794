package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
)

// TestAttribution: every event written for a caller names it in GET
// /v1/tasks/{id}/history: what the claim's holder writes under its
// delivery token (claim, effects, the check that consumes the mailbox,
// the result) names its executor; anything else the token's name from the
// auth file, or its customer when it has none. A customer's result
// without a delivery token is 403 operator_only and changes nothing; an
// operator's is a recovery, named by the operator's token.
func TestAttribution(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) {
		c.Tokens = map[string]string{"tok-ci": "A", "tok-a": "A", "tok-op": "*"}
		c.TokenNames = map[string]string{"tok-ci": "ci-bot", "tok-op": "ops-alice"}
	})
	ctx := context.Background()
	ci, anon, op := tokenClient(t, b, "tok-ci"), tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-op")

	actors := func(id string) map[string][]string {
		t.Helper()
		h, err := op.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, ev := range h.Events {
			out[ev.Type] = append(out[ev.Type], ev.Actor)
		}
		return out
	}
	requireActor := func(got map[string][]string, typ string, want ...string) {
		t.Helper()
		if len(got[typ]) != len(want) {
			t.Fatalf("%s actors %v, want %v (history %v)", typ, got[typ], want, got)
		}
		for i := range want {
			if got[typ][i] != want[i] {
				t.Fatalf("%s actors %v, want %v", typ, got[typ], want)
			}
		}
	}

	t.Run("ExecutorWrites", func(t *testing.T) {
		t.Parallel()
		task, _, err := ci.Schedule(ctx, api.ScheduleRequest{Queue: "attributed"})
		if err != nil {
			t.Fatal(err)
		}
		q := tenantWait(t, ci, task.ID, "queued")
		if _, err := ci.Claim(ctx, task.ID, q.Delivery.ID, "exec-7"); err != nil {
			t.Fatal(err)
		}
		if _, err := anon.AppendMail(ctx, task.ID, events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "also this"}}}); err != nil {
			t.Fatal(err)
		}
		if ch, err := ci.Check(ctx, task.ID, q.Delivery.ID); err != nil || ch.Cursor != 1 {
			t.Fatalf("holder's check: %+v, %v", ch, err)
		}
		if _, err := ci.ReportEffects(ctx, task.ID, q.Delivery.ID, []events.Effect{{Kind: "pull_request", Ref: "#1"}}); err != nil {
			t.Fatal(err)
		}
		_, err = anon.RecordResult(ctx, task.ID, api.ResultRequest{Success: true})
		apiError(t, err, http.StatusForbidden, "operator_only")
		if !errors.Is(err, api.ErrOperatorOnly) {
			t.Fatalf("customer's token-less result: %v, want api.ErrOperatorOnly", err)
		}
		if _, err := ci.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: q.Delivery.ID, Success: true}); err != nil {
			t.Fatal(err)
		}
		got := actors(task.ID)
		requireActor(got, "TaskScheduled", "ci-bot")
		requireActor(got, "Claimed", "exec-7")
		requireActor(got, "MailboxAppended", "customer:A")
		requireActor(got, "MailboxRead", "exec-7")
		requireActor(got, "EffectsReported", "exec-7")
		requireActor(got, "ResultRecorded", "exec-7")
	})

	t.Run("ScheduleRuns", func(t *testing.T) {
		t.Parallel()
		if _, _, err := ci.CreateSchedule(ctx, api.ScheduleCreateRequest{ID: "nightly", Every: "1h", Paused: true,
			Task: api.ScheduleTask{Queue: "nightly"}}); err != nil {
			t.Fatal(err)
		}
		run, err := anon.TriggerSchedule(ctx, "nightly", api.ScheduleOptions{})
		if err != nil {
			t.Fatal(err)
		}
		h, err := ci.ScheduleHistory(ctx, "nightly", api.ScheduleOptions{})
		if err != nil || len(h.Events) < 2 || h.Events[0].Actor != "ci-bot" || h.Events[len(h.Events)-1].Actor != "customer:A" {
			t.Fatalf("schedule history %+v, %v; want it created by ci-bot, triggered by customer:A", h.Events, err)
		}
		requireActor(actors(run.ID), "TaskScheduled", "schedule:nightly")
	})

	t.Run("OperatorRecovers", func(t *testing.T) {
		t.Parallel()
		task, _, err := anon.Schedule(ctx, api.ScheduleRequest{Queue: "recovered"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ci.RecordResult(ctx, task.ID, api.ResultRequest{Success: false, Error: "gave up"})
		apiError(t, err, http.StatusForbidden, "operator_only")
		if got, err := op.Get(ctx, task.ID); err != nil || got.Status == "failed" {
			t.Fatalf("task after a refused result: %+v, %v; want it unchanged", got, err)
		}
		if _, err := op.RecordResult(ctx, task.ID, api.ResultRequest{Success: false, Error: "gave up"}); err != nil {
			t.Fatal(err)
		}
		if _, err := op.Cancel(ctx, task.ID, "again"); !errors.Is(err, api.ErrTerminal) {
			t.Fatalf("cancel after the result: %v, want terminal", err)
		}
		got := actors(task.ID)
		requireActor(got, "TaskScheduled", "customer:A")
		requireActor(got, "ResultRecorded", "ops-alice")
	})
}
