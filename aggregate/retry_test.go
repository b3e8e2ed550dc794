package aggregate_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// policy is a retry policy of n attempts, 10 s backoff up to 25 s, on the
// given causes.
func policy(n int, on ...string) *events.RetryPolicy {
	return &events.RetryPolicy{MaxAttempts: n, BackoffSeconds: 10, MaxBackoffSeconds: 25, On: on}
}

// retrySpec is spec() with a retry policy.
func retrySpec(p *events.RetryPolicy) events.TaskSpec {
	s := spec()
	s.Retry = p
	return s
}

// runningWith is the running history of a task scheduled with p.
func runningWith(p *events.RetryPolicy) []events.Event {
	return with([]events.Event{ev(t0, events.TaskScheduled{Spec: retrySpec(p)})}, running[1:]...)
}

// due is when attempt k+1 is due after attempt k ended at now, by the
// model's reading of API.md.
func due(p *events.RetryPolicy, k int, now time.Time) time.Time {
	return model{taskID: taskID, run: k, retry: p}.nextAt(now)
}

var (
	fails = events.Result{Error: "flaky", Effects: []events.Effect{{Kind: "comment", Ref: "c1"}}}
	final = events.Result{Error: "bad input", Retryable: new(bool)}
)

// retriedOnce is a task with three attempts on failed whose first failed
// at later: scheduled again, due at due(p, 1, later).
func retriedOnce() []events.Event {
	p := policy(3, events.RetryOnFailed)
	r := fails
	return with(runningWith(p), ev(later, events.RetryScheduled{Attempt: 2, NextAt: due(p, 1, later), Cause: events.RetryOnFailed, DeliveryID: d1, Result: &r}))
}

