package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestCheckpointStores runs one behaviour suite against every
// CheckpointStore implementation.
func TestCheckpointStores(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) executor.CheckpointStore{
		"Memory": func(*testing.T) executor.CheckpointStore { return &executor.MemoryCheckpoints{} },
		"KV": func(t *testing.T) executor.CheckpointStore {
			return wkSetup(t).kv(t, strings.ReplaceAll(t.Name(), "/", "_"))
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testCheckpointStore(t, open)
		})
	}
}

func testCheckpointStore(t *testing.T, open func(t *testing.T) executor.CheckpointStore) {
	ctx := context.Background()
	full := executor.Checkpoint{
		TaskID: "t1", DeliveryID: "d1", RunState: api.RunState{
			ExecutorID: "e1", Phase: "review", Turn: 3,
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
		},
	}
	t.Run("LoadMissing", func(t *testing.T) {
		s := open(t)
		if _, ok, err := s.Load(ctx, "nobody"); ok || err != nil {
			t.Fatalf("Load of an unknown task = ok %v, err %v; want none", ok, err)
		}
		if l, err := s.List(ctx); len(l) != 0 || err != nil {
			t.Fatalf("List of an empty store = %v, %v", l, err)
		}
	})
	t.Run("RoundTrip", func(t *testing.T) {
		s := open(t)
		if err := s.Save(ctx, full); err != nil {
			t.Fatal(err)
		}
		got, ok, err := s.Load(ctx, "t1")
		if err != nil || !ok || !reflect.DeepEqual(got, full) {
			t.Fatalf("Load = %+v, %v, %v; want %+v", got, ok, err, full)
		}
	})
	t.Run("SaveReplaces", func(t *testing.T) {
		s := open(t)
		for turn := range 3 {
			if err := s.Save(ctx, executor.Checkpoint{TaskID: "t1", RunState: api.RunState{Turn: turn}}); err != nil {
				t.Fatal(err)
			}
		}
		if got, _, _ := s.Load(ctx, "t1"); got.Turn != 2 {
			t.Fatalf("Load after three saves has turn %d, want the last (2)", got.Turn)
		}
	})
	t.Run("DoneRemoves", func(t *testing.T) {
		s := open(t)
		for _, id := range []string{"a", "b", "c"} {
			if err := s.Save(ctx, executor.Checkpoint{TaskID: id}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Save(ctx, executor.Checkpoint{TaskID: "b", Done: true}); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.Load(ctx, "b"); ok || err != nil {
			t.Fatalf("Load after Done = ok %v, err %v; want none", ok, err)
		}
		if err := s.Save(ctx, executor.Checkpoint{TaskID: "never-saved", Done: true}); err != nil {
			t.Fatalf("Done of a task with no checkpoint: %v", err)
		}
		if ids := listed(t, s); !slices.Equal(ids, []string{"a", "c"}) {
			t.Fatalf("List = %v, want [a c]", ids)
		}
	})
	t.Run("ConcurrentSaves", func(t *testing.T) {
		s := open(t)
		var g errgroup.Group
		for i := range 32 {
			g.Go(func() error {
				return s.Save(ctx, executor.Checkpoint{TaskID: fmt.Sprintf("t%02d", i), RunState: api.RunState{Turn: i}})
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		if ids := listed(t, s); len(ids) != 32 {
			t.Fatalf("List has %d checkpoints after 32 concurrent saves", len(ids))
		}
		for i := range 32 {
			if got, ok, err := s.Load(ctx, fmt.Sprintf("t%02d", i)); err != nil || !ok || got.Turn != i {
				t.Fatalf("t%02d = %+v, %v, %v", i, got, ok, err)
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
