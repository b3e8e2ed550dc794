package replay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// lineageLog is the log TestHistory reads: a root that gets mail, reads
// it, delegates to a child whose result comes back to its mailbox, and is
// canceled; a grandchild still waiting; an unrelated task of another
// customer.
type lineageLog struct {
	js                    jetstream.JetStream
	ns                    testnats.Namespace
	root, child, grand    string
	rootClaim, childClaim string
	other                 string
}

func buildLineage(t *testing.T) *lineageLog {
	t.Helper()
	r := testnode.Start(t)
	svc, op, ctx := r.Service, scheduler.Operator, context.Background()
	const queue = "hist"
	queued := func(id string) {
		testnode.Eventually(t, id+" queued", func() bool {
			st, err := svc.Get(ctx, op, id)
			return err == nil && st.Status == aggregate.StatusQueued
		})
	}
	claim := func(id, executor string) string {
		queued(id) // so ReadyPublished lands before the claim
		st, ok, err := svc.ClaimNext(ctx, op, queue, executor, 10*time.Second)
		if err != nil || !ok || st.TaskID != id {
			t.Fatalf("claims/next by %s: got %s ok %v err %v, want %s", executor, st.TaskID, ok, err, id)
		}
		return st.Claim.DeliveryID
	}
	schedule := func(parent, cust, msg string, delay float64) string {
		st, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{CustomerID: cust, ParentID: parent, Queue: queue, Message: text(msg), DelaySeconds: &delay})
		if err != nil {
			t.Fatal(err)
		}
		return st.TaskID
	}
	l := &lineageLog{ns: r.NS}
	l.root = schedule("", "acme", "investigate the flaky test", 0)
	l.rootClaim = claim(l.root, "exec-root")
	if _, _, err := svc.AppendMail(ctx, op, l.root, events.Message{ID: "follow-up-1", Content: text("also check the retry path").Content}); err != nil {
		t.Fatal(err)
	}
	if c, err := svc.Check(ctx, op, l.root, l.rootClaim); err != nil || len(c.Messages) != 1 {
		t.Fatalf("check: %+v %v", c, err)
	}
	l.child = schedule(l.root, "acme", "reproduce it", 0)
	l.childClaim = claim(l.child, "exec-child")
	l.grand = schedule(l.child, "acme", "dig deeper", 3600)
	if _, err := svc.ReportEffects(ctx, op, l.child, l.childClaim, []events.Effect{
		{Kind: "pull_request", Ref: "#12", Uncertain: true}, {Kind: "comment", Ref: "c-7"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.RecordResult(ctx, op, l.child, l.childClaim, events.Result{
		Success: true, Summary: "found the race",
		Effects: []events.Effect{{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12"}},
	}); err != nil {
		t.Fatal(err)
	}
	testnode.Eventually(t, "child result in the root's mailbox", func() bool {
		st, err := r.Store.Load(ctx, l.root)
		return err == nil && st.MailIndex(events.ChildResultID(l.child)) > 0
	})
	if _, err := svc.Cancel(ctx, op, l.root, "done by hand"); err != nil {
		t.Fatal(err)
	}
	l.other = schedule("", "other", "unrelated", 3600)
	r.Stop()
	js, err := jetstream.New(r.NC)
	if err != nil {
		t.Fatal(err)
	}
	l.js = js
	return l
}

func (l *lineageLog) history(t *testing.T, id string) []events.Event {
	t.Helper()
	evs, err := logOf(l.js, l.ns).Task(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func seqs(evs []events.Event) []events.Position {
	out := make([]events.Position, len(evs))
	for i, ev := range evs {
		out[i] = ev.Seq
	}
	return out
}

// step is what one timeline entry must say.
type step struct {
	typ    events.Type
	status aggregate.Status
	detail []string // substrings of Detail
}

func checkTimeline(t *testing.T, what string, entries []replay.Entry, want []step) {
	t.Helper()
	if len(entries) != len(want) {
		for _, e := range entries {
			t.Logf("%d %s %s %s", e.Seq, e.Type, e.Status, e.Detail)
		}
		t.Fatalf("%s: %d entries, want %d", what, len(entries), len(want))
	}
	for i, w := range want {
		e := entries[i]
		if e.Type != string(w.typ) || e.Status != string(w.status) {
			t.Errorf("%s entry %d: %s → %s, want %s → %s", what, i, e.Type, e.Status, w.typ, w.status)
		}
		for _, sub := range w.detail {
			if !strings.Contains(e.Detail, sub) {
				t.Errorf("%s entry %d (%s): detail %q does not mention %q", what, i, e.Type, e.Detail, sub)
			}
		}
		if i > 0 && e.Seq <= entries[i-1].Seq {
			t.Errorf("%s entry %d: seq %d after %d", what, i, e.Seq, entries[i-1].Seq)
		}
	}
}

func TestHistory(t *testing.T) {
	t.Parallel()
	l := buildLineage(t)
	ctx := context.Background()
	rootEntries := replay.Timeline(l.history(t, l.root))

	t.Run("RootTimeline", func(t *testing.T) {
		checkTimeline(t, "root", rootEntries, []step{
			{events.TypeTaskScheduled, aggregate.StatusScheduled, []string{"queue hist", "timeout 3600s", "investigate the flaky test",
				"released, delivery " + l.rootClaim + " attempt 1"}}, // due at once: released in the same event
			{events.TypeReadyPublished, aggregate.StatusQueued, []string{l.rootClaim}},
			{events.TypeClaimed, aggregate.StatusRunning, []string{"claimed by exec-root with delivery " + l.rootClaim, "deadline"}},
			{events.TypeMailboxAppended, aggregate.StatusRunning, []string{"mailbox #1 (follow-up-1): also check the retry path"}},
			{events.TypeMailboxRead, aggregate.StatusRunning, []string{"messages up to #1 handed out"}},
			{events.TypeMailboxAppended, aggregate.StatusRunning, []string{"mailbox #2 (" + events.ChildResultID(l.child) + ")", l.child, "found the race"}},
			{events.TypeCanceled, aggregate.StatusCanceled, []string{"canceled: done by hand"}},
		})
		if a := rootEntries[2].Actor; a != "exec-root" {
			t.Errorf("claim actor %q, want exec-root", a)
		}
		for _, e := range rootEntries {
			if e.TaskID != l.root || e.Data == nil || e.At.Location() != time.UTC {
				t.Errorf("entry %d: task %s, data %v, at %v", e.Seq, e.TaskID, e.Data, e.At)
			}
		}
	})

	t.Run("ChildTimeline", func(t *testing.T) {
		checkTimeline(t, "child", replay.Timeline(l.history(t, l.child)), []step{
			{events.TypeTaskScheduled, aggregate.StatusScheduled, []string{"parent " + l.root, "reproduce it", "released, delivery " + l.childClaim}},
			{events.TypeReadyPublished, aggregate.StatusQueued, nil},
			{events.TypeClaimed, aggregate.StatusRunning, []string{"claimed by exec-child", l.childClaim}},
			{events.TypeEffectsReported, aggregate.StatusRunning, []string{"reported 2 effects: pull_request #12 (uncertain), comment c-7"}},
			{events.TypeResultRecorded, aggregate.StatusSucceeded, []string{"success: found the race", "effect pull_request #12 https://example.com/pr/12"}},
		})
	})

	t.Run("WriteText", func(t *testing.T) {
		var buf bytes.Buffer
		if err := replay.WriteText(&buf, rootEntries, false); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
		if f := strings.Fields(lines[0]); !slices.Equal(f, []string{"SEQ", "+TIME", "EVENT", "STATUS", "ACTOR", "DETAIL"}) {
			t.Fatalf("header %q", lines[0])
		}
		for i, e := range rootEntries {
			f := strings.Fields(lines[1+i])
			rel := "+" + e.At.Sub(rootEntries[0].At).Round(time.Millisecond).String()
			if len(f) < 4 || f[0] != fmt.Sprint(e.Seq) || f[1] != rel || f[2] != e.Type || f[3] != e.Status {
				t.Errorf("line %q, want seq %d %s %s %s", lines[1+i], e.Seq, rel, e.Type, e.Status)
			}
			if !strings.Contains(lines[1+i], e.Detail) {
				t.Errorf("line %q lacks detail %q", lines[1+i], e.Detail)
			}
		}
		if !strings.HasPrefix(strings.Fields(lines[1])[1], "+0s") {
			t.Errorf("first entry is not at +0s: %q", lines[1])
		}
		if last := lines[len(lines)-1]; last != "first event at "+rootEntries[0].At.Format(time.RFC3339Nano) {
			t.Errorf("last line %q", last)
		}

		buf.Reset()
		tree := replay.Timeline(l.lineage(t, l.child))
		if err := replay.WriteText(&buf, tree, true); err != nil {
			t.Fatal(err)
		}
		lines = strings.Split(buf.String(), "\n")
		if f := strings.Fields(lines[0]); len(f) < 3 || f[2] != "TASK" {
			t.Fatalf("header with tasks %q", lines[0])
		}
		for i, e := range tree {
			if f := strings.Fields(lines[1+i]); len(f) < 5 || f[2] != e.TaskID || f[4] != e.Status {
				t.Errorf("tree line %q, want task %s status %s", lines[1+i], e.TaskID, e.Status)
			}
		}

		buf.Reset()
		if err := replay.WriteText(&buf, nil, false); err != nil || strings.TrimSpace(buf.String()) != "SEQ  +TIME  EVENT  STATUS  ACTOR  DETAIL" {
			t.Errorf("empty timeline: %q %v", buf.String(), err)
		}
	})

	t.Run("WriteNDJSON", func(t *testing.T) {
		var buf bytes.Buffer
		if err := replay.WriteNDJSON(&buf, rootEntries); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
		if len(lines) != len(rootEntries) {
			t.Fatalf("%d lines for %d entries", len(lines), len(rootEntries))
		}
		for i, line := range lines {
			var got struct {
				Seq    *uint64        `json:"seq"`
				At     time.Time      `json:"at"`
				TaskID string         `json:"taskId"`
				Type   string         `json:"type"`
				Status string         `json:"status"`
				Detail string         `json:"detail"`
				Data   map[string]any `json:"data"`
			}
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatalf("line %d %q: %v", i, line, err)
			}
			e := rootEntries[i]
			if got.Seq == nil || *got.Seq != uint64(e.Seq) || got.Type != e.Type || got.Status != e.Status || got.TaskID != e.TaskID ||
				got.Detail != e.Detail || !got.At.Equal(e.At) || got.Data == nil {
				t.Errorf("line %d %q does not match entry %+v", i, line, e)
			}
		}
	})

	t.Run("LineageHistory", func(t *testing.T) {
		var want []events.Position
		for _, id := range []string{l.root, l.child, l.grand} {
			want = append(want, seqs(l.history(t, id))...)
		}
		slices.Sort(want)
		for _, from := range []string{l.root, l.child, l.grand} {
			got := l.lineage(t, from)
			if !slices.Equal(seqs(got), want) {
				t.Fatalf("lineage from %s: seqs %v, want %v", from, seqs(got), want)
			}
		}
		// Interleaved, not concatenated: the child's events fall between
		// the root's claim and its cancel.
		root, child := l.history(t, l.root), l.history(t, l.child)
		if !(root[3].Seq < child[0].Seq && child[len(child)-1].Seq < root[len(root)-1].Seq) {
			t.Fatalf("root %v and child %v are not interleaved", seqs(root), seqs(child))
		}
		if evs, err := logOf(l.js, l.ns).LineageOf(ctx, events.NewID()); err != nil || evs != nil {
			t.Fatalf("lineage of an unknown task: %v %v", evs, err)
		}
		if evs := l.lineage(t, l.other); len(evs) != 1 || evs[0].TaskID != l.other {
			t.Fatalf("lineage of the unrelated task: %v", seqs(evs))
		}
	})

	t.Run("CustomerEventsSince", func(t *testing.T) {
		customer := func(id string, since time.Time) []events.Event {
			var evs []events.Event
			if err := logOf(l.js, l.ns).Customer(ctx, id, since, func(ev events.Event) error {
				evs = append(evs, ev)
				return nil
			}, nil); err != nil {
				t.Fatal(err)
			}
			return evs
		}
		all := customer("acme", time.Time{})
		if !slices.Equal(seqs(all), seqs(l.lineage(t, l.root))) {
			t.Fatalf("acme's events %v are not its lineage's", seqs(all))
		}
		// From the time the root's mailbox was read: what was stored at
		// or after it, by the stream's own timestamps.
		msgs, _ := readAll(t, l.js, l.ns.Stream)
		stored := map[events.Position]time.Time{}
		for _, m := range msgs {
			stored[m.Pos] = m.Time
		}
		since := stored[rootEntries[5].Seq]
		var want []events.Position
		for _, ev := range all {
			if !stored[ev.Seq].Before(since) {
				want = append(want, ev.Seq)
			}
		}
		got := customer("acme", since)
		if !slices.Equal(seqs(got), want) || len(want) == 0 || len(want) == len(all) {
			t.Fatalf("acme since %s: %v, want %v (of %v)", since, seqs(got), want, seqs(all))
		}
		if got := customer("acme", time.Now().Add(time.Hour)); len(got) != 0 {
			t.Fatalf("events from the future: %v", seqs(got))
		}
		if got := customer("nobody", time.Time{}); len(got) != 0 {
			t.Fatalf("events of an unknown customer: %v", seqs(got))
		}
		// A tracker fed the customer's stream gives the same statuses
		// as the per-task timelines.
		tr := replay.NewStatusTracker()
		status := map[string]string{}
		for _, ev := range all {
			e := tr.Entry(ev)
			status[e.TaskID] = e.Status
		}
		if status[l.root] != "canceled" || status[l.child] != "succeeded" || status[l.grand] != "scheduled" {
			t.Fatalf("statuses %v", status)
		}
	})
}

func (l *lineageLog) lineage(t *testing.T, id string) []events.Event {
	t.Helper()
	evs, err := logOf(l.js, l.ns).LineageOf(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestHistoryOfDeliveryOutcomes covers the events a node rarely writes
// under test: a delivery retry, an exhausted delivery, an admission
// rejection and a timeout, written with the store directly.
func TestHistoryOfDeliveryOutcomes(t *testing.T) {
	t.Parallel()
	p := newPlantLog(t)
	ctx := context.Background()
	timeline := func(id string) []replay.Entry {
		evs, err := logOf(p.js, p.ns).Task(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return replay.Timeline(evs)
	}
	ts := func(at time.Time) string { return at.UTC().Format(time.RFC3339Nano) }

	retried := p.scheduled("acme")
	retried, _ = p.exec(retried.TaskID, aggregate.ReleaseDue{DeliveryID: events.NewID()})
	d := retried.Delivery.ID
	next := p.clock().Add(1500 * time.Millisecond)
	p.exec(retried.TaskID, aggregate.RetryDelivery{DeliveryID: d, NextAt: next, Error: "nats: no responders available"})
	p.exec(retried.TaskID, aggregate.MarkReadyPublished{DeliveryID: d, ReadySeq: 3})
	p.exec(retried.TaskID, aggregate.RepublishReady{DeliveryID: d, LostSeq: 3, ReadySeq: 9})
	checkTimeline(t, "retried", timeline(retried.TaskID), []step{
		{events.TypeTaskScheduled, aggregate.StatusScheduled, []string{"queue q", "timeout 60s", "planted"}},
		{events.TypeDeliveryPending, aggregate.StatusScheduled, []string{"released; delivery " + d + " attempt 1"}},
		{events.TypeDeliveryRetryScheduled, aggregate.StatusScheduled, []string{"publish failed (nats: no responders available); attempt 2 at " + ts(next)}},
		{events.TypeReadyPublished, aggregate.StatusQueued, []string{d}},
		{events.TypeReadyRepublished, aggregate.StatusQueued, []string{"delivery " + d + " was lost (at 3); published again at 9"}},
	})

	exhausted := p.scheduled("acme")
	exhausted, _ = p.exec(exhausted.TaskID, aggregate.ReleaseDue{DeliveryID: events.NewID()})
	p.exec(exhausted.TaskID, aggregate.RetryDelivery{DeliveryID: exhausted.Delivery.ID, NextAt: p.clock(), Error: "timeout"})
	p.exec(exhausted.TaskID, aggregate.ExhaustDelivery{DeliveryID: exhausted.Delivery.ID, Reason: "not published"})
	entries := timeline(exhausted.TaskID)
	checkTimeline(t, "exhausted", entries[3:], []step{
		{events.TypeDeliveryExhausted, aggregate.StatusFailed, []string{"gave up after 2 attempts: not published"}},
	})

	rejectedID := events.NewID()
	p.exec(rejectedID, aggregate.Reject{TaskID: rejectedID, CustomerID: "acme", Spec: events.TaskSpec{RootID: rejectedID, Queue: "q", TimeoutSeconds: 60}, Reason: "quota: 1 active root tasks, at most 1"})
	checkTimeline(t, "rejected", timeline(rejectedID), []step{
		{events.TypeAdmissionRejected, aggregate.StatusCanceled, []string{"rejected by admission: quota: 1 active root tasks"}},
	})
	// A rejected root is its own lineage (history --tree of it).
	lineage, err := logOf(p.js, p.ns).LineageOf(ctx, rejectedID)
	if err != nil || len(lineage) != 1 || lineage[0].TaskID != rejectedID {
		t.Fatalf("lineage of a rejected root: %v %v", seqs(lineage), err)
	}

	expired := p.running("acme")
	p.advance(2 * time.Minute)
	p.exec(expired.TaskID, aggregate.TimeOut{})
	entries = timeline(expired.TaskID)
	checkTimeline(t, "expired", entries[4:], []step{
		{events.TypeTimedOut, aggregate.StatusTimedOut, []string{"running deadline " + ts(expired.Deadline) + " passed"}},
	})
	if rel := entries[4].At.Sub(entries[0].At); rel < 2*time.Minute {
		t.Fatalf("timeout %s after the schedule, want at least 2m", rel)
	}
}

// A retry's line says which attempt ended how, with its error and
// effects, and when the next is due; the schedule's line shows the policy.
func TestDescribeRetry(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		p    events.Payload
		want string
	}{
		{events.RetryScheduled{Attempt: 2, NextAt: at, Cause: events.RetryOnFailed, Result: &events.Result{Error: "tests\nfailed", Effects: []events.Effect{{Kind: "comment", Ref: "c1"}}}},
			"attempt 1 failed: tests failed; effect comment c1; attempt 2 at 2026-05-01T12:00:00Z"},
		{events.RetryScheduled{Attempt: 3, NextAt: at, Cause: events.RetryOnTimedOut, Deadline: at},
			"attempt 2 timed out; attempt 3 at 2026-05-01T12:00:00Z"},
		{events.TaskScheduled{Spec: events.TaskSpec{Queue: "q", RunAt: at, TimeoutSeconds: 60, Retry: &events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: 10, MaxBackoffSeconds: 3600, On: []string{"failed", "timed_out"}}}},
			"queue q, run at 2026-05-01T12:00:00Z, timeout 60s, up to 3 attempts (backoff 10s..3600s, on failed,timed_out)"},
		{events.TaskScheduled{Spec: events.TaskSpec{Queue: "q", RunAt: at, TimeoutSeconds: 60, Kind: "resize", Payload: []byte(`{"w":640}`)}},
			"queue q, run at 2026-05-01T12:00:00Z, timeout 60s, kind resize, payload 9 bytes"},
		{events.ResultRecorded{Result: events.Result{Success: true, Summary: "done", Output: []byte(`[1,2]`)}},
			"success: done; output 5 bytes"},
	} {
		if got := replay.Describe(events.Event{Data: tc.p}); got != tc.want {
			t.Errorf("Describe(%T) = %q, want %q", tc.p, got, tc.want)
		}
	}
}