func TestDecideRetry(t *testing.T) {
	t.Parallel()
	both := policy(3, events.RetryOnFailed, events.RetryOnTimedOut)
	onFailed := policy(3, events.RetryOnFailed)
	r := fails
	nextAt := due(onFailed, 1, later)
	released := with(retriedOnce(), ev(nextAt, events.DeliveryPending{DeliveryID: d2, Attempt: 1, NextAt: nextAt}))
	second := with(released, ev(nextAt, events.Claimed{DeliveryID: d2, ExecutorID: "exec-2", Deadline: nextAt.Add(timeout * time.Second)}))
	thirdAt := due(onFailed, 2, later.Add(time.Hour))
	third := with(second, ev(later.Add(time.Hour), events.RetryScheduled{Attempt: 3, NextAt: thirdAt, Cause: events.RetryOnFailed, DeliveryID: d2, Result: &r}),
		ev(thirdAt, events.DeliveryPending{DeliveryID: "dlv-3", Attempt: 1, NextAt: thirdAt}),
		ev(thirdAt, events.Claimed{DeliveryID: "dlv-3", ExecutorID: exec1, Deadline: thirdAt.Add(timeout * time.Second)}))
	runDecide(t, []decideCase{
		{name: "FailureRetried", given: runningWith(onFailed), cmd: aggregate.RecordResult{DeliveryID: d1, Result: fails}, now: later,
			want:       []events.Payload{events.RetryScheduled{Attempt: 2, NextAt: due(onFailed, 1, later), Cause: events.RetryOnFailed, DeliveryID: d1, Result: &r}},
			wantStatus: aggregate.StatusScheduled},
		{name: "FailureWithoutTokenRetried", given: runningWith(onFailed), cmd: aggregate.RecordResult{Result: fails}, now: later,
			want:       []events.Payload{events.RetryScheduled{Attempt: 2, NextAt: due(onFailed, 1, later), Cause: events.RetryOnFailed, Result: &r}},
			wantStatus: aggregate.StatusScheduled},
		{name: "NotRetryableFails", given: runningWith(onFailed), cmd: aggregate.RecordResult{DeliveryID: d1, Result: final}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: final}}, wantStatus: aggregate.StatusFailed},
		{name: "SuccessSucceeds", given: runningWith(onFailed), cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: events.Result{Success: true}}}, wantStatus: aggregate.StatusSucceeded},
		{name: "OneAttemptFails", given: runningWith(policy(1, events.RetryOnFailed)), cmd: aggregate.RecordResult{DeliveryID: d1, Result: fails}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: fails}}, wantStatus: aggregate.StatusFailed},
		{name: "OnlyTimedOutFails", given: runningWith(policy(3, events.RetryOnTimedOut)), cmd: aggregate.RecordResult{DeliveryID: d1, Result: fails}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: fails}}, wantStatus: aggregate.StatusFailed},
		// A result for a task that is not running is not an attempt's end.
		{name: "QueuedFailureFails", given: with([]events.Event{ev(t0, events.TaskScheduled{Spec: retrySpec(onFailed)})}, queued[1:]...),
			cmd: aggregate.RecordResult{Result: fails}, now: later,
			want: []events.Payload{events.ResultRecorded{Result: fails}}, wantStatus: aggregate.StatusFailed},
		{name: "TimeOutRetried", given: runningWith(both), cmd: aggregate.TimeOut{}, now: deadline,
			want:       []events.Payload{events.RetryScheduled{Attempt: 2, NextAt: due(both, 1, deadline), Cause: events.RetryOnTimedOut, Deadline: deadline}},
			wantStatus: aggregate.StatusScheduled},
		{name: "TimeOutNotOnTimedOut", given: runningWith(onFailed), cmd: aggregate.TimeOut{}, now: deadline,
			want: []events.Payload{events.TimedOut{Deadline: deadline}}, wantStatus: aggregate.StatusTimedOut},
		{name: "TimeOutBeforeDeadline", given: runningWith(both), cmd: aggregate.TimeOut{}, now: deadline.Add(-1), wantErr: aggregate.ErrStale},
		// The retried task waits for nextAt, then gets a new token.
		{name: "ReleaseBeforeNextAt", given: retriedOnce(), cmd: aggregate.ReleaseDue{DeliveryID: d2}, now: nextAt.Add(-1), wantErr: aggregate.ErrStale},
		{name: "ReleaseAtNextAt", given: retriedOnce(), cmd: aggregate.ReleaseDue{DeliveryID: d2}, now: nextAt,
			want: []events.Payload{events.DeliveryPending{DeliveryID: d2, Attempt: 1, NextAt: nextAt}}},
		{name: "ReleaseForTheAttemptsSlot", given: retriedOnce(), cmd: aggregate.ReleaseDue{DeliveryID: d2, Attempt: 2}, now: nextAt,
			want: []events.Payload{events.DeliveryPending{DeliveryID: d2, Attempt: 1, NextAt: nextAt}}},
		{name: "ReleaseForTheLastAttemptsSlot", given: retriedOnce(), cmd: aggregate.ReleaseDue{DeliveryID: d2, Attempt: 1}, now: nextAt, wantErr: aggregate.ErrStale},
		{name: "ReleaseWithOldToken", given: retriedOnce(), cmd: aggregate.ReleaseDue{DeliveryID: d1}, now: nextAt, wantErr: aggregate.ErrInvalid},
		{name: "OldTokenClaim", given: released, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, now: nextAt, wantErr: aggregate.ErrTokenMismatch},
		{name: "OldTokenResult", given: second, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, now: nextAt, wantErr: aggregate.ErrTokenMismatch},
		{name: "OldTokenEffects", given: second, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: distinct(1, later)}, now: nextAt, wantErr: aggregate.ErrTokenMismatch},
		{name: "OldRunTimeOutStale", given: retriedOnce(), cmd: aggregate.TimeOut{}, now: later, wantErr: aggregate.ErrStale},
		{name: "CancelRetried", given: retriedOnce(), cmd: aggregate.Cancel{Reason: "enough"}, now: later,
			want: []events.Payload{events.Canceled{Reason: "enough"}}, wantStatus: aggregate.StatusCanceled},
		// The second retry waits twice as long; the last attempt's failure is final.
		{name: "SecondRetryDoubles", given: second, cmd: aggregate.RecordResult{DeliveryID: d2, Result: fails}, now: later.Add(time.Hour),
			want:       []events.Payload{events.RetryScheduled{Attempt: 3, NextAt: due(onFailed, 2, later.Add(time.Hour)), Cause: events.RetryOnFailed, DeliveryID: d2, Result: &r}},
			wantStatus: aggregate.StatusScheduled},
		{name: "LastAttemptFails", given: third, cmd: aggregate.RecordResult{DeliveryID: "dlv-3", Result: fails}, now: thirdAt,
			want: []events.Payload{events.ResultRecorded{DeliveryID: "dlv-3", Result: fails}}, wantStatus: aggregate.StatusFailed},
		{name: "LastAttemptTimesOut", given: third, cmd: aggregate.TimeOut{}, now: thirdAt.Add(timeout * time.Second),
			want: []events.Payload{events.TimedOut{Deadline: thirdAt.Add(timeout * time.Second)}}, wantStatus: aggregate.StatusTimedOut},
	})
}

