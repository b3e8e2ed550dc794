package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestTurnResume stops a worker while four tools of Turn 2 are in
// flight, each with another recovery rule, and starts a new one: Turn 1
// is skipped, Turn 2 runs again and its Record and Dispatch calls answer
// from the saved Run.
func TestTurnResume(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	const queue = "turns"
	var (
		mu      sync.Mutex
		calls   = map[string]int{} // "turn1", "do:<tool>", "lookup:<tool>"
		records []string           // texts Turn 2's Record answered with
	)
	count := func(what string) {
		mu.Lock()
		calls[what]++
		mu.Unlock()
	}
	tools := []struct {
		call   api.ToolCall
		lookup bool
		found  bool
	}{
		{api.ToolCall{ID: "looked", Name: "open_pr"}, true, true},
		{api.ToolCall{ID: "missed", Name: "open_pr"}, true, false},
		{api.ToolCall{ID: "again", Name: "read_file", Idempotent: true}, false, false},
		{api.ToolCall{ID: "blind", Name: "push"}, false, false},
	}
	inFlight := make(chan string, len(tools))
	handler := func(first bool) executor.Handler {
		return func(ctx context.Context, run *executor.Run) (string, error) {
			err := run.Turn(ctx, func(t *executor.Turn) error {
				count("turn1")
				_, err := t.Dispatch(ctx, api.ToolCall{Name: "ls"}, func(context.Context) (json.RawMessage, error) {
					count("do:ls")
					return json.RawMessage(`["a.go"]`), nil
				}, nil)
				return err
			})
			if err != nil {
				return "", err
			}
			var settled []api.ToolCall
			err = run.Turn(ctx, func(t *executor.Turn) error {
				answer := "second answer"
				if first {
					answer = "first answer"
				}
				it, err := t.Record(ctx, api.TranscriptItem{Kind: api.ItemModelOutput, Content: text(answer)})
				if err != nil {
					return err
				}
				mu.Lock()
				records = append(records, it.Content[0].Text)
				mu.Unlock()
				g, gctx := errgroup.WithContext(ctx)
				settled = make([]api.ToolCall, len(tools))
				for i, tool := range tools {
					g.Go(func() error {
						var lookup executor.ToolLookup
						if tool.lookup {
							lookup = func(context.Context) (json.RawMessage, bool, error) {
								count("lookup:" + tool.call.ID)
								return json.RawMessage(`"found"`), tool.found, nil
							}
						}
						c, err := t.Dispatch(gctx, tool.call, func(ctx context.Context) (json.RawMessage, error) {
							count("do:" + tool.call.ID)
							if first {
								inFlight <- tool.call.ID
								return nil, wkBlock(ctx)
							}
							return json.RawMessage(`"done"`), nil
						}, lookup)
						settled[i] = c
						return err
					})
				}
				return g.Wait()
			})
			if err != nil {
				return "", err
			}
			for _, c := range settled {
				if c.Status != api.ToolOK && c.Status != api.ToolUncertain {
					return "", errors.New("tool " + c.ID + " settled " + c.Status)
				}
			}
			return "resumed", nil
		}
	}
	first := e.start(t, e.httpCfg(queue, "exec-turns"), handler(true))
	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("work")})
	for range tools {
		wkRecv(t, "tool in flight", inFlight)
	}
	first.stop(t)
	d, ok := e.runOf(t, task.ID)
	if !ok || d.Run.Turn != 2 || len(d.Run.PendingTools) != len(tools) {
		t.Fatalf("Run after the stop: %+v, %v; want turn 2 with %d tools pending", d.Run, ok, len(tools))
	}

	e.start(t, e.httpCfg(queue, "exec-turns"), handler(false))
	done := e.waitStatus(t, task.ID, "succeeded")
	if done.Result.Summary != "resumed" {
		t.Fatalf("result %+v", done.Result)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"turn1": 1, "do:ls": 1, "do:looked": 1, "lookup:looked": 1, "do:missed": 2, "lookup:missed": 1, "do:again": 2, "do:blind": 1}
	if !maps.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if !slices.Equal(records, []string{"first answer", "first answer"}) {
		t.Errorf("Turn 2's Record answered %v; want the saved first answer both times", records)
	}
	d, _ = e.runOf(t, task.ID)
	for id, status := range map[string]string{"t1.c1": api.ToolOK, "looked": api.ToolOK, "missed": api.ToolOK, "again": api.ToolOK, "blind": api.ToolUncertain} {
		if got := toolStatus(d.Run, id); got != status {
			t.Errorf("tool %s settled %q, want %q", id, got, status)
		}
	}
	if d.Run.Turn != 2 || len(d.Run.PendingTools) != 0 || !slices.Contains(wkItemIDs(d.Run.Transcript), "t2.end") {
		t.Errorf("final Run %+v", d.Run)
	}
}

