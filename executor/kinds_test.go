package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/executor"
)

type resizeArgs struct {
	Src   string `json:"src"`
	Width int    `json:"width"`
}

// TestTypedHandlers: against a real server, a typed handler runs the
// tasks of its kind with their payload decoded (its output in the
// result), a payload that does not decode fails its task for good
// without calling it, and other kinds run the default handler; a worker
// without one fails them with ErrNoHandler.
func TestTypedHandlers(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	var got []resizeArgs
	var defaults []string
	w, err := executor.NewWorker(e.httpCfg("img", "typed-1"), func(ctx context.Context, run *executor.Run) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		defaults = append(defaults, run.Task.Kind)
		return "default", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	executor.Handle(w, "resize", func(ctx context.Context, run *executor.Run, args resizeArgs) error {
		mu.Lock()
		got = append(got, args)
		mu.Unlock()
		if args.Width <= 0 {
			return errors.New("width must be positive")
		}
		return run.SetOutput(map[string]string{"thumb": strings.TrimSuffix(args.Src, ".png") + "-small.png"})
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); wkRecv(t, "the worker's end", done) }()

	ok := e.schedule(t, api.ScheduleRequest{Queue: "img", Kind: "resize", Payload: json.RawMessage(`{"src":"cat.png","width":64}`)})
	zero := e.schedule(t, api.ScheduleRequest{Queue: "img", Kind: "resize"})
	bad := e.schedule(t, api.ScheduleRequest{Queue: "img", Kind: "resize", Payload: json.RawMessage(`"not an object"`)})
	other := e.schedule(t, api.ScheduleRequest{Queue: "img", Kind: "thumb"})

	res := e.waitStatus(t, ok.ID, api.StatusSucceeded).Result
	if res == nil || string(res.Output) != `{"thumb":"cat-small.png"}` {
		t.Fatalf("typed handler's result %+v, want its output", res)
	}
	if r := e.waitStatus(t, zero.ID, api.StatusFailed).Result; r == nil || r.Error != "width must be positive" {
		t.Fatalf("a task without a payload ran with the zero value: %+v", r)
	}
	r := e.waitStatus(t, bad.ID, api.StatusFailed).Result
	if r == nil || !strings.Contains(r.Error, `the payload of kind "resize" does not decode`) || r.Retryable == nil || *r.Retryable {
		t.Fatalf("undecodable payload's result %+v, want a final failure naming the kind", r)
	}
	if r := e.waitStatus(t, other.ID, api.StatusSucceeded).Result; r == nil || r.Summary != "default" {
		t.Fatalf("a kind without a typed handler: %+v, want the default handler's", r)
	}
	mu.Lock()
	if want := []resizeArgs{{"cat.png", 64}, {}}; len(got) != 2 || !slices.Contains(got, want[0]) || !slices.Contains(got, want[1]) {
		t.Errorf("typed handler got %+v, want %+v (the undecodable payload never reaches it)", got, want)
	}
	if !slices.Equal(defaults, []string{"thumb"}) {
		t.Errorf("default handler ran for kinds %q, want only thumb", defaults)
	}
	mu.Unlock()
	l, err := e.client.List(ctx, api.ListOptions{Kind: "resize", Queue: "img"})
	if err != nil || len(l.Tasks) != 3 {
		t.Fatalf("list kind=resize: %d tasks, %v; want 3", len(l.Tasks), err)
	}

	t.Run("NoDefaultHandler", func(t *testing.T) {
		w, err := executor.NewWorker(e.httpCfg("img-typed-only", "typed-2"), nil)
		if err != nil {
			t.Fatal(err)
		}
		executor.Handle(w, "resize", func(context.Context, *executor.Run, resizeArgs) error { return nil })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		defer func() { cancel(); wkRecv(t, "the worker's end", done) }()
		task := e.schedule(t, api.ScheduleRequest{Queue: "img-typed-only", Kind: "unknown"})
		if r := e.waitStatus(t, task.ID, api.StatusFailed).Result; r == nil || !strings.Contains(r.Error, executor.ErrNoHandler.Error()) {
			t.Fatalf("a kind without a handler: %+v, want ErrNoHandler", r)
		}
	})
}

func TestHandleRefusesBadKind(t *testing.T) {
	t.Parallel()
	w, err := executor.NewWorker(executor.WorkerConfig{API: &api.Client{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Handle accepted the kind Resize")
		}
	}()
	executor.Handle(w, "Resize", func(context.Context, *executor.Run, resizeArgs) error { return nil })
}