// The backoff doubles per attempt up to maxBackoffSeconds, less a jitter
// of at most a fifth, and is the same on every decision.
func TestRetryBackoffBounds(t *testing.T) {
	t.Parallel()
	p := policy(100, events.RetryOnFailed)
	for k, base := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 25 * time.Second, 99: 25 * time.Second} {
		s := replay(runningWith(p))
		s.Retries = make([]aggregate.Attempt, k-1)
		got, err := aggregate.Decide(s, aggregate.RecordResult{DeliveryID: d1, Result: fails}, later)
		if err != nil {
			t.Fatalf("attempt %d: %v", k, err)
		}
		again, _ := aggregate.Decide(s, aggregate.RecordResult{DeliveryID: d1, Result: fails}, later)
		if !reflect.DeepEqual(got, again) {
			t.Fatalf("attempt %d: two decisions differ: %+v, %+v", k, got, again)
		}
		rs := got[0].Data.(events.RetryScheduled)
		if d := rs.NextAt.Sub(later); d > base || d < base-base/5 || rs.Attempt != k+1 {
			t.Errorf("attempt %d: retry %d after %v, want %v less at most a fifth", k, rs.Attempt, d, base)
		}
	}
	zero := &events.RetryPolicy{MaxAttempts: 2, On: []string{events.RetryOnFailed}}
	got, err := aggregate.Decide(replay(runningWith(zero)), aggregate.RecordResult{Result: fails}, later)
	if err != nil || got[0].Data.(events.RetryScheduled).NextAt != later {
		t.Fatalf("backoff 0: %+v, %v; want a retry at once", got, err)
	}
}

