package reactors_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/reactors"
)

// largest is a result at every limit: a 16 KiB summary and error and 32
// effects with the longest kind, ref and url. Its report is over 64 KiB.
func largest(fill string) events.Result {
	r := events.Result{Summary: strings.Repeat(fill, events.MaxSummaryBytes/len(fill)), Error: strings.Repeat(fill, events.MaxErrorBytes/len(fill))}
	for range events.MaxEffects {
		r.Effects = append(r.Effects, events.Effect{Kind: strings.Repeat("k", events.MaxNameBytes),
			Ref: strings.Repeat("r", events.MaxNameBytes), URL: "https://example.com/" + strings.Repeat("u", events.MaxURLBytes-20)})
	}
	return r
}

// TestChildResultMessageFits: a report always fits in a mailbox message,
// is cut only when it must be, and says so.
func TestChildResultMessageFits(t *testing.T) {
	t.Parallel()
	parent, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: "parent", CustomerID: "c",
		Spec: events.TaskSpec{RootID: "parent", Queue: "q", TimeoutSeconds: 60}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	live := aggregate.Replay(parent)
	small := events.Result{Success: true, Summary: "done", Effects: []events.Effect{{Kind: "pull_request", Ref: "42"}}, Output: []byte(`{"w":640}`)}
	bigOutput := small
	bigOutput.Output = []byte(`"` + strings.Repeat("o", events.MaxOutputBytes-2) + `"`)
	for _, tt := range []struct {
		name      string
		child     aggregate.State
		truncated bool
	}{
		{"Small", aggregate.State{TaskID: "child-1", Status: aggregate.StatusSucceeded, Result: &small}, false},
		{"AtEveryLimit", aggregate.State{TaskID: "child-1", Status: aggregate.StatusFailed, Result: ptr(largest("s"))}, true},
		// '<' is escaped as \u003c: six bytes of JSON for each byte.
		{"EscapedText", aggregate.State{TaskID: "child-1", Status: aggregate.StatusFailed, Result: ptr(largest("<"))}, true},
		{"MultiByteText", aggregate.State{TaskID: "child-1", Status: aggregate.StatusFailed, Result: ptr(largest("é"))}, true},
		{"LongReason", aggregate.State{TaskID: "child-1", Status: aggregate.StatusFailed, Reason: strings.Repeat("<", 64<<10)}, true},
		{"LargestOutput", aggregate.State{TaskID: "child-1", Status: aggregate.StatusSucceeded, Result: &bigOutput}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg := reactors.ChildResultMessage(tt.child)
			if n := aggregate.MessageSize(msg); n > events.MaxMessageBytes {
				t.Fatalf("report is %d bytes, more than %d", n, events.MaxMessageBytes)
			}
			if _, err := aggregate.Decide(live, aggregate.AppendMail{Message: msg}, time.Now()); err != nil {
				t.Fatalf("the parent refuses the report: %v", err)
			}
			var got events.ChildResult
			if err := json.Unmarshal([]byte(msg.Content[0].Text), &got); err != nil {
				t.Fatal(err)
			}
			if got.TaskID != tt.child.TaskID || got.Status != string(tt.child.Status) || got.Truncated != tt.truncated {
				t.Fatalf("report %+v, want task %s status %s truncated %v", got, tt.child.TaskID, tt.child.Status, tt.truncated)
			}
			full := tt.child.Result
			switch {
			case !tt.truncated && (got.Result == nil || got.Result.Summary != full.Summary || len(got.Result.Effects) != len(full.Effects) ||
				string(got.Result.Output) != string(full.Output)):
				t.Fatalf("a report that fits was changed: %+v", got.Result)
			case tt.truncated && full != nil && (got.Result == nil || !strings.HasPrefix(full.Summary, got.Result.Summary) ||
				got.Result.Summary == "" || len(got.Result.Effects) == 0):
				t.Fatalf("a cut report should keep the start of the summary and some effects: %+v", got.Result)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// reportIn returns the report of childID in a parent's history.
func reportIn(t *testing.T, h []events.Event, childID string) events.ChildResult {
	t.Helper()
	for _, ev := range h {
		if m, ok := ev.Data.(events.MailboxAppended); ok && m.Message.ID == events.ChildResultID(childID) {
			var r events.ChildResult
			if err := json.Unmarshal([]byte(m.Message.Content[0].Text), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("no report of %s in the parent's history", childID)
	return events.ChildResult{}
}

// TestAlarmReportsLargestResult: a child whose result is at every limit
// reaches its parent's mailbox, cut to fit, and the report queue empties
// (the alarm once retried such a report forever).
func TestAlarmReportsLargestResult(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	p.startAlarm(reactors.AlarmConfig{ErrorBackoff: time.Millisecond}, nil)
	parent := p.schedule(alSpec{})
	child := p.schedule(alSpec{parent: &parent})
	p.exec(child.TaskID, aggregate.RecordResult{Result: largest("s")})
	alEventually(t, "the parent heard", func() bool {
		s, _ := p.engine.Task(parent.TaskID)
		return s.MailIndex(events.ChildResultID(child.TaskID)) == 1 && p.engine.TimerLen(projections.Report) == 0
	})
	r := reportIn(t, p.history(parent.TaskID), child.TaskID)
	if !r.Truncated || r.TaskID != child.TaskID {
		t.Fatalf("report %+v, want a truncated report naming %s", r, child.TaskID)
	}
}

// TestAlarmPermanentFailure: an action that can never succeed is tried
// once, counted as a permanent failure and parked, not retried in a loop,
// while the alarm goes on with other work. A child whose 64-character id
// makes the report's message id invalid is such an action.
func TestAlarmPermanentFailure(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	var mu sync.Mutex
	outcomes := map[string]int{}
	p.startAlarm(reactors.AlarmConfig{ErrorBackoff: time.Millisecond, Observe: func(tm projections.Timer, _ time.Duration, err error) {
		if tm != projections.Report {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			outcomes["ok"]++
		case reactors.IsPermanent(err):
			outcomes["permanent"]++
		default:
			outcomes["other"]++
		}
	}}, nil)
	count := func(k string) int {
		mu.Lock()
		defer mu.Unlock()
		return outcomes[k]
	}
	parent := p.schedule(alSpec{})
	longID := strings.Repeat("L", 64)
	spec := events.TaskSpec{RootID: parent.TaskID, ParentID: parent.TaskID, Queue: "q", TimeoutSeconds: 60}
	if _, _, err := p.store.Execute(context.Background(), longID, "", aggregate.Schedule{TaskID: longID, CustomerID: "cust", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	p.exec(longID, aggregate.Cancel{Reason: "done"})
	alEventually(t, "the report failed for good", func() bool { return count("permanent") == 1 })

	// The alarm keeps working: other children report, each waking it
	// for more rounds, and the parked report is not tried again.
	for range 5 {
		c := p.schedule(alSpec{parent: &parent})
		p.exec(c.TaskID, aggregate.Cancel{Reason: "done"})
		alEventually(t, "report of "+c.TaskID, func() bool {
			s, _ := p.engine.Task(parent.TaskID)
			return s.MailIndex(events.ChildResultID(c.TaskID)) > 0
		})
	}
	if n, other := count("permanent"), count("other"); n != 1 || other != 0 {
		t.Fatalf("the failing report was tried %d times (and failed %d times otherwise), want once", n, other)
	}
	if got := p.engine.TimerLen(projections.Report); got != 1 {
		t.Fatalf("report queue holds %d, want the parked report only", got)
	}
}

// TestAlarmBareReport: when the log refuses even the cut report (its
// events are capped below a mailbox message), the status alone is
// reported, so the parent still hears.
func TestAlarmBareReport(t *testing.T) {
	t.Parallel()
	ns := testnats.NewNamespace(t)
	writer := alStart(t, ns)
	parent := writer.schedule(alSpec{})
	child := writer.schedule(alSpec{parent: &parent})
	writer.exec(child.TaskID, aggregate.RecordResult{Result: largest("s")})
	// From here on the stream takes events of at most 8 KiB.
	capped := alStart(t, ns, func(c *store.Config) { c.MaxEventBytes = 8 << 10 })
	capped.startAlarm(reactors.AlarmConfig{ErrorBackoff: time.Millisecond}, nil)
	alEventually(t, "the parent heard", func() bool {
		s, _ := capped.engine.Task(parent.TaskID)
		return s.MailIndex(events.ChildResultID(child.TaskID)) == 1
	})
	r := reportIn(t, capped.history(parent.TaskID), child.TaskID)
	if want := (events.ChildResult{TaskID: child.TaskID, Status: string(aggregate.StatusFailed), Truncated: true}); r.TaskID != want.TaskID ||
		r.Status != want.Status || !r.Truncated || r.Result != nil {
		t.Fatalf("report %+v, want %+v", r, want)
	}
}
