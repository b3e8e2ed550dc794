package aggregate_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// distinct returns n effects with distinct refs, each at at.
func distinct(n int, at time.Time) []events.Effect {
	out := make([]events.Effect, n)
	for i := range out {
		out[i] = events.Effect{Kind: "comment", Ref: fmt.Sprintf("c-%d", i), At: at}
	}
	return out
}

// reportedAll is running with events.MaxTaskEffects distinct effects reported.
func reportedAll() []events.Event {
	h := running
	for i := 0; i < events.MaxTaskEffects; i += events.MaxEffects {
		batch := distinct(events.MaxTaskEffects, claimedAt)[i : i+events.MaxEffects]
		h = with(h, ev(claimedAt, events.EffectsReported{DeliveryID: d1, Effects: batch}))
	}
	return h
}

func TestDecideReportEffects(t *testing.T) {
	t.Parallel()
	pr := events.Effect{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12"}
	stampedPR := pr
	stampedPR.At = later
	full := reportedAll()
	runDecide(t, []decideCase{
		{name: "StampsZeroAt", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{pr}}, now: later,
			want: []events.Payload{events.EffectsReported{DeliveryID: d1, Effects: []events.Effect{stampedPR}}}},
		{name: "KeepsExecutorAt", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: distinct(1, claimedAt)}, now: later,
			want: []events.Payload{events.EffectsReported{DeliveryID: d1, Effects: distinct(1, claimedAt)}}},
		{name: "AtMaxEffects", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: distinct(events.MaxEffects, later)}, now: later,
			want: []events.Payload{events.EffectsReported{DeliveryID: d1, Effects: distinct(events.MaxEffects, later)}}},
		{name: "AfterDeadlineBeforeTimeOut", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: distinct(1, later)}, now: deadline.Add(time.Minute),
			want: []events.Payload{events.EffectsReported{DeliveryID: d1, Effects: distinct(1, later)}}},
		// A full task still takes reports of effects it has: they replace, not add.
		{name: "FullTaskReplaces", given: full, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: distinct(2, later)}, now: later,
			want: []events.Payload{events.EffectsReported{DeliveryID: d1, Effects: distinct(2, later)}}},
		{name: "FullTaskRefusesNew", given: full, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{pr}}, now: later, wantErr: aggregate.ErrInvalid},
		// A result is never refused for a full list: its new effect stays in
		// the result only (TestApplyMergesEffects/FullTaskResult).
		{name: "FullTaskTakesResultWithNewEffect", given: full, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true, Effects: []events.Effect{pr}}}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: events.Result{Success: true, Effects: []events.Effect{pr}}}}, wantStatus: aggregate.StatusSucceeded},
		{name: "FullTaskTakesResult", given: full, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true, Effects: distinct(1, time.Time{})}}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: events.Result{Success: true, Effects: distinct(1, time.Time{})}}}, wantStatus: aggregate.StatusSucceeded},
	})
}

func TestApplyMergesEffects(t *testing.T) {
	t.Parallel()
	uncertain := events.Effect{Kind: "pull_request", Ref: "#12", Uncertain: true, At: claimedAt}
	comment := events.Effect{Kind: "comment", Ref: "c-1", At: claimedAt}
	confirmed := events.Effect{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12", At: claimedAt.Add(time.Second)}
	otherKind := events.Effect{Kind: "issue", Ref: "#12"} // same ref, other kind: distinct
	reported := with(running,
		ev(claimedAt, events.EffectsReported{DeliveryID: d1, Effects: []events.Effect{uncertain, comment}}),
		ev(claimedAt.Add(time.Second), events.EffectsReported{DeliveryID: d1, Effects: []events.Effect{confirmed}}))
	result := events.Result{Success: true, Effects: []events.Effect{otherKind, {Kind: "comment", Ref: "c-1", URL: "u"}}}
	otherKindAt, commentAt := otherKind, events.Effect{Kind: "comment", Ref: "c-1", URL: "u", At: later}
	otherKindAt.At = later
	for _, tc := range []struct {
		name   string
		given  []events.Event
		status aggregate.Status
		want   []events.Effect
	}{
		{"None", running, aggregate.StatusRunning, nil},
		{"ReportedReplacesInPlace", reported, aggregate.StatusRunning, []events.Effect{confirmed, comment}},
		{"Result", with(reported, ev(later, events.ResultRecorded{DeliveryID: d1, Result: result})), aggregate.StatusSucceeded,
			[]events.Effect{confirmed, commentAt, otherKindAt}},
		{"TimedOut", with(reported, ev(deadline, events.TimedOut{Deadline: deadline})), aggregate.StatusTimedOut, []events.Effect{confirmed, comment}},
		{"Canceled", with(reported, ev(later, events.Canceled{Reason: "stop"})), aggregate.StatusCanceled, []events.Effect{confirmed, comment}},
		// The log is the truth but Apply never moves sideways: a report of
		// another claim, or after the end, changes nothing.
		{"OtherClaimIgnored", with(running, ev(later, events.EffectsReported{DeliveryID: d2, Effects: []events.Effect{comment}})), aggregate.StatusRunning, nil},
		{"QueuedIgnored", with(queued, ev(later, events.EffectsReported{DeliveryID: d1, Effects: []events.Effect{comment}})), aggregate.StatusQueued, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := replay(tc.given)
			if s.Status != tc.status || !reflect.DeepEqual(s.Effects, tc.want) {
				t.Fatalf("status %s effects %+v, want %s %+v", s.Status, s.Effects, tc.status, tc.want)
			}
		})
	}
	t.Run("ResultKeepsItsEffects", func(t *testing.T) {
		t.Parallel()
		s := replay(with(reported, ev(later, events.ResultRecorded{DeliveryID: d1, Result: result})))
		if !reflect.DeepEqual(*s.Result, result) {
			t.Fatalf("result %+v, want it as reported %+v", *s.Result, result)
		}
	})
	t.Run("FullTaskResult", func(t *testing.T) {
		t.Parallel()
		extra := events.Result{Success: true, Effects: []events.Effect{{Kind: "comment", Ref: "past-the-cap", At: later}}}
		s := replay(with(reportedAll(), ev(later, events.ResultRecorded{DeliveryID: d1, Result: extra})))
		if s.Status != aggregate.StatusSucceeded || !reflect.DeepEqual(s.Effects, distinct(events.MaxTaskEffects, claimedAt)) ||
			!reflect.DeepEqual(*s.Result, extra) {
			t.Fatalf("status %s, %d effects, result %+v: want succeeded, the %d reported, the result as sent",
				s.Status, len(s.Effects), *s.Result, events.MaxTaskEffects)
		}
	})
}

// TestApplyEffectsDoNotAlias: two States derived from one never share
// effects storage.
func TestApplyEffectsDoNotAlias(t *testing.T) {
	t.Parallel()
	base := replay(with(running, ev(claimedAt, events.EffectsReported{DeliveryID: d1, Effects: distinct(2, claimedAt)})))
	a := apply(base, []events.Event{ev(later, events.EffectsReported{DeliveryID: d1, Effects: []events.Effect{{Kind: "comment", Ref: "c-0", URL: "a", At: later}}})})
	b := apply(base, []events.Event{ev(later, events.EffectsReported{DeliveryID: d1, Effects: []events.Effect{{Kind: "a", At: later}}})})
	if base.Effects[0].URL != "" || len(base.Effects) != 2 || a.Effects[0].URL != "a" || len(b.Effects) != 3 || b.Effects[0].URL != "" {
		t.Fatalf("aliasing: base %+v, a %+v, b %+v", base.Effects, a.Effects, b.Effects)
	}
}
