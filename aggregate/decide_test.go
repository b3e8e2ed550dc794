package aggregate_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// The fixed clock of every test: t0 schedules, runAt releases, claimedAt
// claims, deadline ends the run.
var (
	t0        = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	runAt     = t0.Add(time.Minute)
	claimedAt = runAt.Add(10 * time.Second)
	deadline  = claimedAt.Add(timeout * time.Second)
	later     = deadline.Add(time.Hour)
)

const (
	taskID  = "task-1"
	custID  = "cust-1"
	d1      = "dlv-1"
	d2      = "dlv-2"
	exec1   = "exec-1"
	timeout = 600
)

func spec() events.TaskSpec {
	return events.TaskSpec{
		RootID:         taskID,
		Queue:          "default",
		Message:        events.Message{ID: "objective", CreatedAt: t0, Content: []events.ContentPart{{Type: "text", Text: "do it"}}},
		RunAt:          runAt,
		TimeoutSeconds: timeout,
	}
}

func msg(id string) events.Message {
	return events.Message{ID: id, CreatedAt: t0, Content: []events.ContentPart{{Type: "text", Text: "follow-up " + id}}}
}

func ev(at time.Time, p events.Payload) events.Event {
	return events.Event{TaskID: taskID, CustomerID: custID, At: at, Data: p}
}

// Histories: the given events of the table tests.
var (
	scheduled          = []events.Event{ev(t0, events.TaskScheduled{Spec: spec()})}
	released           = with(scheduled, ev(runAt, events.DeliveryPending{DeliveryID: d1, Attempt: 1, NextAt: runAt}))
	retried            = with(released, ev(runAt, events.DeliveryRetryScheduled{DeliveryID: d1, Attempt: 2, NextAt: runAt.Add(time.Second), Error: "nats: timeout"}))
	queued             = with(released, ev(runAt, events.ReadyPublished{DeliveryID: d1}))
	running            = with(queued, ev(claimedAt, events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline}))
	runningUnpublished = with(released, ev(claimedAt, events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline}))
	succeeded          = with(running, ev(later, events.ResultRecorded{DeliveryID: d1, Result: events.Result{Success: true}}))
	failed             = with(running, ev(later, events.ResultRecorded{DeliveryID: d1, Result: events.Result{Error: "boom"}}))
	canceled           = with(queued, ev(later, events.Canceled{Reason: "stop"}))
	timedOut           = with(running, ev(deadline, events.TimedOut{Deadline: deadline}))
	rejected           = []events.Event{ev(t0, events.AdmissionRejected{Spec: spec(), Reason: "quota"})}
	exhausted          = with(retried, ev(runAt, events.DeliveryExhausted{DeliveryID: d1, Attempts: 2, Reason: "publish failed"}))
	withMail           = with(running, mailEvents(1, "m1", "m2", "m3")...)
)

var terminalHistories = []struct {
	name   string
	given  []events.Event
	status aggregate.Status
}{
	{"Succeeded", succeeded, aggregate.StatusSucceeded},
	{"Failed", failed, aggregate.StatusFailed},
	{"Canceled", canceled, aggregate.StatusCanceled},
	{"TimedOut", timedOut, aggregate.StatusTimedOut},
	{"Rejected", rejected, aggregate.StatusCanceled},
	{"Exhausted", exhausted, aggregate.StatusFailed},
}

func with(h []events.Event, more ...events.Event) []events.Event {
	return slices.Concat(h, more)
}

func mailEvents(first int, ids ...string) []events.Event {
	var evs []events.Event
	for i, id := range ids {
		evs = append(evs, ev(t0, events.MailboxAppended{Index: first + i, Message: msg(id)}))
	}
	return evs
}

// replay folds evs as the store would, with stream sequences 1, 2, ….
func replay(evs []events.Event) aggregate.State {
	var s aggregate.State
	return apply(s, evs)
}

func apply(s aggregate.State, evs []events.Event) aggregate.State {
	for _, e := range evs {
		e.Seq = s.LastSeq + 1
		s = aggregate.Apply(s, e)
	}
	return s
}

var sentinels = []error{
	aggregate.ErrNotFound, aggregate.ErrExists, aggregate.ErrTerminal, aggregate.ErrNotClaimable,
	aggregate.ErrTokenMismatch, aggregate.ErrStale, aggregate.ErrInvalid, aggregate.ErrConflict, aggregate.ErrTooLarge, aggregate.ErrClaimLost,
}

// requireErrKind fails unless err wraps want and no other Decide sentinel.
func requireErrKind(t interface {
	Helper()
	Fatalf(string, ...any)
}, err, want error) {
	t.Helper()
	for _, s := range sentinels {
		if got := errors.Is(err, s); got != errors.Is(s, want) {
			t.Fatalf("error %v: errors.Is(%v) = %v, want only %v", err, s, got, want)
		}
	}
}

// holderActor is the actor a command's events name: the claim's
// executor for what its holder writes under its delivery token (a result
// or a mailbox read with one, effects), else "" for the store to fill.
func holderActor(s aggregate.State, cmd aggregate.Command) string {
	switch c := cmd.(type) {
	case aggregate.RecordResult:
		if c.DeliveryID != "" {
			return s.Claim.ExecutorID
		}
	case aggregate.ReportEffects:
		return s.Claim.ExecutorID
	case aggregate.ReadMail:
		if c.DeliveryID != "" {
			return s.Claim.ExecutorID
		}
	}
	return ""
}

type decideCase struct {
	name       string
	given      []events.Event
	cmd        aggregate.Command
	now        time.Time
	want       []events.Payload // expected payloads when wantErr is nil
	wantErr    error
	wantStatus aggregate.Status // status after applying the result; "" means unchanged
}

func runDecide(t *testing.T, cases []decideCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := replay(tc.given)
			snapshot := replay(tc.given)
			got, err := aggregate.Decide(s, tc.cmd, tc.now)
			if !reflect.DeepEqual(s, snapshot) {
				t.Fatalf("Decide changed its input state")
			}
			if tc.wantErr != nil {
				requireErrKind(t, err, tc.wantErr)
				if got != nil {
					t.Fatalf("Decide returned events %+v with error %v", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide(%T%+v) error = %v, want events %+v", tc.cmd, tc.cmd, err, tc.want)
			}
			want := make([]events.Event, 0, len(tc.want))
			for i, p := range tc.want {
				e := ev(tc.now, p)
				e.Number = s.Version + 1 + i // gap-free per task
				e.Actor = holderActor(s, tc.cmd)
				want = append(want, e)
			}
			if len(got) != 0 || len(want) != 0 {
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("Decide events\n got: %+v\nwant: %+v", got, want)
				}
			}
			wantStatus := tc.wantStatus
			if wantStatus == "" {
				wantStatus = s.Status
			}
			if after := apply(s, got); after.Status != wantStatus {
				t.Fatalf("status after applying = %q, want %q", after.Status, wantStatus)
			}
		})
	}
}

