package executor_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestWorkerResumeFromCheckpoint stops an executor in the middle of step
// "b"; a new worker with the same executor id and checkpoint bucket
// resumes the same claim, skips the finished step "a" and completes.
func TestWorkerResumeFromCheckpoint(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	cps := e.kv(t, "resume")
	const queue, executorID = "resume", "exec-r"

	var aRuns, bRuns atomic.Int32
	inB := make(chan struct{}, 1)
	resumed := make(chan executor.Checkpoint, 1)
	handler := func(blockInB bool) executor.Handler {
		return func(ctx context.Context, run *executor.Run) (string, error) {
			if !blockInB {
				resumed <- run.Checkpoint()
			}
			if err := run.Step(ctx, "a", func(context.Context) error { aRuns.Add(1); return nil }); err != nil {
				return "", err
			}
			err := run.Step(ctx, "b", func(ctx context.Context) error {
				bRuns.Add(1)
				if blockInB {
					inB <- struct{}{}
					return wkBlock(ctx)
				}
				return nil
			})
			if err != nil {
				return "", err
			}
			return "resumed", nil
		}
	}
	first := e.start(t, e.natsCfg(queue, executorID, cps), handler(true))
	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("two steps")})
	wkRecv(t, "step b", inB)
	claimed := e.waitStatus(t, task.ID, "running")
	first.stop(t)

	cp, ok, err := cps.Load(ctx, task.ID)
	if err != nil || !ok {
		t.Fatalf("no checkpoint after the stop: %v", err)
	}
	if cp.Done || !slices.Equal(cp.Steps, []string{"a"}) || cp.DeliveryID != claimed.Claim.DeliveryID || cp.ExecutorID != executorID {
		t.Fatalf("checkpoint after the stop: %+v (claim %+v)", cp, claimed.Claim)
	}
	if still, err := e.client.Get(ctx, task.ID); err != nil || still.Status != "running" || *still.Claim != *claimed.Claim {
		t.Fatalf("task after the stop: %+v, %v", still, err)
	}

	e.start(t, e.natsCfg(queue, executorID, cps), handler(false))
	if got := wkRecv(t, "resumed run", resumed); got.TaskID != task.ID || !slices.Equal(got.Steps, []string{"a"}) {
		t.Fatalf("resumed from %+v", got)
	}
	done := e.waitStatus(t, task.ID, "succeeded")
	if done.Result == nil || done.Result.Summary != "resumed" || *done.Claim != *claimed.Claim {
		t.Fatalf("resumed task: %+v", done)
	}
	if n := e.countEvents(t, task.ID, "Claimed"); n != 1 {
		t.Fatalf("%d claims, want the one resumed", n)
	}
	if a, b := aRuns.Load(), bRuns.Load(); a != 1 || b != 2 {
		t.Fatalf("step a ran %d times, b %d; want 1 and 2", a, b)
	}
	wkEventually(t, "checkpoint of the finished run removed", func() bool {
		_, ok, err := cps.Load(ctx, task.ID)
		return err == nil && !ok
	})
}

// wkRedeliver answers every stop check with the whole mailbox again, as
// an at-least-once delivery of the same messages would.
type wkRedeliver struct{ *api.Client }

func (r wkRedeliver) Check(ctx context.Context, id, deliveryID string) (api.Check, error) {
	c, err := r.Client.Check(ctx, id, deliveryID)
	if err != nil {
		return c, err
	}
	m, err := r.Mailbox(ctx, id, 0)
	if err != nil {
		return c, err
	}
	c.Messages = append(m.Messages, c.Messages...)
	return c, nil
}

