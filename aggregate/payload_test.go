package aggregate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// TestSchedulePayload: a task's kind and payload are checked and stored,
// the payload compact; none or null is no payload.
func TestSchedulePayload(t *testing.T) {
	t.Parallel()
	big := `"` + strings.Repeat("x", events.MaxPayloadBytes-2) + `"`
	for _, tc := range []struct {
		name, kind, payload string
		want                string // the stored payload
		err                 error
	}{
		{name: "None"},
		{name: "KindAlone", kind: "resize"},
		{name: "Compacted", kind: "resize", payload: "{ \"w\" : 640,\n \"tags\": [ \"ü\" ] }", want: `{"w":640,"tags":["ü"]}`},
		{name: "Scalar", payload: `42`, want: `42`},
		{name: "Null", payload: ` null `},
		{name: "LargestPayload", payload: big, want: big},
		{name: "LargestSpaced", payload: " " + big + "\n", want: big}, // counted compact
		{name: "PayloadOverLimit", payload: `"x` + big[1:], err: aggregate.ErrTooLarge},
		{name: "NotJSON", payload: `{"w":`, err: aggregate.ErrInvalid},
		{name: "TwoValues", payload: `1 2`, err: aggregate.ErrInvalid},
		{name: "KindUpperCase", kind: "Resize", err: aggregate.ErrInvalid},
		{name: "KindTooLong", kind: strings.Repeat("k", events.MaxKindBytes+1), err: aggregate.ErrInvalid},
		{name: "KindWithSlash", kind: "image/resize", err: aggregate.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sp := spec()
			sp.Kind, sp.Payload = tc.kind, []byte(tc.payload)
			got, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: sp}, t0)
			if tc.err != nil {
				requireErrKind(t, err, tc.err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			stored := got[0].Data.(events.TaskScheduled).Spec
			if stored.Kind != tc.kind || string(stored.Payload) != tc.want || (tc.want == "") != (stored.Payload == nil) {
				t.Fatalf("stored kind %q payload %q, want %q %q", stored.Kind, stored.Payload, tc.kind, tc.want)
			}
			s := aggregate.Apply(aggregate.State{}, got[0])
			if s.Spec.Kind != tc.kind || string(s.Spec.Payload) != tc.want {
				t.Fatalf("state kind %q payload %q", s.Spec.Kind, s.Spec.Payload)
			}
			retry, err := aggregate.RetrySpec(aggregate.Apply(s, ev(t0, events.Canceled{})))
			if err != nil || retry.Kind != tc.kind || string(retry.Payload) != tc.want {
				t.Fatalf("a retry's spec has kind %q payload %q (%v)", retry.Kind, retry.Payload, err)
			}
		})
	}
}

// TestResultOutput: a result's output is stored compact, in the result
// and in a retry's failure; an output that is not JSON or over its limit
// is refused.
func TestResultOutput(t *testing.T) {
	t.Parallel()
	sp := spec()
	sp.RunAt = t0
	sp.Retry = &events.RetryPolicy{MaxAttempts: 2, On: []string{events.RetryOnFailed}, MaxBackoffSeconds: 10}
	given := []events.Event{
		ev(t0, events.TaskScheduled{Spec: sp, DeliveryID: "d1", NextAt: t0}),
		ev(t0, events.Claimed{DeliveryID: "d1", ExecutorID: "e1", Deadline: t0.Add(time.Hour)}),
	}
	running := aggregate.Replay(given)
	record := func(success bool, output string) ([]events.Event, error) {
		return aggregate.Decide(running, aggregate.RecordResult{DeliveryID: "d1", Result: events.Result{Success: success, Output: []byte(output)}}, t0)
	}
	got, err := record(true, `{ "pr" : 12 }`)
	if err != nil || string(got[0].Data.(events.ResultRecorded).Result.Output) != `{"pr":12}` {
		t.Fatalf("success: %+v, %v", got, err)
	}
	got, err = record(false, `[1, 2]`)
	if err != nil || string(got[0].Data.(events.RetryScheduled).Result.Output) != `[1,2]` {
		t.Fatalf("retried failure: %+v, %v", got, err)
	}
	if got, err = record(true, "null"); err != nil || got[0].Data.(events.ResultRecorded).Result.Output != nil {
		t.Fatalf("null output: %+v, %v", got, err)
	}
	if _, err := record(true, "{"); !errors.Is(err, aggregate.ErrInvalid) {
		t.Fatalf("output not JSON: %v", err)
	}
	if _, err := record(true, `"`+strings.Repeat("x", events.MaxOutputBytes-1)+`"`); !errors.Is(err, aggregate.ErrTooLarge) {
		t.Fatalf("output over its limit: %v", err)
	}
}

// TestSchedulePayloadCompacted: a schedule stores its task's payload
// compact, so the same payload spaced differently is the same spec.
func TestSchedulePayloadCompacted(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC)
	withPayload := func(p string) events.ScheduleSpec {
		return schedSpec(func(s *events.ScheduleSpec) { s.Task.Kind, s.Task.Payload = "resize", []byte(p) })
	}
	s, evs, err := decideSched(t, aggregate.ScheduleState{}, aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: withPayload(`{ "w": 1 }`)}, created)
	if err != nil || string(evs[0].Data.(events.ScheduleCreated).Spec.Task.Payload) != `{"w":1}` {
		t.Fatalf("create: %+v, %v", evs, err)
	}
	if _, evs, err = decideSched(t, s, aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: withPayload(`{"w":1}`)}, created); err != nil || len(evs) != 0 {
		t.Fatalf("the same payload compact: %+v, %v", evs, err)
	}
	for _, bad := range []struct {
		payload string
		err     error
	}{{"{", aggregate.ErrInvalid}, {`"` + strings.Repeat("x", events.MaxPayloadBytes) + `"`, aggregate.ErrTooLarge}} {
		if _, _, err := decideSched(t, s, aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: withPayload(bad.payload)}, created); !errors.Is(err, bad.err) {
			t.Fatalf("payload %.20q: %v, want %v", bad.payload, err, bad.err)
		}
	}
}
