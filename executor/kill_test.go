package executor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
	"github.com/taskledger/taskledger/internal/testlog"
)

// The kill -9 tests run a Go SDK executor in a child process (this test
// binary again, with killChildEnv set; TestMain hands it to killChild),
// SIGKILL it at a point of its run, and start a fresh child with the same
// executor id against the same scheduler.

const (
	killChildEnv = "TASKLEDGER_TEST_KILL_CHILD" // the point to stop at; "-" for none
	killServer   = "TASKLEDGER_TEST_SERVER"
	killQueue    = "TASKLEDGER_TEST_QUEUE"
	killCalls    = "TASKLEDGER_TEST_CALLS" // file the child appends a line to per call
	killExecutor = "exec-kill"
	// The child's executor id (default killExecutor) and heartbeat
	// interval in seconds (default the worker's).
	killExecutorEnv  = "TASKLEDGER_TEST_EXECUTOR"
	killHeartbeatEnv = "TASKLEDGER_TEST_HEARTBEAT"
)

// killChild is the child's main: a worker on the queue whose handler
// writes "AT <point>" to stdout and blocks once it reaches the point.
func killChild() int {
	point := os.Getenv(killChildEnv)
	calls, err := os.OpenFile(os.Getenv(killCalls), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	count := func(what string) { fmt.Fprintln(calls, what) } // one write: survives SIGKILL
	handler := func(ctx context.Context, run *executor.Run) (string, error) {
		reach := func(p string) {
			if p == point {
				fmt.Printf("AT %s %s\n", p, run.Task.ID)
				<-ctx.Done() // until killed
			}
		}
		reach("claimed")
		err := run.Turn(ctx, func(t *executor.Turn) error {
			count("turn1")
			if _, err := t.Record(ctx, api.TranscriptItem{Kind: api.ItemModelInput, Content: text("find the bug")}); err != nil {
				return err
			}
			if _, err := t.Record(ctx, api.TranscriptItem{Kind: api.ItemModelOutput, Content: text("grep for it")}); err != nil {
				return err
			}
			_, err := t.Dispatch(ctx, api.ToolCall{Name: "grep", Input: json.RawMessage(`{"q":"bug"}`)},
				func(context.Context) (json.RawMessage, error) {
					count("tool")
					reach("tool")
					return json.RawMessage(`{"hits":1}`), nil
				}, nil)
			return err
		})
		if err != nil {
			return "", err
		}
		reach("turn-end")
		if _, err := run.Effect(ctx, "pr", func(context.Context) (events.Effect, error) {
			count("effect")
			reach("effect")
			return events.Effect{Kind: "pull_request", Ref: "7"}, nil
		}, nil); err != nil {
			return "", err
		}
		err = run.Turn(ctx, func(t *executor.Turn) error {
			count("turn2")
			_, err := t.Record(ctx, api.TranscriptItem{Kind: api.ItemModelOutput, Content: text("fixed")})
			return err
		})
		return "fixed", err
	}
	executorID := killExecutor
	if id := os.Getenv(killExecutorEnv); id != "" {
		executorID = id
	}
	heartbeat, _ := strconv.Atoi(os.Getenv(killHeartbeatEnv))
	w, err := executor.NewWorker(executor.WorkerConfig{
		API: api.NewClient(os.Getenv(killServer), ""), Queue: os.Getenv(killQueue), ExecutorID: executorID,
		CheckInterval: 50 * time.Millisecond, PollWait: 200 * time.Millisecond, HeartbeatSeconds: heartbeat,
		Logger: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	}, handler)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := w.Run(context.Background()); err != nil { // until killed
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// killProc is a running child executor.
type killProc struct {
	cmd    *exec.Cmd
	at     chan string // "<point> <task id>" lines
	stderr *testlog.Buffer
}

// startKillChild starts a child executor that stops at point ("-": none);
// env adds to its environment (killExecutorEnv, killHeartbeatEnv).
func (e *wkEnv) startKillChild(t *testing.T, queue, point, calls string, env ...string) *killProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killChildEnv+"="+point, killServer+"="+e.client.BaseURL, killQueue+"="+queue, killCalls+"="+calls)
	cmd.Env = append(cmd.Env, env...)
	p := &killProc{cmd: cmd, at: make(chan string, 1), stderr: &testlog.Buffer{}}
	cmd.Stderr = p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "AT "); ok {
				p.at <- rest
			}
		}
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("child stderr:\n%s", p.stderr)
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *killProc) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}

