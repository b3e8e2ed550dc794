package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestCheckpointStores runs one behaviour suite against every
// CheckpointStore implementation.
func TestCheckpointStores(t *testing.T) {
	t.Parallel()
	// fakeClaims names n tasks for a store that does not ask the scheduler.
	fakeClaims := func(t *testing.T, n int) []executor.Checkpoint {
		out := make([]executor.Checkpoint, n)
		for i := range out {
			out[i] = executor.Checkpoint{TaskID: fmt.Sprintf("t%02d", i), DeliveryID: fmt.Sprintf("d%02d", i), RunState: api.RunState{ExecutorID: "e1"}}
		}
		return out
	}
	stores := map[string]storeCase{
		"Memory": {open: func(*testing.T) (executor.CheckpointStore, claimsFunc) {
			return &executor.MemoryCheckpoints{}, fakeClaims
		}},
		"KV": {open: func(t *testing.T) (executor.CheckpointStore, claimsFunc) {
			return wkSetup(t).kv(t, strings.ReplaceAll(t.Name(), "/", "_")), fakeClaims
		}},
		"Scheduler": {keepsDone: true, open: func(t *testing.T) (executor.CheckpointStore, claimsFunc) {
			e := wkSetup(t)
			return executor.NewSchedulerRuns(e.client, "stored", "e1"), func(t *testing.T, n int) []executor.Checkpoint {
				return e.claimed(t, "stored", "e1", n)
			}
		}},
	}
	for name, sc := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testCheckpointStore(t, sc)
		})
	}
}

// claimsFunc returns n checkpoints of tasks a store may save, their
// TaskID, DeliveryID and ExecutorID set.
type claimsFunc func(t *testing.T, n int) []executor.Checkpoint

// storeCase is one CheckpointStore under test; keepsDone says that a
// Done save leaves the checkpoint for audit (Load still finds it, and
// List omits it once the task ends) instead of deleting it.
type storeCase struct {
	open      func(t *testing.T) (executor.CheckpointStore, claimsFunc)
	keepsDone bool
}

// claimed schedules n tasks on queue and claims them for executorID.
func (e *wkEnv) claimed(t *testing.T, queue, executorID string, n int) []executor.Checkpoint {
	t.Helper()
	ctx := context.Background()
	for range n {
		e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("x")})
	}
	var out []executor.Checkpoint
	for len(out) < n {
		tasks, err := e.client.ClaimBatch(ctx, queue, executorID, n-len(out), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			out = append(out, executor.Checkpoint{TaskID: task.ID, DeliveryID: task.Claim.DeliveryID, RunState: api.RunState{ExecutorID: executorID}})
		}
	}
	return out
}

func testCheckpointStore(t *testing.T, sc storeCase) {
	ctx := context.Background()
	withRun := func(cp executor.Checkpoint, r api.RunState) executor.Checkpoint {
		r.ExecutorID = cp.ExecutorID
		cp.RunState = r
		return cp
	}
	full := api.RunState{
		Phase: "review", Turn: 3,
		Transcript: []api.TranscriptItem{{ID: "m1", Kind: api.ItemMailbox, Turn: 1},
			{ID: "t3.c1", Kind: api.ItemToolCall, Turn: 3, Tool: &api.ToolCall{ID: "t3.c1", Name: "grep", Input: json.RawMessage(`{"q":"x"}`), Turn: 3, Status: api.ToolPending}}},
		Contexts:     map[string]api.RunContext{"issue": {Version: 2, Value: json.RawMessage(`{"n":1}`)}},
		PendingTools: []api.ToolCall{{ID: "t3.c1", Name: "grep", Turn: 3, Status: api.ToolPending}},
		Steps:        []string{"plan"},
		Effects: map[string]api.EffectRecord{
			"pr":  {Outcome: &events.Effect{Kind: "pull_request", Ref: "42", URL: "https://example.com/pr/42"}},
			"tag": {},
		},
		Children: map[string]string{"review": "child-1"},
	}
	t.Run("LoadMissing", func(t *testing.T) {
		s, _ := sc.open(t)
		if _, ok, err := s.Load(ctx, "nobody"); ok || err != nil {
			t.Fatalf("Load of an unknown task = ok %v, err %v; want none", ok, err)
		}
		if l, err := s.List(ctx); len(l) != 0 || err != nil {
			t.Fatalf("List of an empty store = %v, %v", l, err)
		}
	})
	t.Run("RoundTrip", func(t *testing.T) {
		s, claims := sc.open(t)
		cp := withRun(claims(t, 1)[0], full)
		if err := s.Save(ctx, cp); err != nil {
			t.Fatal(err)
		}
		got, ok, err := s.Load(ctx, cp.TaskID)
		if err != nil || !ok || !reflect.DeepEqual(got, cp) {
			t.Fatalf("Load = %+v, %v, %v; want %+v", got, ok, err, cp)
		}
	})
	t.Run("SaveReplaces", func(t *testing.T) {
		s, claims := sc.open(t)
		cp := claims(t, 1)[0]
		for turn := range 3 {
			if err := s.Save(ctx, withRun(cp, api.RunState{Turn: turn})); err != nil {
				t.Fatal(err)
			}
		}
		if got, _, _ := s.Load(ctx, cp.TaskID); got.Turn != 2 {
			t.Fatalf("Load after three saves has turn %d, want the last (2)", got.Turn)
		}
	})
	t.Run("DoneRemoves", func(t *testing.T) {
		if sc.keepsDone {
			t.Skip("the store keeps a done checkpoint for audit")
		}
		s, claims := sc.open(t)
		cps := claims(t, 3)
		for _, cp := range cps {
			if err := s.Save(ctx, withRun(cp, api.RunState{Phase: "x"})); err != nil {
				t.Fatal(err)
			}
		}
		done := cps[1]
		done.Done = true
		if err := s.Save(ctx, done); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.Load(ctx, done.TaskID); ok || err != nil {
			t.Fatalf("Load after Done = ok %v, err %v; want none", ok, err)
		}
		if err := s.Save(ctx, executor.Checkpoint{TaskID: "never-saved", Done: true}); err != nil {
			t.Fatalf("Done of a task with no checkpoint: %v", err)
		}
		if ids := listed(t, s); !slices.Equal(ids, []string{cps[0].TaskID, cps[2].TaskID}) {
			t.Fatalf("List = %v, want %s and %s", ids, cps[0].TaskID, cps[2].TaskID)
		}
	})
	t.Run("ConcurrentSaves", func(t *testing.T) {
		s, claims := sc.open(t)
		cps := claims(t, 32)
		var g errgroup.Group
		for i, cp := range cps {
			g.Go(func() error { return s.Save(ctx, withRun(cp, api.RunState{Turn: i + 1})) })
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		if ids := listed(t, s); len(ids) != 32 {
			t.Fatalf("List has %d checkpoints after 32 concurrent saves", len(ids))
		}
		for i, cp := range cps {
			if got, ok, err := s.Load(ctx, cp.TaskID); err != nil || !ok || got.Turn != i+1 {
				t.Fatalf("%s = %+v, %v, %v", cp.TaskID, got, ok, err)
			}
		}
	})
}

// listed returns the task ids s lists, sorted.
func listed(t *testing.T, s executor.CheckpointStore) []string {
	t.Helper()
	l, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(l))
	for i, cp := range l {
		ids[i] = cp.TaskID
	}
	slices.Sort(ids)
	return ids
}