// TestDecideTransitions covers every row of the transition table
// and the commands that change a task without changing its status.
func TestDecideTransitions(t *testing.T) {
	t.Parallel()
	noRunAt := spec()
	noRunAt.RunAt = time.Time{}
	nowRunAt := spec()
	nowRunAt.RunAt = t0
	m1 := msg("m1")
	m1NoTime := m1
	m1NoTime.CreatedAt = time.Time{}
	m1Now := m1
	m1Now.CreatedAt = later
	ok := events.Result{Success: true, Summary: "done", Effects: []events.Effect{{Kind: "pull_request", URL: "https://example.com/1"}}}
	bad := events.Result{Error: "boom"}
	keyedNow := nowRunAt // a keyed task is released only with a slot, by the alarm
	keyedNow.Concurrency = &events.Concurrency{Key: "repo:x", Limit: 1}
	runDecide(t, []decideCase{
		// — → scheduled
		{name: "ScheduleNew", cmd: aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: spec()}, now: t0,
			want: []events.Payload{events.TaskScheduled{Spec: spec()}}, wantStatus: aggregate.StatusScheduled},
		{name: "ScheduleZeroRunAtMeansNow", cmd: aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: noRunAt}, now: t0,
			want: []events.Payload{events.TaskScheduled{Spec: nowRunAt}}, wantStatus: aggregate.StatusScheduled},
		// — → scheduled and released at once, when due
		{name: "ScheduleDueReleased", cmd: aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: nowRunAt, DeliveryID: d1, NextAt: later}, now: t0,
			want: []events.Payload{events.TaskScheduled{Spec: nowRunAt, DeliveryID: d1, NextAt: later}}, wantStatus: aggregate.StatusScheduled},
		{name: "ScheduleDueReleasedNextAtNow", cmd: aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: noRunAt, DeliveryID: d1}, now: t0,
			want: []events.Payload{events.TaskScheduled{Spec: nowRunAt, DeliveryID: d1, NextAt: t0}}, wantStatus: aggregate.StatusScheduled},
		{name: "ScheduleNotDueNotReleased", cmd: aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: spec(), DeliveryID: d1, NextAt: later}, now: t0,
			want: []events.Payload{events.TaskScheduled{Spec: spec()}}, wantStatus: aggregate.StatusScheduled},
		{name: "ScheduleKeyedDueNotReleased", cmd: aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: keyedNow, DeliveryID: d1, NextAt: later}, now: t0,
			want: []events.Payload{events.TaskScheduled{Spec: keyedNow}}, wantStatus: aggregate.StatusScheduled},
		// — → canceled
		{name: "RejectNew", cmd: aggregate.Reject{TaskID: taskID, CustomerID: custID, Spec: spec(), Reason: "quota"}, now: t0,
			want: []events.Payload{events.AdmissionRejected{Spec: spec(), Reason: "quota"}}, wantStatus: aggregate.StatusCanceled},
		{name: "RejectZeroRunAtMeansNow", cmd: aggregate.Reject{TaskID: taskID, CustomerID: custID, Spec: noRunAt, Reason: "quota"}, now: t0,
			want: []events.Payload{events.AdmissionRejected{Spec: nowRunAt, Reason: "quota"}}, wantStatus: aggregate.StatusCanceled},
		// scheduled stays scheduled while its delivery is pending
		{name: "ReleaseDueAtRunAt", given: scheduled, cmd: aggregate.ReleaseDue{DeliveryID: d1}, now: runAt,
			want: []events.Payload{events.DeliveryPending{DeliveryID: d1, Attempt: 1, NextAt: runAt}}},
		{name: "ReleaseDueAfterRunAt", given: scheduled, cmd: aggregate.ReleaseDue{DeliveryID: d2}, now: later,
			want: []events.Payload{events.DeliveryPending{DeliveryID: d2, Attempt: 1, NextAt: later}}},
		{name: "ReleaseDueDeliveryLater", given: scheduled, cmd: aggregate.ReleaseDue{DeliveryID: d1, NextAt: later}, now: runAt,
			want: []events.Payload{events.DeliveryPending{DeliveryID: d1, Attempt: 1, NextAt: later}}},
		{name: "ReleaseDueDeliveryNotBeforeNow", given: scheduled, cmd: aggregate.ReleaseDue{DeliveryID: d1, NextAt: runAt}, now: later,
			want: []events.Payload{events.DeliveryPending{DeliveryID: d1, Attempt: 1, NextAt: later}}},
		{name: "RetryDelivery", given: released, cmd: aggregate.RetryDelivery{DeliveryID: d1, NextAt: later, Error: "e"}, now: runAt,
			want: []events.Payload{events.DeliveryRetryScheduled{DeliveryID: d1, Attempt: 2, NextAt: later, Error: "e"}}},
		{name: "RetryDeliveryAgain", given: retried, cmd: aggregate.RetryDelivery{DeliveryID: d1, NextAt: later}, now: runAt,
			want: []events.Payload{events.DeliveryRetryScheduled{DeliveryID: d1, Attempt: 3, NextAt: later}}},
		// scheduled → queued
		{name: "ReadyPublishedQueues", given: released, cmd: aggregate.MarkReadyPublished{DeliveryID: d1}, now: runAt,
			want: []events.Payload{events.ReadyPublished{DeliveryID: d1}}, wantStatus: aggregate.StatusQueued},
		{name: "ReadyPublishedAfterRetryQueues", given: retried, cmd: aggregate.MarkReadyPublished{DeliveryID: d1}, now: runAt,
			want: []events.Payload{events.ReadyPublished{DeliveryID: d1}}, wantStatus: aggregate.StatusQueued},
		// scheduled, queued → running
		{name: "ClaimScheduled", given: released, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, now: claimedAt,
			want:       []events.Payload{events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline}},
			wantStatus: aggregate.StatusRunning},
		{name: "ClaimScheduledAfterRetry", given: retried, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, now: claimedAt,
			want:       []events.Payload{events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline}},
			wantStatus: aggregate.StatusRunning},
		{name: "ClaimQueued", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, now: claimedAt,
			want:       []events.Payload{events.Claimed{DeliveryID: d1, ExecutorID: exec1, Deadline: deadline}},
			wantStatus: aggregate.StatusRunning},
		// any non-terminal → succeeded / failed
		{name: "ResultSucceededFromScheduled", given: scheduled, cmd: aggregate.RecordResult{Result: ok}, now: later,
			want: []events.Payload{events.ResultRecorded{Result: ok}}, wantStatus: aggregate.StatusSucceeded},
		{name: "ResultFailedFromScheduled", given: scheduled, cmd: aggregate.RecordResult{Result: bad}, now: later,
			want: []events.Payload{events.ResultRecorded{Result: bad}}, wantStatus: aggregate.StatusFailed},
		{name: "ResultSucceededFromReleased", given: released, cmd: aggregate.RecordResult{Result: ok}, now: later,
			want: []events.Payload{events.ResultRecorded{Result: ok}}, wantStatus: aggregate.StatusSucceeded},
		{name: "ResultFailedFromQueued", given: queued, cmd: aggregate.RecordResult{Result: bad}, now: later,
			want: []events.Payload{events.ResultRecorded{Result: bad}}, wantStatus: aggregate.StatusFailed},
		{name: "ResultSucceededFromQueued", given: queued, cmd: aggregate.RecordResult{Result: ok}, now: later,
			want: []events.Payload{events.ResultRecorded{Result: ok}}, wantStatus: aggregate.StatusSucceeded},
		{name: "ResultSucceededFromRunningWithToken", given: running, cmd: aggregate.RecordResult{DeliveryID: d1, Result: ok}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: ok}}, wantStatus: aggregate.StatusSucceeded},
		{name: "ResultFailedFromRunningWithToken", given: running, cmd: aggregate.RecordResult{DeliveryID: d1, Result: bad}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: bad}}, wantStatus: aggregate.StatusFailed},
		{name: "ResultFromRunningWithoutToken", given: running, cmd: aggregate.RecordResult{Result: ok}, now: later,
			want: []events.Payload{events.ResultRecorded{Result: ok}}, wantStatus: aggregate.StatusSucceeded},
		{name: "ResultAfterDeadlineBeforeTimeOut", given: running, cmd: aggregate.RecordResult{DeliveryID: d1, Result: ok}, now: deadline.Add(time.Minute),
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: ok}}, wantStatus: aggregate.StatusSucceeded},
		// any non-terminal → canceled
		{name: "CancelScheduled", given: scheduled, cmd: aggregate.Cancel{Reason: "r"}, now: later,
			want: []events.Payload{events.Canceled{Reason: "r"}}, wantStatus: aggregate.StatusCanceled},
		{name: "CancelReleased", given: released, cmd: aggregate.Cancel{}, now: later,
			want: []events.Payload{events.Canceled{}}, wantStatus: aggregate.StatusCanceled},
		{name: "CancelQueued", given: queued, cmd: aggregate.Cancel{Reason: "r"}, now: later,
			want: []events.Payload{events.Canceled{Reason: "r"}}, wantStatus: aggregate.StatusCanceled},
		{name: "CancelRunning", given: running, cmd: aggregate.Cancel{Reason: "r"}, now: later,
			want: []events.Payload{events.Canceled{Reason: "r"}}, wantStatus: aggregate.StatusCanceled},
		// running → timed_out
		{name: "TimeOutAtDeadline", given: running, cmd: aggregate.TimeOut{}, now: deadline,
			want: []events.Payload{events.TimedOut{Deadline: deadline}}, wantStatus: aggregate.StatusTimedOut},
		{name: "TimeOutAfterDeadline", given: running, cmd: aggregate.TimeOut{}, now: later,
			want: []events.Payload{events.TimedOut{Deadline: deadline}}, wantStatus: aggregate.StatusTimedOut},
		// scheduled → failed by exhausted delivery
		{name: "ExhaustDelivery", given: released, cmd: aggregate.ExhaustDelivery{DeliveryID: d1, Reason: "r"}, now: later,
			want:       []events.Payload{events.DeliveryExhausted{DeliveryID: d1, Attempts: 1, Reason: "r"}},
			wantStatus: aggregate.StatusFailed},
		{name: "ExhaustDeliveryAfterRetry", given: retried, cmd: aggregate.ExhaustDelivery{DeliveryID: d1, Reason: "r"}, now: later,
			want:       []events.Payload{events.DeliveryExhausted{DeliveryID: d1, Attempts: 2, Reason: "r"}},
			wantStatus: aggregate.StatusFailed},
		// mailbox, which never changes the status
		{name: "AppendMailFirst", given: running, cmd: aggregate.AppendMail{Message: m1}, now: later,
			want: []events.Payload{events.MailboxAppended{Index: 1, Message: m1}}},
		{name: "AppendMailZeroCreatedAtMeansNow", given: scheduled, cmd: aggregate.AppendMail{Message: m1NoTime}, now: later,
			want: []events.Payload{events.MailboxAppended{Index: 1, Message: m1Now}}},
		{name: "AppendMailFourth", given: withMail, cmd: aggregate.AppendMail{Message: msg("m4")}, now: later,
			want: []events.Payload{events.MailboxAppended{Index: 4, Message: msg("m4")}}},
		{name: "AppendMailSameIDAsObjective", given: queued, cmd: aggregate.AppendMail{Message: msg("objective")}, now: later,
			want: []events.Payload{events.MailboxAppended{Index: 1, Message: msg("objective")}}},
	})
}