// TestWorkerTranscriptDedupe delivers mailbox message "m1" twice at the
// API and again on every stop check: the transcript holds it once, also
// after the run is resumed by a restarted executor.
func TestWorkerTranscriptDedupe(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	cps := e.kv(t, "transcript")
	const queue, executorID = "transcript", "exec-t"
	cfg := e.natsCfg(queue, executorID, cps)
	cfg.API = wkRedeliver{e.client}

	ids := func(items []executor.Item) []string {
		out := make([]string, len(items))
		for i, it := range items {
			out[i] = it.ID
		}
		return out
	}
	type seen struct {
		ids     []string
		content string
	}
	look := func(run *executor.Run) seen {
		items := run.Transcript()
		s := seen{ids: ids(items)}
		if len(items) == 1 && len(items[0].Content) == 1 {
			s.content = items[0].Content[0].Text
		}
		return s
	}
	started := make(chan string, 1)
	appended := make(chan struct{})
	firstSaw := make(chan seen, 1)
	first := e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		started <- run.Task.ID
		select {
		case <-appended:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		for range 3 {
			if err := run.Check(ctx); err != nil {
				return "", err
			}
		}
		firstSaw <- look(run)
		return "", wkBlock(ctx)
	})
	task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("listen")})
	wkRecv(t, "handler start", started)
	for i := range 2 {
		a, err := e.client.AppendMail(ctx, task.ID, events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "hello"}}})
		if err != nil || a.MessageID != "m1" || a.Index != 1 {
			t.Fatalf("append %d of m1: %+v, %v", i, a, err)
		}
	}
	close(appended)
	want := seen{ids: []string{"m1"}, content: "hello"}
	if got := wkRecv(t, "first transcript", firstSaw); !slices.Equal(got.ids, want.ids) || got.content != want.content {
		t.Fatalf("transcript %+v, want %+v", got, want)
	}
	first.stop(t)

	resumedSaw := make(chan [2]seen, 1)
	e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		before := look(run)
		for range 3 {
			if err := run.Check(ctx); err != nil {
				return "", err
			}
		}
		resumedSaw <- [2]seen{before, look(run)}
		return "heard", nil
	})
	for i, got := range wkRecv(t, "resumed transcript", resumedSaw) {
		if !slices.Equal(got.ids, want.ids) || got.content != want.content {
			t.Fatalf("resumed transcript %d: %+v, want %+v", i, got, want)
		}
	}
	done := e.waitStatus(t, task.ID, "succeeded")
	if done.Mailbox.Count != 1 {
		t.Fatalf("mailbox holds %d messages, want 1", done.Mailbox.Count)
	}
}

// TestWorkerEffectAfterCrash stops an executor inside an effect's do,
// before its outcome is saved. On resume the effect is not repeated
// blindly: a lookup that finds the write reports it; a lookup that does
// not lets do run again; without a lookup it is reported uncertain.
func TestWorkerEffectAfterCrash(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	cps := e.kv(t, "effects")
	const queue, executorID = "effects", "exec-e"

	var (
		mu       sync.Mutex
		external []string // the fake external system: refs written
		doCalls  = map[string]int{}
		lookups  = map[string]int{}
	)
	pr := func(ref string) events.Effect {
		return events.Effect{Kind: "pull_request", Ref: ref, URL: "https://example.test/" + ref}
	}
	inDo := make(chan string, 3)
	handler := func(crash bool) executor.Handler {
		return func(ctx context.Context, run *executor.Run) (string, error) {
			mode, ref := run.Task.Message.Content[0].Text, "branch-"+run.Task.ID
			do := func(ctx context.Context) (events.Effect, error) {
				mu.Lock()
				doCalls[mode]++
				// "miss" crashes before its write reaches the system.
				if !crash || mode != "miss" {
					external = append(external, ref)
				}
				mu.Unlock()
				if crash {
					inDo <- mode
					return events.Effect{}, wkBlock(ctx)
				}
				return pr(ref), nil
			}
			lookup := func(context.Context) (events.Effect, bool, error) {
				mu.Lock()
				defer mu.Unlock()
				lookups[mode]++
				return pr(ref), slices.Contains(external, ref), nil
			}
			if mode == "blind" {
				lookup = nil
			}
			if _, err := run.Effect(ctx, "pr", do, lookup); err != nil {
				return "", err
			}
			return mode, nil
		}
	}
	first := e.start(t, e.natsCfg(queue, executorID, cps), handler(true))
	tasks := map[string]api.Task{}
	for _, mode := range []string{"found", "miss", "blind"} {
		tasks[mode] = e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText(mode)})
	}
	for range tasks {
		wkRecv(t, "effect in flight", inDo)
	}
	first.stop(t)
	e.start(t, e.natsCfg(queue, executorID, cps), handler(false))

	for mode, task := range tasks {
		done := e.waitStatus(t, task.ID, "succeeded")
		var want events.Effect
		switch mode {
		case "found", "miss":
			want = pr("branch-" + task.ID)
		case "blind":
			want = events.Effect{Kind: "unknown", Ref: "pr", Uncertain: true}
		}
		if done.Result == nil || !slices.Equal(done.Result.Effects, []events.Effect{want}) {
			t.Errorf("%s: result %+v, want effects [%+v]", mode, done.Result, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	wantDo := map[string]int{"found": 1, "miss": 2, "blind": 1}
	wantLookups := map[string]int{"found": 1, "miss": 1}
	for _, mode := range []string{"found", "miss", "blind"} {
		if doCalls[mode] != wantDo[mode] || lookups[mode] != wantLookups[mode] {
			t.Errorf("%s: do ran %d times, lookup %d; want %d and %d", mode, doCalls[mode], lookups[mode], wantDo[mode], wantLookups[mode])
		}
	}
	if len(external) != 3 {
		t.Errorf("external writes %v, want one per task", external)
	}
}
