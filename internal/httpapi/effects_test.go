package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
)

// withoutAt returns effects without their times, for comparing what was
// reported with what the scheduler stamped.
func withoutAt(effects []events.Effect) []events.Effect {
	out := slices.Clone(effects)
	for i := range out {
		out[i].At = time.Time{}
	}
	return out
}

// requireEffects fails unless task has exactly want (times aside), each
// with a time.
func requireEffects(t *testing.T, what string, task api.Task, want ...events.Effect) {
	t.Helper()
	if got := withoutAt(task.Effects); !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: effects %+v, want %+v", what, task.Effects, want)
	}
	for _, e := range task.Effects {
		if e.At.IsZero() {
			t.Fatalf("%s: effect %+v has no time", what, e)
		}
	}
}

// TestEffects: effects reported while a task runs are on the task as
// they happen, merged by kind and ref, and stay there however it ends.
func TestEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	uncertainPR := events.Effect{Kind: "pull_request", Ref: "#12", Uncertain: true}
	pr := events.Effect{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12"}
	comment := events.Effect{Kind: "comment", Ref: "c-1"}

	t.Run("KeptAfterTimeout", func(t *testing.T) {
		t.Parallel()
		one := events.MinTimeoutSeconds
		r := runningTask(t, b, api.ScheduleRequest{Queue: "effects-timeout", TimeoutSeconds: &one})
		got, err := b.client.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{uncertainPR, comment})
		if err != nil {
			t.Fatal(err)
		}
		requireEffects(t, "first report", got, uncertainPR, comment)
		got, err = b.client.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{pr})
		if err != nil {
			t.Fatal(err)
		}
		requireEffects(t, "confirmed", got, pr, comment)

		done := b.waitStatus(t, r.ID, "timed_out")
		requireEffects(t, "GET after the timeout", done, pr, comment)
		list, err := b.client.List(ctx, api.ListOptions{Queue: "effects-timeout"})
		if err != nil || len(list.Tasks) != 1 {
			t.Fatalf("list: %+v %v", list, err)
		}
		requireEffects(t, "list", list.Tasks[0], pr, comment)
		h, err := b.client.History(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		var details []string
		for _, ev := range h.Events {
			if ev.Type == string(events.TypeEffectsReported) {
				details = append(details, ev.Detail)
			}
		}
		if want := []string{"reported 2 effects: pull_request #12 (uncertain), comment c-1", "reported 1 effect: pull_request #12 https://example.com/pr/12"}; !slices.Equal(details, want) {
			t.Fatalf("history details %q, want %q", details, want)
		}
		_, err = b.client.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{comment})
		apiError(t, err, http.StatusConflict, "terminal")
	})

	t.Run("MergedWithResult", func(t *testing.T) {
		t.Parallel()
		r := runningTask(t, b, api.ScheduleRequest{})
		if _, err := b.client.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{uncertainPR, comment}); err != nil {
			t.Fatal(err)
		}
		issue := events.Effect{Kind: "issue", Ref: "#12"} // the pull request's ref, another kind
		result := []events.Effect{pr, issue}
		got, err := b.client.RecordResult(ctx, r.ID, api.ResultRequest{DeliveryID: r.Claim.DeliveryID, Success: true, Effects: result})
		if err != nil {
			t.Fatal(err)
		}
		requireEffects(t, "after the result", got, pr, comment, issue)
		if !reflect.DeepEqual(got.Result.Effects, result) {
			t.Fatalf("the result's effects %+v, want them as reported %+v", got.Result.Effects, result)
		}
	})

	t.Run("KeptAfterCancel", func(t *testing.T) {
		t.Parallel()
		r := runningTask(t, b, api.ScheduleRequest{})
		if _, err := b.client.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{comment}); err != nil {
			t.Fatal(err)
		}
		got, err := b.client.Cancel(ctx, r.ID, "enough")
		if err != nil {
			t.Fatal(err)
		}
		requireEffects(t, "canceled", got, comment)
		got, err = b.client.Get(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		requireEffects(t, "GET after the cancel", got, comment)
	})

	t.Run("ExecutorTimeKept", func(t *testing.T) {
		t.Parallel()
		r := runningTask(t, b, api.ScheduleRequest{})
		at := r.StartedAt.Add(-time.Hour) // the executor's clock, not checked
		e := comment
		e.At = at
		got, err := b.client.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{e})
		if err != nil || len(got.Effects) != 1 || !got.Effects[0].At.Equal(at) {
			t.Fatalf("effects %+v %v, want the executor's time %v", got.Effects, err, at)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		r := runningTask(t, b, api.ScheduleRequest{})
		q := queuedTask(t, b, api.ScheduleRequest{})
		settled(t, b)
		refuse := func(t *testing.T, id, deliveryID string, effects []events.Effect, status int, reason string) {
			t.Helper()
			before := taskSeqs(t, b, r.ID, q.ID)
			_, err := b.client.ReportEffects(ctx, id, deliveryID, effects)
			apiError(t, err, status, reason)
			if after := taskSeqs(t, b, r.ID, q.ID); !slices.Equal(after, before) {
				t.Fatalf("the tasks' logs grew from %v to %v", before, after)
			}
		}
		many := make([]events.Effect, events.MaxEffects+1)
		for i := range many {
			many[i] = events.Effect{Kind: "comment", Ref: fmt.Sprint(i)}
		}
		d := r.Claim.DeliveryID
		for _, tc := range []struct {
			name, id, deliveryID string
			effects              []events.Effect
			status               int
			reason               string
		}{
			{"WrongToken", r.ID, q.Delivery.ID, []events.Effect{comment}, http.StatusConflict, "token_mismatch"},
			{"NotRunning", q.ID, q.Delivery.ID, []events.Effect{comment}, http.StatusConflict, "token_mismatch"},
			{"NoToken", r.ID, "", []events.Effect{comment}, http.StatusBadRequest, ""},
			{"None", r.ID, d, nil, http.StatusBadRequest, ""},
			{"TooMany", r.ID, d, many, http.StatusBadRequest, ""},
			{"NoKind", r.ID, d, []events.Effect{{Ref: "r"}}, http.StatusBadRequest, ""},
			{"RefTooLong", r.ID, d, []events.Effect{{Kind: "k", Ref: strings.Repeat("r", events.MaxNameBytes+1)}}, http.StatusBadRequest, ""},
			{"URLTooLong", r.ID, d, []events.Effect{{Kind: "k", URL: strings.Repeat("u", events.MaxURLBytes+1)}}, http.StatusBadRequest, ""},
			{"UnknownTask", "no-such-task", d, []events.Effect{comment}, http.StatusNotFound, ""},
		} {
			t.Run(tc.name, func(t *testing.T) { refuse(t, tc.id, tc.deliveryID, tc.effects, tc.status, tc.reason) })
		}
	})

	t.Run("DistinctLimit", func(t *testing.T) {
		t.Parallel()
		r := runningTask(t, b, api.ScheduleRequest{})
		d := r.Claim.DeliveryID
		for first := 0; first < events.MaxTaskEffects; first += events.MaxEffects {
			batch := make([]events.Effect, events.MaxEffects)
			for i := range batch {
				batch[i] = events.Effect{Kind: "comment", Ref: fmt.Sprint(first + i)}
			}
			if _, err := b.client.ReportEffects(ctx, r.ID, d, batch); err != nil {
				t.Fatal(err)
			}
		}
		before := taskSeqs(t, b, r.ID)
		_, err := b.client.ReportEffects(ctx, r.ID, d, []events.Effect{{Kind: "comment", Ref: "one too many"}})
		apiError(t, err, http.StatusBadRequest, "")
		if !strings.Contains(err.Error(), fmt.Sprint(events.MaxTaskEffects)) {
			t.Fatalf("error %v does not name the limit", err)
		}
		if after := taskSeqs(t, b, r.ID); !slices.Equal(after, before) {
			t.Fatalf("the task's log grew from %v to %v", before, after)
		}
		// One the task has already is a replacement, not a new one.
		got, err := b.client.ReportEffects(ctx, r.ID, d, []events.Effect{{Kind: "comment", Ref: "0", URL: "https://example.com/c/0"}})
		if err != nil || len(got.Effects) != events.MaxTaskEffects || got.Effects[0].URL == "" {
			t.Fatalf("replacing an effect of a full task: %d effects, first %+v, %v", len(got.Effects), got.Effects[0], err)
		}
	})
}