// TestDecideCancelForAncestor: a claim's or a release's step cancels
// instead (reason ancestor_terminal) only where the claim or the release
// itself was allowed, so a racing claim, release or cancel leaves it
// nothing to do.
func TestDecideCancelForAncestor(t *testing.T) {
	t.Parallel()
	closed := []events.Payload{events.Canceled{Reason: events.ReasonAncestorTerminal}}
	runDecide(t, []decideCase{
		{name: "InsteadOfClaimReleased", given: released, cmd: aggregate.CancelForAncestor{DeliveryID: d1}, now: later,
			want: closed, wantStatus: aggregate.StatusCanceled},
		{name: "InsteadOfClaimQueued", given: queued, cmd: aggregate.CancelForAncestor{DeliveryID: d1}, now: later,
			want: closed, wantStatus: aggregate.StatusCanceled},
		{name: "InsteadOfRelease", given: scheduled, cmd: aggregate.CancelForAncestor{}, now: t0,
			want: closed, wantStatus: aggregate.StatusCanceled},
		{name: "ClaimOtherToken", given: queued, cmd: aggregate.CancelForAncestor{DeliveryID: d2}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "ClaimRunning", given: running, cmd: aggregate.CancelForAncestor{DeliveryID: d1}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ClaimUnreleased", given: scheduled, cmd: aggregate.CancelForAncestor{DeliveryID: d1}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ClaimCanceled", given: canceled, cmd: aggregate.CancelForAncestor{DeliveryID: d1}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ReleaseReleased", given: released, cmd: aggregate.CancelForAncestor{}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReleaseRunning", given: running, cmd: aggregate.CancelForAncestor{}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReleaseCanceled", given: canceled, cmd: aggregate.CancelForAncestor{}, now: later, wantErr: aggregate.ErrTerminal},
		{name: "NotFound", cmd: aggregate.CancelForAncestor{}, now: later, wantErr: aggregate.ErrNotFound},
	})
}

func TestDecideNotFound(t *testing.T) {
	t.Parallel()
	var cases []decideCase
	for _, cmd := range []aggregate.Command{
		aggregate.ReleaseDue{DeliveryID: d1}, aggregate.MarkReadyPublished{DeliveryID: d1},
		aggregate.RetryDelivery{DeliveryID: d1}, aggregate.ExhaustDelivery{DeliveryID: d1},
		aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, aggregate.RecordResult{Result: events.Result{Success: true}},
		aggregate.Cancel{}, aggregate.TimeOut{}, aggregate.AppendMail{Message: msg("m1")}, aggregate.ReadMail{Cursor: 0},
		aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{{Kind: "comment"}}},
		bogus{},
	} {
		cases = append(cases, decideCase{name: fmt.Sprintf("%T", cmd)[len("aggregate."):], cmd: cmd, now: later, wantErr: aggregate.ErrNotFound})
	}
	runDecide(t, cases)
}

// bogus is a Command Decide does not know.
type bogus struct{ aggregate.Command }

func TestDecideExists(t *testing.T) {
	t.Parallel()
	var cases []decideCase
	for _, h := range []struct {
		name  string
		given []events.Event
	}{{"Scheduled", scheduled}, {"Running", running}, {"Succeeded", succeeded}, {"Rejected", rejected}} {
		cases = append(cases,
			decideCase{name: "Schedule" + h.name, given: h.given, cmd: aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: spec()}, now: later, wantErr: aggregate.ErrExists},
			decideCase{name: "Reject" + h.name, given: h.given, cmd: aggregate.Reject{TaskID: taskID, CustomerID: custID, Spec: spec()}, now: later, wantErr: aggregate.ErrExists},
		)
	}
	runDecide(t, cases)
}