// killCounts reads the calls file: how often each call was made.
func killCounts(t *testing.T, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Fields(string(b)) {
		out[line]++
	}
	return out
}

// runOf reads a task's Run document; ok is false before the first save.
func (e *wkEnv) runOf(t *testing.T, id string) (api.RunDocument, bool) {
	t.Helper()
	d, err := e.client.GetRun(context.Background(), id)
	if errors.Is(err, api.ErrNotFound) {
		return d, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return d, true
}

// sameEffects reports whether got is want alone, whenever it was reported.
func sameEffects(got []events.Effect, want events.Effect) bool {
	return len(got) == 1 && got[0].Kind == want.Kind && got[0].Ref == want.Ref && got[0].URL == want.URL && got[0].Uncertain == want.Uncertain
}

// toolStatus returns the status the transcript gives tool call id last.
func toolStatus(r api.RunState, id string) string {
	status := ""
	for _, it := range r.Transcript {
		if it.Tool != nil && it.Tool.ID == id {
			status = it.Tool.Status
		}
	}
	return status
}

// TestKillNineExecutor kills an executor process at each point of its run
// and restarts it: the run resumes from its saved Run, no tool or effect
// without a lookup is repeated, and the history and the Run document
// show what happened.
func TestKillNineExecutor(t *testing.T) {
	t.Parallel()
	pr := events.Effect{Kind: "pull_request", Ref: "7"}
	uncertainPR := events.Effect{Kind: "unknown", Ref: "pr", Uncertain: true}
	for _, tc := range []struct {
		point string
		// what the Run document holds at the kill
		atKill func(t *testing.T, d api.RunDocument, ok bool)
		calls  map[string]int // calls made by both children
		tool   string         // the grep call's final status
		effect events.Effect  // the effect as the result and the task show it
	}{
		{"claimed", func(t *testing.T, d api.RunDocument, ok bool) {
			if ok {
				t.Fatalf("a Run was saved before anything happened: %+v", d)
			}
		}, map[string]int{"turn1": 1, "tool": 1, "effect": 1, "turn2": 1}, api.ToolOK, pr},
		{"tool", func(t *testing.T, d api.RunDocument, ok bool) {
			if !ok || d.Run.Turn != 1 || len(d.Run.PendingTools) != 1 || d.Run.PendingTools[0].ID != "t1.c1" || toolStatus(d.Run, "t1.c1") != api.ToolPending {
				t.Fatalf("Run at the kill: %+v, %v; want t1.c1 pending in turn 1", d.Run, ok)
			}
		}, map[string]int{"turn1": 2, "tool": 1, "effect": 1, "turn2": 1}, api.ToolUncertain, pr},
		{"turn-end", func(t *testing.T, d api.RunDocument, ok bool) {
			if !ok || d.Run.Turn != 1 || len(d.Run.PendingTools) != 0 || !slices.Equal(wkItemIDs(d.Run.Transcript), []string{"t1.i1", "t1.i2", "t1.c1", "t1.c1.result", "t1.end"}) {
				t.Fatalf("Run at the kill: %+v, %v; want turn 1 ended", d.Run, ok)
			}
		}, map[string]int{"turn1": 1, "tool": 1, "effect": 1, "turn2": 1}, api.ToolOK, pr},
		{"effect", func(t *testing.T, d api.RunDocument, ok bool) {
			if rec, in := d.Run.Effects["pr"]; !ok || !in || rec.Outcome != nil {
				t.Fatalf("Run at the kill: %+v, %v; want the intent of pr without an outcome", d.Run, ok)
			}
		}, map[string]int{"turn1": 1, "tool": 1, "effect": 1, "turn2": 1}, api.ToolOK, uncertainPR},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			e := wkSetup(t)
			queue, calls := "kill-"+tc.point, filepath.Join(t.TempDir(), "calls")
			first := e.startKillChild(t, queue, tc.point, calls)
			task := e.schedule(t, api.ScheduleRequest{Queue: queue, Message: wkText("fix it")})
			if got := wkRecv(t, "child at "+tc.point, first.at); got != tc.point+" "+task.ID {
				t.Fatalf("child reached %q, want %s of %s", got, tc.point, task.ID)
			}
			first.kill()
			d, ok := e.runOf(t, task.ID)
			tc.atKill(t, d, ok)

			e.startKillChild(t, queue, "-", calls)
			done := e.waitStatus(t, task.ID, "succeeded")
			if done.Result == nil || done.Result.Summary != "fixed" || !sameEffects(done.Result.Effects, tc.effect) {
				t.Fatalf("result %+v, want summary fixed and effects [%+v]", done.Result, tc.effect)
			}
			if !sameEffects(done.Effects, tc.effect) {
				t.Fatalf("task effects %+v, want [%+v]", done.Effects, tc.effect)
			}
			for typ, n := range map[string]int{"Claimed": 1, "EffectsReported": 1, "ResultRecorded": 1} {
				if got := e.countEvents(t, task.ID, typ); got != n {
					t.Errorf("%d %s events, want %d", got, typ, n)
				}
			}
			if got := killCounts(t, calls); !maps.Equal(got, tc.calls) {
				t.Errorf("calls %v, want %v", got, tc.calls)
			}
			d, ok = e.runOf(t, task.ID)
			wantIDs := []string{"t1.i1", "t1.i2", "t1.c1", "t1.c1.result", "t1.end", "t2.i1", "t2.end"}
			if !ok || d.Run.Turn != 2 || len(d.Run.PendingTools) != 0 || !slices.Equal(wkItemIDs(d.Run.Transcript), wantIDs) ||
				toolStatus(d.Run, "t1.c1") != tc.tool || d.Run.ExecutorID != killExecutor || d.DeliveryID != done.Claim.DeliveryID {
				t.Fatalf("final Run %+v (%v): want transcript %v, t1.c1 %s", d, ok, wantIDs, tc.tool)
			}
			if rec := d.Run.Effects["pr"]; rec.Outcome == nil || !sameEffects([]events.Effect{*rec.Outcome}, tc.effect) {
				t.Fatalf("Run effect pr %+v, want %+v", rec, tc.effect)
			}
		})
	}
	// Nothing resumes a run whose executor never comes back: its task
	// times out, and its Run shows where it stood.
	t.Run("NotRestarted", func(t *testing.T) {
		t.Parallel()
		e := wkSetup(t)
		calls := filepath.Join(t.TempDir(), "calls")
		child := e.startKillChild(t, "kill-gone", "tool", calls)
		timeout := 1
		task := e.schedule(t, api.ScheduleRequest{Queue: "kill-gone", TimeoutSeconds: &timeout, Message: wkText("fix it")})
		wkRecv(t, "child at tool", child.at)
		child.kill()
		e.waitStatus(t, task.ID, "timed_out")
		if n := e.countEvents(t, task.ID, "ResultRecorded"); n != 0 {
			t.Fatalf("%d results from a killed executor", n)
		}
		d, ok := e.runOf(t, task.ID)
		if !ok || len(d.Run.PendingTools) != 1 || toolStatus(d.Run, "t1.c1") != api.ToolPending {
			t.Fatalf("Run after the timeout: %+v, %v; want t1.c1 pending", d, ok)
		}
		if got := killCounts(t, calls); !maps.Equal(got, map[string]int{"turn1": 1, "tool": 1}) {
			t.Fatalf("calls %v", got)
		}
	})
}