// TestTurnMailboxAtBoundary sends a message while a tool runs: the run
// receives it then, but it joins the transcript only when the Turn ends.
func TestTurnMailboxAtBoundary(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	type seen struct {
		midTool, afterTurn []string
		err                error
	}
	got := make(chan seen, 1)
	e.start(t, e.httpCfg("mail-turns", "exec-mt"), func(ctx context.Context, run *executor.Run) (string, error) {
		var s seen
		s.err = run.Turn(ctx, func(t *executor.Turn) error {
			_, err := t.Dispatch(ctx, api.ToolCall{Name: "ask"}, func(ctx context.Context) (json.RawMessage, error) {
				if _, err := e.client.AppendMail(ctx, run.Task.ID, events.Message{ID: "m1", Content: text("also this")}); err != nil {
					return nil, err
				}
				if err := run.Check(ctx); err != nil { // hands m1 to the run
					return nil, err
				}
				s.midTool = wkItemIDs(run.State().Transcript)
				return json.RawMessage(`{}`), nil
			}, nil)
			return err
		})
		s.afterTurn = wkItemIDs(run.State().Transcript)
		got <- s
		return "", s.err
	})
	e.schedule(t, api.ScheduleRequest{Queue: "mail-turns", Message: wkText("x")})
	s := wkRecv(t, "turn", got)
	if s.err != nil {
		t.Fatal(s.err)
	}
	if !slices.Equal(s.midTool, []string{"t1.c1"}) {
		t.Errorf("transcript during the tool call %v, want [t1.c1] (m1 waits for the boundary)", s.midTool)
	}
	if want := []string{"t1.c1", "t1.c1.result", "t1.end", "m1"}; !slices.Equal(s.afterTurn, want) {
		t.Errorf("transcript after the Turn %v, want %v", s.afterTurn, want)
	}
}

// TestRunContextsAndPhase saves a context twice and a phase: versions
// count up, and the scheduler's Run document has them.
func TestRunContextsAndPhase(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	type out struct {
		versions []int
		err      error
	}
	got := make(chan out, 1)
	e.start(t, e.httpCfg("contexts", "exec-cx"), func(ctx context.Context, run *executor.Run) (string, error) {
		var o out
		for _, v := range []string{"issue #1", "issue #1, edited"} {
			c, err := run.SaveContext(ctx, "issue", map[string]string{"body": v})
			if err != nil {
				o.err = err
				break
			}
			o.versions = append(o.versions, c.Version)
		}
		if o.err == nil {
			o.err = run.SetPhase(ctx, "reviewing")
		}
		if c, ok := run.Context("issue"); o.err == nil && (!ok || c.Version != 2) {
			o.err = errors.New("Context does not have version 2")
		}
		got <- o
		return "", o.err
	})
	task := e.schedule(t, api.ScheduleRequest{Queue: "contexts", Message: wkText("x")})
	o := wkRecv(t, "contexts saved", got)
	if o.err != nil || !slices.Equal(o.versions, []int{1, 2}) {
		t.Fatalf("versions %v, %v", o.versions, o.err)
	}
	e.waitStatus(t, task.ID, "succeeded")
	d, ok := e.runOf(t, task.ID)
	c := d.Run.Contexts["issue"]
	if !ok || d.Run.Phase != "reviewing" || c.Version != 2 || string(c.Value) != `{"body":"issue #1, edited"}` || c.SavedAt.IsZero() {
		t.Fatalf("Run %+v", d)
	}
}