// TestDecideTerminal: once terminal, every lifecycle command and every new
// mailbox message is refused with ErrTerminal (a claim with ErrNotClaimable).
func TestDecideTerminal(t *testing.T) {
	t.Parallel()
	cmds := []struct {
		name string
		cmd  aggregate.Command
	}{
		{"ReleaseDue", aggregate.ReleaseDue{DeliveryID: d2}},
		{"MarkReadyPublished", aggregate.MarkReadyPublished{DeliveryID: d1}},
		{"RetryDelivery", aggregate.RetryDelivery{DeliveryID: d1, NextAt: later}},
		{"ExhaustDelivery", aggregate.ExhaustDelivery{DeliveryID: d1}},
		{"Claim", aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}},
		{"RecordResult", aggregate.RecordResult{Result: events.Result{Success: true}}},
		{"RecordResultWithToken", aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}},
		{"Cancel", aggregate.Cancel{}},
		{"TimeOut", aggregate.TimeOut{}},
		{"AppendMailNew", aggregate.AppendMail{Message: msg("new")}},
		{"ReportEffects", aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{{Kind: "comment"}}}},
	}
	var cases []decideCase
	for _, h := range terminalHistories {
		for _, c := range cmds {
			wantErr := aggregate.ErrTerminal
			if _, ok := c.cmd.(aggregate.Claim); ok {
				wantErr = aggregate.ErrNotClaimable // a task not scheduled or queued is not_claimable
			}
			cases = append(cases, decideCase{name: h.name + c.name, given: h.given, cmd: c.cmd, now: later.Add(time.Hour), wantErr: wantErr})
		}
	}
	runDecide(t, cases)
}