// TestEffectsOfAnotherCustomer: another customer's task answers 404, as
// if it did not exist, and nothing is written.
func TestEffectsOfAnotherCustomer(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	ca, cb := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b")
	q := tenantQueued(t, ca, api.ScheduleRequest{Queue: "effects-a"})
	r, err := ca.Claim(ctx, q.ID, q.Delivery.ID, "wa")
	if err != nil {
		t.Fatal(err)
	}
	settled(t, b)
	before := lastSeq(t, b)
	_, err = cb.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{{Kind: "comment"}})
	apiError(t, err, http.StatusNotFound, "")
	if after := lastSeq(t, b); after != before {
		t.Fatalf("the log grew from %d to %d", before, after)
	}
	if got, err := ca.ReportEffects(ctx, r.ID, r.Claim.DeliveryID, []events.Effect{{Kind: "comment"}}); err != nil || len(got.Effects) != 1 {
		t.Fatalf("the owner's report: %+v %v", got.Effects, err)
	}
}

// TestEffectsTooLargeForTheLog: a report within every field limit whose
// event is larger than the log takes answers 413 and writes nothing.
func TestEffectsTooLargeForTheLog(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.MaxEventBytes = 16 << 10 })
	r := runningTask(t, b, api.ScheduleRequest{})
	settled(t, b)
	effects := make([]events.Effect, events.MaxEffects)
	for i := range effects {
		effects[i] = events.Effect{Kind: "link", Ref: fmt.Sprint(i), URL: "https://example.com/" + strings.Repeat("u", 1<<10)}
	}
	before := lastSeq(t, b)
	_, err := b.client.ReportEffects(context.Background(), r.ID, r.Claim.DeliveryID, effects)
	apiError(t, err, http.StatusRequestEntityTooLarge, "")
	if after := lastSeq(t, b); after != before {
		t.Fatalf("the log grew from %d to %d", before, after)
	}
}

// taskSeqs returns each task's last log sequence as the store loads it:
// what a refused request must leave unchanged while the parallel subtests
// write other tasks to the same stream.
func taskSeqs(t *testing.T, b *bundle, ids ...string) []uint64 {
	t.Helper()
	out := make([]uint64, len(ids))
	for i, id := range ids {
		st, err := b.node.Store.Load(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = uint64(st.LastSeq)
	}
	return out
}