// TestRunSuperseded: a save the scheduler refuses because the claim no
// longer holds the task stops the run, and nothing more is saved; a stale
// revision under the same claim (an earlier process saved) is read again
// and saved over.
func TestRunSuperseded(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	const queue, executorID = "superseded", "exec-sup"
	type out struct {
		stale, refused, after error
		reason                string
		otherRev              uint64 // the revision the other writer saved
	}
	got := make(chan out, 1)
	cfg := e.httpCfg(queue, executorID)
	cfg.CheckInterval = time.Hour // no background check: the save meets the cancel first
	e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		var o out
		defer func() { got <- o }()
		if o.stale = run.SetPhase(ctx, "one"); o.stale != nil {
			return "", o.stale
		}
		// Another writer of the same claim (an earlier process) saves.
		other := executor.NewSchedulerRuns(e.client, queue, executorID)
		cp, _, err := other.Load(ctx, run.Task.ID)
		if err != nil {
			o.stale = err
			return "", err
		}
		cp.Phase = "other"
		if o.stale = other.Save(ctx, cp); o.stale != nil {
			return "", o.stale
		}
		mid, err := e.client.GetRun(ctx, run.Task.ID)
		if err == nil && mid.Run.Phase != "other" {
			err = errors.New("the other writer's save is not stored: phase " + mid.Run.Phase)
		}
		if o.stale = err; err != nil {
			return "", err
		}
		o.otherRev = mid.Revision
		if o.stale = run.SetPhase(ctx, "two"); o.stale != nil {
			return "", o.stale
		}
		// The task ends under the run's feet: the next save is refused.
		if _, err := e.client.Cancel(ctx, run.Task.ID, "gone"); err != nil {
			o.refused = err
			return "", err
		}
		o.refused = run.SetPhase(ctx, "three")
		o.after = run.SetPhase(ctx, "four")
		o.reason = run.StopReason()
		return "", o.refused
	})
	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("x")})
	o := wkRecv(t, "handler", got)
	if o.stale != nil {
		t.Fatalf("save after another save of the same claim: %v", o.stale)
	}
	if !errors.Is(o.refused, executor.ErrStopped) || !errors.Is(o.refused, executor.ErrSuperseded) || !errors.Is(o.after, executor.ErrStopped) || o.reason != executor.ReasonSuperseded {
		t.Fatalf("saves after the cancel: %v, then %v, reason %q; want ErrStopped (superseded)", o.refused, o.after, o.reason)
	}
	e.waitStatus(t, task.ID, "canceled")
	if d, ok := e.runOf(t, task.ID); !ok || d.Run.Phase != "two" || d.Revision <= o.otherRev {
		t.Fatalf("Run %+v, want phase two saved over the other writer's revision %d", d, o.otherRev)
	}
}

// TestExampleAgent runs ExampleRun_Turn's handler: two Turns, the first
// with a tool call, and the model's answer as the result.
func TestExampleAgent(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	e.start(t, e.httpCfg("agents", "agent-1"), agent)
	task := e.schedule(t, api.ScheduleRequest{Queue: "agents", Message: wkText("find the bug")})
	done := e.waitStatus(t, task.ID, "succeeded")
	if done.Result.Summary != `fixed the bug at "main.go:12"` {
		t.Fatalf("result %+v", done.Result)
	}
	d, _ := e.runOf(t, task.ID)
	if want := []string{"t1.i1", "t1.i2", "t1.c1", "t1.c1.result", "t1.end", "t2.i1", "t2.i2", "t2.end"}; !slices.Equal(wkItemIDs(d.Run.Transcript), want) {
		t.Fatalf("transcript %v, want %v", wkItemIDs(d.Run.Transcript), want)
	}
}

// TestSchedulerRunsList finds the running tasks of the queue claimed by
// the store's executor, with their saved Run or an empty one.
func TestSchedulerRunsList(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	claim := func(executorID string) api.Task {
		t.Helper()
		e.schedule(t, api.ScheduleRequest{Queue: "listed", Message: wkText("x")})
		task, ok, err := e.client.ClaimNext(ctx, "listed", executorID, 10*time.Second)
		if err != nil || !ok {
			t.Fatalf("claim: %v, %v", ok, err)
		}
		return task
	}
	saved, empty, other := claim("exec-a"), claim("exec-a"), claim("exec-b")
	a := executor.NewSchedulerRuns(e.client, "listed", "exec-a")
	if err := a.Save(ctx, executor.Checkpoint{TaskID: saved.ID, DeliveryID: saved.Claim.DeliveryID, RunState: api.RunState{ExecutorID: "exec-a", Phase: "x"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Save(ctx, executor.Checkpoint{TaskID: empty.ID, DeliveryID: empty.Claim.DeliveryID, RunState: api.RunState{ExecutorID: "exec-a"}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.runOf(t, empty.ID); ok {
		t.Fatal("an empty Run was written")
	}
	got, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]executor.Checkpoint{}
	for _, cp := range got {
		byID[cp.TaskID] = cp
	}
	if len(got) != 2 || byID[saved.ID].Phase != "x" || byID[saved.ID].DeliveryID != saved.Claim.DeliveryID ||
		byID[empty.ID].DeliveryID != empty.Claim.DeliveryID || byID[empty.ID].ExecutorID != "exec-a" {
		t.Fatalf("List = %+v; want %s (phase x) and %s (empty), not %s", got, saved.ID, empty.ID, other.ID)
	}
}