func TestDecideRejections(t *testing.T) {
	t.Parallel()
	effects := func(n int) []events.Effect {
		return slices.Repeat([]events.Effect{{Kind: "comment"}}, n)
	}
	bigMsg := events.Message{ID: "big", Content: []events.ContentPart{{Type: "text", Text: strings.Repeat("x", events.MaxMessageBytes-len("text")+1)}}}
	runDecide(t, []decideCase{
		// ErrNotClaimable
		{name: "ClaimUnreleased", given: scheduled, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ClaimUnreleasedEmptyToken", given: scheduled, cmd: aggregate.Claim{ExecutorID: exec1}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ClaimConsumedToken", given: running, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: "exec-2"}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ClaimConsumedTokenSameExecutor", given: running, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ClaimConsumedUnpublishedToken", given: runningUnpublished, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: exec1}, now: later, wantErr: aggregate.ErrNotClaimable},
		{name: "ClaimRunningOtherToken", given: running, cmd: aggregate.Claim{DeliveryID: d2, ExecutorID: exec1}, now: later, wantErr: aggregate.ErrNotClaimable},
		// ErrTokenMismatch
		{name: "ClaimWrongTokenScheduled", given: released, cmd: aggregate.Claim{DeliveryID: d2, ExecutorID: exec1}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "ClaimWrongTokenQueued", given: queued, cmd: aggregate.Claim{DeliveryID: d2, ExecutorID: exec1}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "ClaimEmptyToken", given: queued, cmd: aggregate.Claim{ExecutorID: exec1}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "ResultWrongToken", given: running, cmd: aggregate.RecordResult{DeliveryID: d2, Result: events.Result{Success: true}}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "ResultTokenWhileQueued", given: queued, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "ResultTokenWhileReleased", given: released, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "ResultTokenWhileUnreleased", given: scheduled, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "EffectsWrongToken", given: running, cmd: aggregate.ReportEffects{DeliveryID: d2, Effects: effects(1)}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "EffectsEmptyToken", given: running, cmd: aggregate.ReportEffects{Effects: effects(1)}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "EffectsWhileQueued", given: queued, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: effects(1)}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "EffectsWhileReleased", given: released, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: effects(1)}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "EffectsWhileUnreleased", given: scheduled, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: effects(1)}, now: later, wantErr: aggregate.ErrTokenMismatch},
		// ErrStale
		{name: "ReleaseDueBeforeRunAt", given: scheduled, cmd: aggregate.ReleaseDue{DeliveryID: d1}, now: runAt.Add(-time.Nanosecond), wantErr: aggregate.ErrStale},
		{name: "ReleaseDueTwice", given: released, cmd: aggregate.ReleaseDue{DeliveryID: d2}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReleaseDueTwiceSameToken", given: released, cmd: aggregate.ReleaseDue{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReleaseDueQueued", given: queued, cmd: aggregate.ReleaseDue{DeliveryID: d2}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReleaseDueRunning", given: running, cmd: aggregate.ReleaseDue{DeliveryID: d2}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReadyPublishedUnreleased", given: scheduled, cmd: aggregate.MarkReadyPublished{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReadyPublishedUnreleasedEmptyToken", given: scheduled, cmd: aggregate.MarkReadyPublished{}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReadyPublishedWrongToken", given: released, cmd: aggregate.MarkReadyPublished{DeliveryID: d2}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReadyPublishedTwice", given: queued, cmd: aggregate.MarkReadyPublished{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReadyPublishedLateRunning", given: running, cmd: aggregate.MarkReadyPublished{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "ReadyPublishedLateRunningUnpublished", given: runningUnpublished, cmd: aggregate.MarkReadyPublished{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "RetryUnreleased", given: scheduled, cmd: aggregate.RetryDelivery{DeliveryID: d1, NextAt: later}, now: later, wantErr: aggregate.ErrStale},
		{name: "RetryUnreleasedEmptyToken", given: scheduled, cmd: aggregate.RetryDelivery{NextAt: later}, now: later, wantErr: aggregate.ErrStale},
		{name: "RetryWrongToken", given: released, cmd: aggregate.RetryDelivery{DeliveryID: d2, NextAt: later}, now: later, wantErr: aggregate.ErrStale},
		{name: "RetryQueued", given: queued, cmd: aggregate.RetryDelivery{DeliveryID: d1, NextAt: later}, now: later, wantErr: aggregate.ErrStale},
		{name: "RetryRunning", given: runningUnpublished, cmd: aggregate.RetryDelivery{DeliveryID: d1, NextAt: later}, now: later, wantErr: aggregate.ErrStale},
		{name: "ExhaustUnreleased", given: scheduled, cmd: aggregate.ExhaustDelivery{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "ExhaustUnreleasedEmptyToken", given: scheduled, cmd: aggregate.ExhaustDelivery{}, now: later, wantErr: aggregate.ErrStale},
		{name: "ExhaustWrongToken", given: released, cmd: aggregate.ExhaustDelivery{DeliveryID: d2}, now: later, wantErr: aggregate.ErrStale},
		{name: "ExhaustQueued", given: queued, cmd: aggregate.ExhaustDelivery{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "ExhaustRunning", given: runningUnpublished, cmd: aggregate.ExhaustDelivery{DeliveryID: d1}, now: later, wantErr: aggregate.ErrStale},
		{name: "TimeOutBeforeDeadline", given: running, cmd: aggregate.TimeOut{}, now: deadline.Add(-time.Nanosecond), wantErr: aggregate.ErrStale},
		{name: "TimeOutScheduled", given: released, cmd: aggregate.TimeOut{}, now: later, wantErr: aggregate.ErrStale},
		{name: "TimeOutQueued", given: queued, cmd: aggregate.TimeOut{}, now: later, wantErr: aggregate.ErrStale},
		// ErrInvalid
		{name: "ReleaseDueEmptyDeliveryID", given: scheduled, cmd: aggregate.ReleaseDue{}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ReleaseDueBadDeliveryID", given: scheduled, cmd: aggregate.ReleaseDue{DeliveryID: "a.b"}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ClaimEmptyExecutor", given: queued, cmd: aggregate.Claim{DeliveryID: d1}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ClaimBadExecutor", given: queued, cmd: aggregate.Claim{DeliveryID: d1, ExecutorID: "exec 1"}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ResultTooManyEffects", given: running, cmd: aggregate.RecordResult{Result: events.Result{Effects: effects(events.MaxEffects + 1)}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ResultTooManyEffectsWithToken", given: running, cmd: aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true, Effects: effects(33)}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ResultSummaryTooLong", given: running, cmd: aggregate.RecordResult{Result: events.Result{Summary: strings.Repeat("s", 16<<10+1)}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ResultEffectWithoutKind", given: running, cmd: aggregate.RecordResult{Result: events.Result{Effects: []events.Effect{{URL: "u"}}}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectsNone", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectsTooMany", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: effects(events.MaxEffects + 1)}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectsWithoutKind", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{{Kind: "comment"}, {Ref: "r"}}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectsRefOver", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{{Kind: "comment", Ref: strings.Repeat("r", events.MaxNameBytes+1)}}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectsURLOver", given: running, cmd: aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{{Kind: "comment", URL: strings.Repeat("u", events.MaxURLBytes+1)}}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "AppendMailEmptyID", given: running, cmd: aggregate.AppendMail{Message: events.Message{Content: msg("x").Content}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "AppendMailBadID", given: running, cmd: aggregate.AppendMail{Message: msg("m.1")}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "AppendMailTooBig", given: running, cmd: aggregate.AppendMail{Message: bigMsg}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "UnknownCommand", given: running, cmd: bogus{}, now: later, wantErr: aggregate.ErrInvalid},
	})
}

// TestDecideResultLimits: the limits themselves are accepted, one byte
// more on any field is not (a 1 MB error, 32 × 32 KB effect URLs).
func TestDecideResultLimits(t *testing.T) {
	t.Parallel()
	atLimits := events.Result{
		Success: true,
		Summary: strings.Repeat("s", events.MaxSummaryBytes),
		Error:   strings.Repeat("e", events.MaxErrorBytes),
		Effects: slices.Repeat([]events.Effect{{
			Kind: strings.Repeat("k", events.MaxNameBytes), Ref: strings.Repeat("r", events.MaxNameBytes),
			URL: strings.Repeat("u", events.MaxURLBytes),
		}}, events.MaxEffects),
	}
	over := func(change func(r *events.Result)) aggregate.Command {
		r := atLimits
		r.Effects = slices.Clone(r.Effects)
		change(&r)
		return aggregate.RecordResult{DeliveryID: d1, Result: r}
	}
	runDecide(t, []decideCase{
		{name: "AtLimits", given: running, cmd: aggregate.RecordResult{DeliveryID: d1, Result: atLimits}, now: later,
			want: []events.Payload{events.ResultRecorded{DeliveryID: d1, Result: atLimits}}, wantStatus: aggregate.StatusSucceeded},
		{name: "SummaryOver", given: running, cmd: over(func(r *events.Result) { r.Summary += "s" }), now: later, wantErr: aggregate.ErrInvalid},
		{name: "ErrorOver", given: running, cmd: over(func(r *events.Result) { r.Error += "e" }), now: later, wantErr: aggregate.ErrInvalid},
		{name: "Error1MB", given: running, cmd: over(func(r *events.Result) { r.Error = strings.Repeat("e", 1<<20) }), now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectKindOver", given: running, cmd: over(func(r *events.Result) { r.Effects[5].Kind += "k" }), now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectRefOver", given: running, cmd: over(func(r *events.Result) { r.Effects[0].Ref += "r" }), now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectURLOver", given: running, cmd: over(func(r *events.Result) { r.Effects[31].URL += "u" }), now: later, wantErr: aggregate.ErrInvalid},
		{name: "EffectURLs32KB", given: running, cmd: over(func(r *events.Result) {
			for i := range r.Effects {
				r.Effects[i].URL = strings.Repeat("u", 32<<10)
			}
		}), now: later, wantErr: aggregate.ErrInvalid},
	})
}

// TestDecideReasonLimits: a cancel's and a rejection's reason are bounded.
func TestDecideReasonLimits(t *testing.T) {
	t.Parallel()
	atLimit := strings.Repeat("r", events.MaxReasonBytes)
	runDecide(t, []decideCase{
		{name: "CancelAtLimit", given: running, cmd: aggregate.Cancel{Reason: atLimit}, now: later,
			want: []events.Payload{events.Canceled{Reason: atLimit}}, wantStatus: aggregate.StatusCanceled},
		{name: "CancelOver", given: running, cmd: aggregate.Cancel{Reason: atLimit + "r"}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "Cancel1MB", given: queued, cmd: aggregate.Cancel{Reason: strings.Repeat("r", 1<<20)}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "RejectAtLimit", cmd: aggregate.Reject{TaskID: taskID, CustomerID: custID, Spec: spec(), Reason: atLimit}, now: t0,
			want: []events.Payload{events.AdmissionRejected{Spec: spec(), Reason: atLimit}}, wantStatus: aggregate.StatusCanceled},
		{name: "RejectOver", cmd: aggregate.Reject{TaskID: taskID, CustomerID: custID, Spec: spec(), Reason: atLimit + "r"}, now: t0, wantErr: aggregate.ErrInvalid},
		{name: "RejectOverExisting", given: scheduled, cmd: aggregate.Reject{TaskID: taskID, CustomerID: custID, Spec: spec(), Reason: atLimit + "r"}, now: t0, wantErr: aggregate.ErrExists},
	})
}

func TestDecideScheduleValidation(t *testing.T) {
	t.Parallel()
	text := func(n int) events.Message {
		return events.Message{Content: []events.ContentPart{{Type: "text", Text: strings.Repeat("x", n-len("text"))}}}
	}
	tests := []struct {
		name   string
		taskID string // taskID when empty; "!" for the empty id
		custID string
		change func(*events.TaskSpec)
		ok     bool
	}{
		{name: "Valid", ok: true},
		{name: "Timeout0", change: func(s *events.TaskSpec) { s.TimeoutSeconds = 0 }},
		{name: "TimeoutNegative", change: func(s *events.TaskSpec) { s.TimeoutSeconds = -1 }},
		{name: "Timeout1", change: func(s *events.TaskSpec) { s.TimeoutSeconds = 1 }, ok: true},
		{name: "Timeout604800", change: func(s *events.TaskSpec) { s.TimeoutSeconds = 604800 }, ok: true},
		{name: "Timeout604801", change: func(s *events.TaskSpec) { s.TimeoutSeconds = 604801 }},
		{name: "RootOtherWithoutParent", change: func(s *events.TaskSpec) { s.RootID = "root-9" }},
		{name: "RootEmpty", change: func(s *events.TaskSpec) { s.RootID = "" }},
		{name: "ChildWithOwnRoot", change: func(s *events.TaskSpec) { s.ParentID = "parent-1" }},
		{name: "ChildOfRoot", change: func(s *events.TaskSpec) { s.ParentID, s.RootID = "root-9", "root-9" }, ok: true},
		{name: "Grandchild", change: func(s *events.TaskSpec) { s.ParentID, s.RootID = "parent-1", "root-9" }, ok: true},
		{name: "ChildBadParent", change: func(s *events.TaskSpec) { s.ParentID, s.RootID = "a b", "root-9" }},
		{name: "ChildBadRoot", change: func(s *events.TaskSpec) { s.ParentID, s.RootID = "parent-1", "*" }},
		{name: "TaskIDWithDot", taskID: "a.b", change: func(s *events.TaskSpec) { s.RootID = "a.b" }},
		{name: "TaskIDEmpty", taskID: "!", change: func(s *events.TaskSpec) { s.RootID = "" }},
		{name: "TaskIDTooLong", taskID: strings.Repeat("t", 65), change: func(s *events.TaskSpec) { s.RootID = strings.Repeat("t", 65) }},
		{name: "TaskID64", taskID: strings.Repeat("t", 64), change: func(s *events.TaskSpec) { s.RootID = strings.Repeat("t", 64) }, ok: true},
		{name: "CustomerIDEmpty", custID: "!"},
		{name: "CustomerIDWildcard", custID: "*"},
		{name: "CustomerIDTail", custID: ">"},
		{name: "QueueEmpty", change: func(s *events.TaskSpec) { s.Queue = "" }},
		{name: "QueueWithDot", change: func(s *events.TaskSpec) { s.Queue = "gpu.big" }},
		{name: "RequestIDUnicode", change: func(s *events.TaskSpec) { s.RequestID = "requête" }},
		{name: "RequestIDTooLong", change: func(s *events.TaskSpec) { s.RequestID = strings.Repeat("r", 65) }},
		{name: "RequestIDValid", change: func(s *events.TaskSpec) { s.RequestID = "req_1-A" }, ok: true},
		{name: "RelatedTaskIDWildcard", change: func(s *events.TaskSpec) { s.RelatedTaskID = "t>" }},
		{name: "MessageIDBad", change: func(s *events.TaskSpec) { s.Message.ID = "m 1" }},
		{name: "MessageIDEmpty", change: func(s *events.TaskSpec) { s.Message.ID = "" }, ok: true},
		{name: "Message64KiB", change: func(s *events.TaskSpec) { s.Message = text(events.MaxMessageBytes) }, ok: true},
		{name: "MessageOver64KiB", change: func(s *events.TaskSpec) { s.Message = text(events.MaxMessageBytes + 1) }},
		{name: "MessagePartsOver64KiB", change: func(s *events.TaskSpec) {
			s.Message = text(events.MaxMessageBytes / 2)
			s.Message.Content = append(s.Message.Content, text(events.MaxMessageBytes/2+1).Content...)
		}},
		{name: "MessageNoParts", change: func(s *events.TaskSpec) { s.Message.Content = nil }, ok: true},
		{name: "MessageMaxParts", change: func(s *events.TaskSpec) {
			s.Message.Content = slices.Repeat(s.Message.Content[:1], events.MaxContentParts)
		}, ok: true},
		{name: "MessageTooManyParts", change: func(s *events.TaskSpec) {
			s.Message.Content = slices.Repeat(s.Message.Content[:1], events.MaxContentParts+1)
		}},
		{name: "MessageEmptyParts60000", change: func(s *events.TaskSpec) {
			s.Message.Content = make([]events.ContentPart, 60000)
		}},
		{name: "MessagePartWithoutText", change: func(s *events.TaskSpec) { s.Message.Content[0].Text = "" }},
		{name: "MessagePartWithoutType", change: func(s *events.TaskSpec) { s.Message.Content[0].Type = "" }},
		{name: "MessagePartTypeAtLimit", change: func(s *events.TaskSpec) {
			s.Message.Content[0].Type = strings.Repeat("t", events.MaxNameBytes)
		}, ok: true},
		{name: "MessagePartTypeOver", change: func(s *events.TaskSpec) {
			s.Message.Content[0].Type = strings.Repeat("t", events.MaxNameBytes+1)
		}},
		{name: "RepoAtLimit", change: func(s *events.TaskSpec) { s.Repo = strings.Repeat("r", events.MaxURLBytes) }, ok: true},
		{name: "RepoOver", change: func(s *events.TaskSpec) { s.Repo = strings.Repeat("r", events.MaxURLBytes+1) }},
		{name: "SignalAtLimits", change: func(s *events.TaskSpec) {
			name := strings.Repeat("n", events.MaxNameBytes)
			s.Signal = events.Signal{ID: name, URI: strings.Repeat("u", events.MaxURLBytes), RequestID: name, EventType: name, EventAction: name}
		}, ok: true},
		{name: "SignalURI1MB", change: func(s *events.TaskSpec) { s.Signal.URI = strings.Repeat("u", 1<<20) }},
		{name: "SignalURIOver", change: func(s *events.TaskSpec) { s.Signal.URI = strings.Repeat("u", events.MaxURLBytes+1) }},
		{name: "SignalIDOver", change: func(s *events.TaskSpec) { s.Signal.ID = strings.Repeat("n", events.MaxNameBytes+1) }},
		{name: "SignalRequestIDOver", change: func(s *events.TaskSpec) { s.Signal.RequestID = strings.Repeat("n", events.MaxNameBytes+1) }},
		{name: "SignalEventTypeOver", change: func(s *events.TaskSpec) { s.Signal.EventType = strings.Repeat("n", events.MaxNameBytes+1) }},
		{name: "SignalEventActionOver", change: func(s *events.TaskSpec) { s.Signal.EventAction = strings.Repeat("n", events.MaxNameBytes+1) }},
	}
	for _, tt := range tests {
		for _, reject := range []bool{false, true} {
			name := "Schedule" + tt.name
			if reject {
				name = "Reject" + tt.name
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				id, cust := orDefault(tt.taskID, taskID), orDefault(tt.custID, custID)
				sp := spec()
				sp.RootID = id
				if tt.change != nil {
					tt.change(&sp)
				}
				var cmd aggregate.Command = aggregate.Schedule{TaskID: id, CustomerID: cust, Spec: sp}
				if reject {
					cmd = aggregate.Reject{TaskID: id, CustomerID: cust, Spec: sp, Reason: "quota"}
				}
				got, err := aggregate.Decide(aggregate.State{}, cmd, t0)
				if !tt.ok {
					requireErrKind(t, err, aggregate.ErrInvalid)
					return
				}
				if err != nil || len(got) != 1 {
					t.Fatalf("Decide = %+v, %v; want one event", got, err)
				}
				if got[0].TaskID != id || got[0].CustomerID != cust || !got[0].At.Equal(t0) {
					t.Fatalf("event envelope = %+v, want task %s customer %s at %v", got[0], id, cust, t0)
				}
			})
		}
	}
}

// orDefault returns v, def for an empty v, or "" for "!".
func orDefault(v, def string) string {
	switch v {
	case "":
		return def
	case "!":
		return ""
	}
	return v
}

func TestDecideMailbox(t *testing.T) {
	t.Parallel()
	changed := msg("m2")
	changed.Content = []events.ContentPart{{Type: "text", Text: "different body, same id"}}
	terminalWithMail := with(withMail, ev(later, events.Canceled{}))
	read2 := with(withMail, ev(later, events.MailboxRead{Cursor: 2}))
	runDecide(t, []decideCase{
		{name: "RepeatedIDIsNoop", given: withMail, cmd: aggregate.AppendMail{Message: msg("m2")}, now: later},
		{name: "RepeatedIDChangedBodyIsNoop", given: withMail, cmd: aggregate.AppendMail{Message: changed}, now: later},
		{name: "RepeatedIDOnTerminalIsNoop", given: terminalWithMail, cmd: aggregate.AppendMail{Message: msg("m3")}, now: later},
		{name: "EmptyBody", given: withMail, cmd: aggregate.AppendMail{Message: events.Message{ID: "m4"}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "EmptyPart", given: withMail, cmd: aggregate.AppendMail{Message: events.Message{ID: "m4", Content: []events.ContentPart{{Type: "text"}}}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "TooManyParts", given: withMail, cmd: aggregate.AppendMail{Message: events.Message{ID: "m4",
			Content: slices.Repeat([]events.ContentPart{{Type: "text", Text: "x"}}, events.MaxContentParts+1)}}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "NewIDOnTerminal", given: terminalWithMail, cmd: aggregate.AppendMail{Message: msg("m4")}, now: later, wantErr: aggregate.ErrTerminal},
		{name: "ReadAdvances", given: withMail, cmd: aggregate.ReadMail{Cursor: 2}, now: later,
			want: []events.Payload{events.MailboxRead{Cursor: 2}}},
		{name: "ReadToEnd", given: withMail, cmd: aggregate.ReadMail{Cursor: 3}, now: later,
			want: []events.Payload{events.MailboxRead{Cursor: 3}}},
		{name: "ReadZeroIsNoop", given: withMail, cmd: aggregate.ReadMail{Cursor: 0}, now: later},
		{name: "ReadNegativeIsNoop", given: withMail, cmd: aggregate.ReadMail{Cursor: -1}, now: later},
		{name: "ReadBeyondEnd", given: withMail, cmd: aggregate.ReadMail{Cursor: 4}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ReadSameCursorIsNoop", given: read2, cmd: aggregate.ReadMail{Cursor: 2}, now: later},
		{name: "ReadBackwardsIsNoop", given: read2, cmd: aggregate.ReadMail{Cursor: 1}, now: later},
		{name: "ReadOnFromCursor", given: read2, cmd: aggregate.ReadMail{Cursor: 3}, now: later,
			want: []events.Payload{events.MailboxRead{Cursor: 3}}},
		{name: "ReadEmptyMailboxZero", given: running, cmd: aggregate.ReadMail{}, now: later},
		{name: "ReadEmptyMailboxOne", given: running, cmd: aggregate.ReadMail{Cursor: 1}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ReadOnTerminal", given: terminalWithMail, cmd: aggregate.ReadMail{Cursor: 3}, now: later,
			want: []events.Payload{events.MailboxRead{Cursor: 3}}},
		{name: "HolderReads", given: withMail, cmd: aggregate.ReadMail{Cursor: 2, DeliveryID: d1}, now: later,
			want: []events.Payload{events.MailboxRead{Cursor: 2}}},
		{name: "OtherTokenReadsNothing", given: withMail, cmd: aggregate.ReadMail{Cursor: 2, DeliveryID: "dlv-9"}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "HolderOfTerminalReadsNothing", given: terminalWithMail, cmd: aggregate.ReadMail{Cursor: 3, DeliveryID: d1}, now: later, wantErr: aggregate.ErrTokenMismatch},
		{name: "QueuedReadsNothing", given: with(queued, mailEvents(1, "m1")...), cmd: aggregate.ReadMail{Cursor: 1, DeliveryID: d1}, now: later, wantErr: aggregate.ErrTokenMismatch},
	})
}

// TestDecideNamesHolder: what a claim's holder writes under its token
// names the claim's executor; what anyone else asks for is left for the
// store to name.
func TestDecideNamesHolder(t *testing.T) {
	t.Parallel()
	s := replay(withMail)
	for _, tc := range []struct {
		name string
		cmd  aggregate.Command
		want string
	}{
		{"Result", aggregate.RecordResult{DeliveryID: d1, Result: events.Result{Success: true}}, exec1},
		{"ResultWithoutToken", aggregate.RecordResult{Result: events.Result{Success: true}}, ""},
		{"Effects", aggregate.ReportEffects{DeliveryID: d1, Effects: []events.Effect{{Kind: "pr", Ref: "1"}}}, exec1},
		{"MailRead", aggregate.ReadMail{Cursor: 1, DeliveryID: d1}, exec1},
		{"Cancel", aggregate.Cancel{}, ""},
		{"Mail", aggregate.AppendMail{Message: msg("m9")}, ""},
	} {
		evs, err := aggregate.Decide(s, tc.cmd, later)
		if err != nil || len(evs) != 1 {
			t.Fatalf("%s: %v, %d events", tc.name, err, len(evs))
		}
		if evs[0].Actor != tc.want {
			t.Errorf("%s: actor %q, want %q", tc.name, evs[0].Actor, tc.want)
		}
	}
}

func TestApplyReplayCounters(t *testing.T) {
	t.Parallel()
	s := replay(withMail)
	if !s.Exists() || s.Version != len(withMail) || s.LastSeq != events.Position(len(withMail)) {
		t.Fatalf("Version, LastSeq = %d, %d; want %d, %d", s.Version, s.LastSeq, len(withMail), len(withMail))
	}
	if got := s.MailIndex("m2"); got != 2 {
		t.Fatalf("MailIndex(m2) = %d, want 2", got)
	}
	if got := s.MailIndex("nope"); got != 0 {
		t.Fatalf("MailIndex(nope) = %d, want 0", got)
	}
	if (aggregate.State{}).Exists() {
		t.Fatalf("zero State exists")
	}
	if s.TaskID != taskID || s.CustomerID != custID || !s.CreatedAt.Equal(t0) || !s.StartedAt.Equal(claimedAt) || !s.Deadline.Equal(deadline) {
		t.Fatalf("state fields = %+v", s)
	}
}

// TestApplyLateReadyPublished: a ReadyPublished after the claim never moves
// the task back to queued.
// TestScheduleReleased: a task released by its TaskScheduled is
// claimable with that token, in the delivery queue's state (pending, not
// published), and an invalid delivery id is refused before anything.
func TestScheduleReleased(t *testing.T) {
	t.Parallel()
	sp := spec()
	sp.RunAt = t0
	evs, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: sp, DeliveryID: d1, NextAt: later}, t0)
	if err != nil {
		t.Fatal(err)
	}
	st := apply(aggregate.State{}, evs)
	want := aggregate.Delivery{ID: d1, Attempt: 1, NextAt: later, FirstAt: t0}
	if !st.Claimable() || st.Status != aggregate.StatusScheduled || st.Delivery != want {
		t.Fatalf("released task: status %s, delivery %+v, want scheduled with %+v", st.Status, st.Delivery, want)
	}
	if _, err := aggregate.Decide(st, aggregate.ReleaseDue{DeliveryID: d2}, later); !errors.Is(err, aggregate.ErrStale) {
		t.Fatalf("ReleaseDue after a release in TaskScheduled: %v, want ErrStale", err)
	}
	if _, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: sp, DeliveryID: "a.b"}, t0); !errors.Is(err, aggregate.ErrInvalid) {
		t.Fatalf("Schedule with delivery id a.b: %v, want ErrInvalid", err)
	}
}

func TestApplyLateReadyPublished(t *testing.T) {
	t.Parallel()
	before := replay(runningUnpublished)
	after := apply(before, []events.Event{ev(later, events.ReadyPublished{DeliveryID: d1})})
	if after.Status != aggregate.StatusRunning {
		t.Fatalf("status = %s, want running", after.Status)
	}
	if after.Claim != before.Claim || !after.Deadline.Equal(before.Deadline) || after.Claimable() {
		t.Fatalf("late ReadyPublished changed the run: %+v", after)
	}
}

// TestApplyTerminalIgnoresLifecycle: lifecycle events reaching a terminal
// task change only Version and LastSeq; mailbox events still apply.
func TestApplyTerminalIgnoresLifecycle(t *testing.T) {
	t.Parallel()
	lifecycle := []events.Payload{
		events.TaskScheduled{Spec: spec()},
		events.AdmissionRejected{Spec: spec(), Reason: "late"},
		events.DeliveryPending{DeliveryID: d2, Attempt: 1, NextAt: later},
		events.DeliveryRetryScheduled{DeliveryID: d1, Attempt: 9, NextAt: later},
		events.DeliveryExhausted{DeliveryID: d1, Attempts: 9, Reason: "late"},
		events.ReadyPublished{DeliveryID: d1},
		events.Claimed{DeliveryID: d1, ExecutorID: "exec-2", Deadline: later},
		events.TimedOut{Deadline: later},
		events.ResultRecorded{Result: events.Result{Success: true}},
		events.ResultRecorded{Result: events.Result{Error: "late"}},
		events.Canceled{Reason: "late"},
		events.EffectsReported{DeliveryID: d1, Effects: []events.Effect{{Kind: "late", At: later}}},
	}
	for _, h := range terminalHistories {
		for _, p := range lifecycle {
			t.Run(h.name+string(p.EventType()), func(t *testing.T) {
				t.Parallel()
				before := replay(h.given)
				if before.Status != h.status {
					t.Fatalf("given status = %s, want %s", before.Status, h.status)
				}
				after := apply(before, []events.Event{ev(later.Add(time.Hour), p)})
				want := before
				want.Version++
				want.LastSeq++
				if !reflect.DeepEqual(after, want) {
					t.Fatalf("terminal state changed\n got: %+v\nwant: %+v", after, want)
				}
			})
		}
		t.Run(h.name+"Mailbox", func(t *testing.T) {
			t.Parallel()
			s := apply(replay(h.given), with(mailEvents(1, "m1", "m2"), ev(later, events.MailboxRead{Cursor: 2})))
			if !slices.Equal(s.MailIDs, []string{"m1", "m2"}) || s.Cursor != 2 || s.Status != h.status {
				t.Fatalf("mailbox on terminal task: ids %v cursor %d status %s", s.MailIDs, s.Cursor, s.Status)
			}
		})
	}
}

// TestApplyExhaustedQueued covers the table row "queued → failed" by
// exhaustion as a log fact (Decide itself refuses it once published).
func TestApplyExhaustedQueued(t *testing.T) {
	t.Parallel()
	s := apply(replay(queued), []events.Event{ev(later, events.DeliveryExhausted{DeliveryID: d1, Attempts: 1, Reason: "r"})})
	if s.Status != aggregate.StatusFailed || s.Reason != "r" || !s.CompletedAt.Equal(later) {
		t.Fatalf("state = %+v, want failed with reason r at %v", s, later)
	}
}

func TestApplyMailboxReadNeverBackwards(t *testing.T) {
	t.Parallel()
	s := apply(replay(withMail), []events.Event{ev(later, events.MailboxRead{Cursor: 3}), ev(later, events.MailboxRead{Cursor: 1})})
	if s.Cursor != 3 {
		t.Fatalf("cursor = %d, want 3", s.Cursor)
	}
}

// TestApplyDoesNotAlias: two States derived from one never share mailbox
// storage.
func TestApplyDoesNotAlias(t *testing.T) {
	t.Parallel()
	base := replay(with(scheduled, mailEvents(1, "m1")...))
	base.MailIDs = slices.Grow(base.MailIDs, 8) // spare capacity to tempt append
	a := apply(base, mailEvents(2, "a"))
	b := apply(base, mailEvents(2, "b"))
	if !slices.Equal(a.MailIDs, []string{"m1", "a"}) || !slices.Equal(b.MailIDs, []string{"m1", "b"}) || len(base.MailIDs) != 1 {
		t.Fatalf("aliasing: base %v, a %v, b %v", base.MailIDs, a.MailIDs, b.MailIDs)
	}
}

func TestStatusTerminal(t *testing.T) {
	t.Parallel()
	for s, want := range map[aggregate.Status]bool{
		"": false, aggregate.StatusScheduled: false, aggregate.StatusQueued: false, aggregate.StatusRunning: false,
		aggregate.StatusSucceeded: true, aggregate.StatusFailed: true, aggregate.StatusCanceled: true, aggregate.StatusTimedOut: true,
	} {
		if got := s.Terminal(); got != want {
			t.Fatalf("%q.Terminal() = %v, want %v", s, got, want)
		}
	}
}

func TestClaimable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		given []events.Event
		want  bool
	}{
		{"Unreleased", scheduled, false},
		{"Released", released, true},
		{"Queued", queued, true},
		{"Running", running, false},
		{"Succeeded", succeeded, false},
	} {
		if got := replay(tt.given).Claimable(); got != tt.want {
			t.Fatalf("%s: Claimable() = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestDecideCheckFailed: a failed stop check is recorded on a live task
// at most once a minute; in between the record is a no-op (the caller
// counts the failures into the next one).
func TestDecideCheckFailed(t *testing.T) {
	t.Parallel()
	failed := aggregate.RecordCheckFailed{Since: later, Failures: 2, Error: "load task: timeout"}
	recorded := with(running, ev(later, events.CheckFailed{Since: later, Failures: 1}))
	runDecide(t, []decideCase{
		{name: "Records", given: running, cmd: failed, now: later,
			want: []events.Payload{events.CheckFailed{Since: later, Failures: 2, Error: "load task: timeout"}}},
		{name: "WithinAMinuteIsNoop", given: recorded, cmd: failed, now: later.Add(aggregate.CheckFailedInterval - time.Nanosecond)},
		{name: "AfterAMinute", given: recorded, cmd: failed, now: later.Add(aggregate.CheckFailedInterval),
			want: []events.Payload{events.CheckFailed{Since: later, Failures: 2, Error: "load task: timeout"}}},
		{name: "NoFailures", given: running, cmd: aggregate.RecordCheckFailed{Since: later}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "ErrorTooLong", given: running, cmd: aggregate.RecordCheckFailed{Since: later, Failures: 1,
			Error: strings.Repeat("e", events.MaxErrorBytes+1)}, now: later, wantErr: aggregate.ErrInvalid},
		{name: "OnTerminal", given: with(running, ev(later, events.Canceled{})), cmd: failed, now: later, wantErr: aggregate.ErrTerminal},
	})
}