func TestDecideRetryValidation(t *testing.T) {
	t.Parallel()
	for name, p := range map[string]*events.RetryPolicy{
		"MaxAttemptsZero":      {MaxAttempts: 0, On: []string{"failed"}},
		"MaxAttemptsOver":      {MaxAttempts: events.MaxAttempts + 1, On: []string{"failed"}},
		"BackoffNegative":      {MaxAttempts: 2, BackoffSeconds: -1, On: []string{"failed"}},
		"BackoffOver":          {MaxAttempts: 2, BackoffSeconds: events.MaxBackoffSeconds + 1, On: []string{"failed"}},
		"MaxBackoffNegative":   {MaxAttempts: 2, MaxBackoffSeconds: -1, On: []string{"failed"}},
		"MaxBackoffOver":       {MaxAttempts: 2, MaxBackoffSeconds: events.MaxMaxBackoffSeconds + 1, On: []string{"failed"}},
		"OnEmpty":              {MaxAttempts: 2},
		"OnUnknown":            {MaxAttempts: 2, On: []string{"canceled"}},
		"OnTwice":              {MaxAttempts: 2, On: []string{"timed_out", "timed_out"}},
		"OnThreeOfTwo":         {MaxAttempts: 2, On: []string{"failed", "timed_out", "failed"}},
		"OnCaseMatters":        {MaxAttempts: 2, On: []string{"Failed"}},
		"OnEmptyString":        {MaxAttempts: 2, On: []string{""}},
		"MaxAttemptsNegative":  {MaxAttempts: -5, On: []string{"failed"}},
		"AllBoundsButOneWrong": {MaxAttempts: events.MaxAttempts, BackoffSeconds: events.MaxBackoffSeconds, MaxBackoffSeconds: events.MaxMaxBackoffSeconds + 1, On: []string{"failed", "timed_out"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: retrySpec(p)}, t0)
			requireErrKind(t, err, aggregate.ErrInvalid)
		})
	}
	edge := &events.RetryPolicy{MaxAttempts: events.MaxAttempts, BackoffSeconds: events.MaxBackoffSeconds, MaxBackoffSeconds: events.MaxMaxBackoffSeconds, On: []string{"timed_out", "failed"}}
	if _, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: retrySpec(edge)}, t0); err != nil {
		t.Fatalf("the bounds themselves: %v", err)
	}
}

// A retried attempt keeps its effects and shows in Attempts; the task is
// scheduled again with no delivery, claim or deadline, due at nextAt.
func TestApplyRetryScheduled(t *testing.T) {
	t.Parallel()
	s := replay(retriedOnce())
	nextAt := due(policy(3, events.RetryOnFailed), 1, later)
	if s.Status != aggregate.StatusScheduled || s.Delivery != (aggregate.Delivery{}) || s.Claim != (aggregate.Owner{}) ||
		!s.Deadline.IsZero() || !s.StartedAt.IsZero() || s.Result != nil || !s.DueAt().Equal(nextAt) {
		t.Fatalf("after a retry: %+v", s)
	}
	if s.Attempt() != 2 || s.MaxAttempts() != 3 {
		t.Fatalf("attempt %d of %d, want 2 of 3", s.Attempt(), s.MaxAttempts())
	}
	want := []aggregate.Attempt{{Number: 1, DeliveryID: d1, ExecutorID: exec1, StartedAt: claimedAt, EndedAt: later, Outcome: "failed", Error: "flaky", NextAt: nextAt}}
	if !reflect.DeepEqual(s.Attempts(), want) {
		t.Fatalf("attempts %+v, want %+v", s.Attempts(), want)
	}
	if len(s.Effects) != 1 || s.Effects[0].Ref != "c1" || !s.Effects[0].At.Equal(later) {
		t.Fatalf("effects %+v, want the failed attempt's", s.Effects)
	}
	s = apply(s, []events.Event{
		ev(nextAt, events.DeliveryPending{DeliveryID: d2, Attempt: 1, NextAt: nextAt}),
		ev(nextAt, events.Claimed{DeliveryID: d2, ExecutorID: "exec-2", Deadline: nextAt.Add(time.Hour)}),
		ev(nextAt.Add(time.Minute), events.ResultRecorded{DeliveryID: d2, Result: events.Result{Success: true, Effects: []events.Effect{{Kind: "pull_request"}}}}),
	})
	want = append(want, aggregate.Attempt{Number: 2, DeliveryID: d2, ExecutorID: "exec-2", StartedAt: nextAt, EndedAt: nextAt.Add(time.Minute), Outcome: "succeeded"})
	if !reflect.DeepEqual(s.Attempts(), want) || len(s.Effects) != 2 {
		t.Fatalf("attempts %+v effects %+v, want both attempts and both effects", s.Attempts(), s.Effects)
	}
	// A RetryScheduled that the table does not allow (not running) changes nothing.
	if after := apply(replay(queued), retriedOnce()[len(retriedOnce())-1:]); after.Status != aggregate.StatusQueued || after.Attempt() != 1 {
		t.Fatalf("RetryScheduled on a queued task moved it: %+v", after)
	}
}
