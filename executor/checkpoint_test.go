package executor_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// wkHoldingStore holds the first save whose transcript has "m1" until a
// later save has been written (or a while has passed), so that an older
// snapshot lands after a newer one if the run lets saves overlap.
type wkHoldingStore struct {
	executor.CheckpointStore
	mu      sync.Mutex
	held    bool
	holding bool
	later   chan struct{}
}

func (s *wkHoldingStore) Save(ctx context.Context, cp executor.Checkpoint) error {
	s.mu.Lock()
	hold := !s.held && slices.Contains(wkItemIDs(cp.Transcript), "m1")
	if hold {
		s.held, s.holding = true, true
	}
	overtaking := !hold && s.holding
	s.mu.Unlock()
	if hold {
		select {
		case <-s.later:
		case <-time.After(300 * time.Millisecond):
		}
		s.mu.Lock()
		s.holding = false
		s.mu.Unlock()
	}
	err := s.CheckpointStore.Save(ctx, cp)
	if overtaking {
		close(s.later)
	}
	return err
}

// TestWorkerCheckpointSavesInOrder makes the background stop check's save
// (a new mailbox item) slow while the handler finishes a step: the stored
// checkpoint must still have the step, or a resumed run would repeat it.
func TestWorkerCheckpointSavesInOrder(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	cps := &wkHoldingStore{CheckpointStore: &executor.MemoryCheckpoints{}, later: make(chan struct{})}
	cfg := e.httpCfg("ordered", "exec-o")
	cfg.Checkpoints = cps

	started := make(chan struct{}, 1)
	stepped := make(chan error, 1)
	w := e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		started <- struct{}{}
		// Wait for the background check to deliver m1 (its save is held).
		for len(run.Transcript()) == 0 {
			select {
			case <-ctx.Done():
				stepped <- ctx.Err()
				return "", ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		stepped <- run.Step(ctx, "a", func(context.Context) error { return nil })
		return "", wkBlock(ctx)
	})
	task := e.schedule(t, api.ScheduleRequest{Queue: "ordered", Message: wkText("x")})
	wkRecv(t, "handler start", started)
	if _, err := e.client.AppendMail(ctx, task.ID, events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "hi"}}}); err != nil {
		t.Fatal(err)
	}
	if err := wkRecv(t, "step a", stepped); err != nil {
		t.Fatal(err)
	}
	w.stop(t) // waits for the held save too

	cp, ok, err := cps.Load(ctx, task.ID)
	if err != nil || !ok {
		t.Fatalf("checkpoint: %v, %v", ok, err)
	}
	if !slices.Equal(cp.Steps, []string{"a"}) || !slices.Equal(wkItemIDs(cp.Transcript), []string{"m1"}) {
		t.Fatalf("stored checkpoint %+v lost an update", cp)
	}
}

// wkFlakyAPI fails its first Get calls as an unreachable scheduler would,
// and reports the first poll for work (the worker polls only after it
// has resumed what its checkpoints hold).
type wkFlakyAPI struct {
	*api.Client
	failGets atomic.Int32
	polling  chan struct{}
	once     sync.Once
}

func (f *wkFlakyAPI) Get(ctx context.Context, id string) (api.Task, error) {
	if f.failGets.Add(-1) >= 0 {
		return api.Task{}, errors.New("connection refused")
	}
	return f.Client.Get(ctx, id)
}

func (f *wkFlakyAPI) ClaimNext(ctx context.Context, queue, executorID string, wait time.Duration, opts ...api.ClaimOption) (api.Task, bool, error) {
	f.once.Do(func() { close(f.polling) })
	return f.Client.ClaimNext(ctx, queue, executorID, wait, opts...)
}

func (f *wkFlakyAPI) ClaimBatch(ctx context.Context, queue, executorID string, max int, wait time.Duration, opts ...api.ClaimOption) ([]api.Task, error) {
	f.once.Do(func() { close(f.polling) })
	return f.Client.ClaimBatch(ctx, queue, executorID, max, wait, opts...)
}

// TestWorkerResumeWhileSchedulerUnreachable restarts an executor while
// the scheduler does not answer: its checkpoint must survive, so that a
// later start resumes the run instead of abandoning it.
func TestWorkerResumeWhileSchedulerUnreachable(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()
	cps := &executor.MemoryCheckpoints{}
	cfg := e.httpCfg("flaky", "exec-f")
	cfg.Checkpoints = cps

	started := make(chan struct{}, 1)
	first := e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		started <- struct{}{}
		return "", wkBlock(ctx)
	})
	task := e.schedule(t, api.ScheduleRequest{Queue: "flaky", Message: wkText("x")})
	wkRecv(t, "handler start", started)
	first.stop(t)

	flaky := &wkFlakyAPI{Client: e.client, polling: make(chan struct{})}
	flaky.failGets.Store(1)
	cfg.API = flaky
	second := e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) {
		return "", errors.New("resumed while the scheduler was unreachable")
	})
	wkRecv(t, "claims/next poll", flaky.polling)
	second.stop(t)
	if open, err := cps.List(ctx); err != nil || len(open) != 1 || open[0].TaskID != task.ID {
		t.Fatalf("open checkpoints after a failed resume: %+v, %v", open, err)
	}

	cfg.API = e.client
	e.start(t, cfg, func(ctx context.Context, run *executor.Run) (string, error) { return "resumed", nil })
	if done := e.waitStatus(t, task.ID, "succeeded"); done.Result.Summary != "resumed" {
		t.Fatalf("result %+v", done.Result)
	}
}

// Checkpoints of runs nobody finished do not pile up either: KV entries
// expire CheckpointTTL after their last save.
func TestCheckpointsExpire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := wkSetup(t)
	e.kv(t, "ttl")
	kv, err := e.js.KeyValue(ctx, e.ns.Stream+"_RUNS_ttl")
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != executor.CheckpointTTL || st.TTL() <= 7*24*time.Hour {
		t.Errorf("checkpoint bucket TTL %v, want %v (longer than the longest run)", st.TTL(), executor.CheckpointTTL)
	}
}

// A KV entry an older SDK wrote (its transcript held ids only) does not
// stop the others from being resumed.
func TestKVCheckpointsSkipUndecodable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := wkSetup(t)
	cps := e.kv(t, "legacy")
	kv, err := e.js.KeyValue(ctx, e.ns.Stream+"_RUNS_legacy")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "old", []byte(`{"taskId":"old","transcript":["m1"]}`)); err != nil {
		t.Fatal(err)
	}
	if err := cps.Save(ctx, executor.Checkpoint{TaskID: "new", RunState: api.RunState{Turn: 1}}); err != nil {
		t.Fatal(err)
	}
	if ids := listed(t, cps); !slices.Equal(ids, []string{"new"}) {
		t.Fatalf("List = %v, want [new]", ids)
	}
	if _, _, err := cps.Load(ctx, "old"); err == nil {
		t.Fatal("Load of an undecodable entry did not fail")
	}
}
