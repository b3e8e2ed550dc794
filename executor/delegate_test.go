package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestWorkerDelegation retries one delegation five times and gets one
// child; Await hands back the child's result once another worker has run
// it, and the child's success leaves the parent running until its own
// handler returns.
func TestWorkerDelegation(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()

	type delegated struct {
		ids []string
		err error
	}
	type awaited struct {
		res events.ChildResult
		err error
	}
	delegatedCh := make(chan delegated, 1)
	treeChecked := make(chan struct{})
	awaitedCh := make(chan awaited, 1)
	release := make(chan struct{})
	e.start(t, e.httpCfg("parents", "exec-p"), func(ctx context.Context, run *executor.Run) (string, error) {
		var d delegated
		var child api.Task
		for range 5 {
			if child, d.err = run.Delegate(ctx, "review", api.ScheduleRequest{Queue: "reviews", Message: wkText("review it")}); d.err != nil {
				break
			}
			d.ids = append(d.ids, child.ID)
		}
		delegatedCh <- d
		if d.err != nil {
			return "", d.err
		}
		select {
		case <-treeChecked:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		res, err := run.Await(ctx, child.ID)
		awaitedCh <- awaited{res, err}
		if err != nil {
			return "", err
		}
		select {
		case <-release:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if got := run.Checkpoint().Children["review"]; got != child.ID {
			return "", errors.New("checkpoint lacks the delegated child")
		}
		return "parent done", nil
	})
	parent := e.schedule(t, api.ScheduleRequest{Queue: "parents", Message: wkText("delegate")})

	d := wkRecv(t, "delegations", delegatedCh)
	if d.err != nil || len(d.ids) != 5 {
		t.Fatalf("delegated %v, %v", d.ids, d.err)
	}
	for _, id := range d.ids {
		if id != d.ids[0] {
			t.Fatalf("delegation retries made children %v, want one", d.ids)
		}
	}
	childID := d.ids[0]
	tree, err := e.client.Tree(ctx, parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(tree.Children) != 1 || tree.Children[0].Task.ID != childID {
		t.Fatalf("tree of the parent has children %+v, want only %s", tree.Children, childID)
	}
	child := tree.Children[0].Task
	if child.ParentID != parent.ID || child.RootID != parent.RootID || child.Queue != "reviews" {
		t.Fatalf("child %+v", child)
	}
	close(treeChecked)

	e.start(t, e.httpCfg("reviews", "exec-r"), func(ctx context.Context, run *executor.Run) (string, error) {
		return "looks good", nil
	})
	a := wkRecv(t, "await", awaitedCh)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.res.TaskID != childID || a.res.Status != "succeeded" || a.res.Result == nil || a.res.Result.Summary != "looks good" {
		t.Fatalf("awaited %+v", a.res)
	}
	e.waitStatus(t, childID, "succeeded")
	if p, err := e.client.Get(ctx, parent.ID); err != nil || p.Status != "running" {
		t.Fatalf("parent after the child's success: %+v, %v", p, err)
	}
	close(release)
	done := e.waitStatus(t, parent.ID, "succeeded")
	if done.Result == nil || done.Result.Summary != "parent done" {
		t.Fatalf("parent result %+v", done.Result)
	}
	if n := e.countEvents(t, parent.ID, "ResultRecorded"); n != 1 {
		t.Fatalf("parent has %d results", n)
	}
}

// TestAwaitHonoursContextAndTimeout: a child on a queue no executor
// serves never ends; Await gives up at its AwaitTimeout, when its
// context's deadline passes and when its context is cancelled, each
// within a bounded time.
func TestAwaitHonoursContextAndTimeout(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	type awaited struct {
		name string
		err  error
		took time.Duration
	}
	results := make(chan []awaited, 1)
	e.start(t, e.httpCfg("awaiting", "exec-a"), func(ctx context.Context, run *executor.Run) (string, error) {
		child, err := run.Delegate(ctx, "idle", api.ScheduleRequest{Queue: "nobody", Message: wkText("never claimed")})
		if err != nil {
			return "", err
		}
		var out []awaited
		await := func(name string, ctx context.Context, opts ...executor.AwaitOption) {
			start := time.Now()
			_, err := run.Await(ctx, child.ID, opts...)
			out = append(out, awaited{name, err, time.Since(start)})
		}
		await("Timeout", ctx, executor.AwaitTimeout(300*time.Millisecond))
		deadline, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		await("Deadline", deadline)
		cancel()
		canceled, cancel := context.WithCancel(ctx)
		time.AfterFunc(300*time.Millisecond, cancel)
		await("Canceled", canceled)
		done, cancel := context.WithCancel(ctx)
		cancel()
		await("AlreadyDone", done)
		results <- out
		return "gave up", nil
	})
	e.schedule(t, api.ScheduleRequest{Queue: "awaiting", Message: wkText("delegate and wait")})
	for _, a := range wkRecv(t, "awaits", results) {
		var want []error
		switch a.name {
		case "Timeout":
			want = []error{executor.ErrAwaitTimeout, context.DeadlineExceeded}
		case "Deadline":
			want = []error{context.DeadlineExceeded}
		default:
			want = []error{context.Canceled}
		}
		for _, w := range want {
			if !errors.Is(a.err, w) {
				t.Errorf("%s: Await returned %v, want %v", a.name, a.err, w)
			}
		}
		if a.took > 10*time.Second {
			t.Errorf("%s: Await took %v", a.name, a.took)
		}
	}
}

// TestTurnDelegate: a tool call delegated to a child settles with the
// child's result as its tool result, right after the call in the
// transcript; the child's report does not join the transcript again as a
// mailbox message. A delegation that times out settles as timeout.
func TestTurnDelegate(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	type outcome struct {
		review, stuck api.ToolCall
		transcript    []api.TranscriptItem
		err           error
	}
	done := make(chan outcome, 1)
	e.start(t, e.httpCfg("models", "exec-m"), func(ctx context.Context, run *executor.Run) (string, error) {
		var o outcome
		o.err = run.Turn(ctx, func(turn *executor.Turn) error {
			var err error
			if o.review, err = turn.Delegate(ctx, api.ToolCall{Name: "review"}, api.ScheduleRequest{Queue: "reviews", Message: wkText("review it")}); err != nil {
				return err
			}
			o.stuck, err = turn.Delegate(ctx, api.ToolCall{ID: "stuck", Name: "ask"}, api.ScheduleRequest{Queue: "nobody", Message: wkText("nobody answers")},
				executor.AwaitTimeout(200*time.Millisecond))
			return err
		})
		// A later Turn boundary, after more checks: the report stays out.
		if o.err == nil {
			o.err = run.Check(ctx)
		}
		if o.err == nil {
			o.err = run.Turn(ctx, func(*executor.Turn) error { return nil })
		}
		o.transcript = run.State().Transcript
		done <- o
		return "done", o.err
	})
	e.start(t, e.httpCfg("reviews", "exec-r"), func(ctx context.Context, run *executor.Run) (string, error) {
		return "looks good", nil
	})
	e.schedule(t, api.ScheduleRequest{Queue: "models", Message: wkText("delegate as a tool")})
	o := wkRecv(t, "the delegating handler", done)
	if o.err != nil {
		t.Fatal(o.err)
	}
	var res events.ChildResult
	if o.review.ID != "t1.c1" || o.review.Status != api.ToolOK || json.Unmarshal(o.review.Output, &res) != nil ||
		res.Status != "succeeded" || res.Result == nil || res.Result.Summary != "looks good" {
		t.Fatalf("delegated call settled %+v (result %+v)", o.review, res)
	}
	if o.stuck.Status != api.ToolTimeout {
		t.Fatalf("timed-out delegation settled %+v, want timeout", o.stuck)
	}
	want := []string{"t1.c1", "t1.c1.result", "stuck", "stuck.result", "t1.end", "t2.end"}
	got := wkItemIDs(o.transcript)
	if !slices.Equal(got[len(got)-len(want):], want) {
		t.Fatalf("transcript %v, want it to end with %v", got, want)
	}
	for _, it := range o.transcript {
		if it.ID == events.ChildResultID(res.TaskID) {
			t.Fatalf("the child's report joined the transcript too: %v", got)
		}
	}
}
