package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testlog"
	"github.com/taskledger/taskledger/internal/testnode"
)

// workEventually polls cond until it holds (testnode.Eventually).
var workEventually = testnode.Eventually

// workWaitTask polls a task until cond holds and returns it.
func workWaitTask(t *testing.T, c *api.Client, id, what string, cond func(api.Task) bool) api.Task {
	t.Helper()
	var task api.Task
	workEventually(t, "task "+id+" "+what, func() bool {
		var err error
		if task, err = c.Get(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		return cond(task)
	})
	return task
}

// workReadPID waits for a file holding a process id (written by the task's
// command) and returns it.
func workReadPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	workEventually(t, "pid file "+filepath.Base(path), func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	return pid
}

// workProcessGone reports whether pid no longer runs: it does not exist, or it
// is a zombie (an orphan whose reaper has not collected it yet).
func workProcessGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return os.IsNotExist(err)
	}
	// pid (comm) state ...; comm may hold spaces, so cut after the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// workScript is the worker's --exec command: it reads the task JSON on
// stdin and acts on a marker in the message text. "mode-fail" exits 3;
// "mode-kind" prints the task's kind; "mode-once" records each start
// under dir, and on the first sleeps as "mode-sleep" does;
// "mode-leave" exits 0 leaving a background sleep; "mode-sleep" starts a long sleep in the background, records its own and
// the sleep's pid under dir and waits; anything else prints out-<id>.
func workScript(dir string) string {
	return `input=$(cat)
case "$input" in
*mode-fail*) echo "failing on purpose"; exit 3 ;;
*mode-leave*)
	sleep 300 &
	echo $! > ` + dir + `/$TASKLEDGER_TASK_ID.left
	echo out-$TASKLEDGER_TASK_ID; exit 0 ;;
*mode-sleep*)
	sleep 300 &
	echo $! > ` + dir + `/$TASKLEDGER_TASK_ID.sleep
	echo $$ > ` + dir + `/$TASKLEDGER_TASK_ID.pid
	wait
	echo "sleep ended"; exit 0 ;;
*mode-attempt*) echo "attempt-$TASKLEDGER_ATTEMPT"; [ "$TASKLEDGER_ATTEMPT" = 2 ]; exit $? ;;
*mode-kind*) echo "kind-$TASKLEDGER_KIND"; exit 0 ;;
*mode-once*)
	echo $$ >> ` + dir + `/$TASKLEDGER_TASK_ID.starts
	if [ "$(wc -l < ` + dir + `/$TASKLEDGER_TASK_ID.starts)" -eq 1 ]; then
		sleep 300 &
		echo $! > ` + dir + `/$TASKLEDGER_TASK_ID.sleep
		echo $$ > ` + dir + `/$TASKLEDGER_TASK_ID.pid
		wait
	fi
	echo "ran-again"; exit 0 ;;
esac
echo out-$TASKLEDGER_TASK_ID
exit 0`
}

func workRequest(mode string) api.ScheduleRequest {
	return api.ScheduleRequest{Queue: "w", Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: mode}}}}
}

func TestWorkExecEndToEnd(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	c := srv.client
	ctx := context.Background()
	dir := t.TempDir()

	var stdout, stderr testlog.Buffer
	worker := exec.Command(taskledgerBinary(t), "work", "--server", c.BaseURL, "--queue", "w",
		"--exec", workScript(dir), "--check-interval", "200ms", "--executor-id", "w-test",
		"--log-format", "json", "--log-level", "info")
	worker.Stdout, worker.Stderr = &stdout, &stderr
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = worker.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			worker.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("worker stdout:\n%s\nworker stderr:\n%s", stdout.String(), stderr.String())
		}
	})
	finished := func(task api.Task) bool { return rank[task.Status] == 3 }

	t.Run("Succeeds", func(t *testing.T) {
		var ids []string
		for range 3 {
			task, _, err := c.Schedule(ctx, workRequest("hello"))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, task.ID)
		}
		for _, id := range ids {
			task := workWaitTask(t, c, id, "finished", finished)
			if task.Status != "succeeded" || task.Result == nil || !task.Result.Success ||
				!strings.Contains(task.Result.Summary, "out-"+id) {
				t.Fatalf("task %s: status %s result %+v, want succeeded with out-%s", id, task.Status, task.Result, id)
			}
			if task.Claim == nil || task.Claim.ExecutorID != "w-test" {
				t.Fatalf("task %s claim %+v, want executor w-test", id, task.Claim)
			}
			line := "[" + id + "] out-" + id
			workEventually(t, "worker output "+line, func() bool { return strings.Contains(stdout.String(), line) })
		}
	})

	t.Run("SeesKind", func(t *testing.T) {
		req := workRequest("mode-kind")
		req.Kind = "resize"
		task, _, err := c.Schedule(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		task = workWaitTask(t, c, task.ID, "finished", finished)
		if task.Status != "succeeded" || !strings.Contains(task.Result.Summary, "kind-resize") {
			t.Fatalf("task %s: status %s result %+v, want succeeded with kind-resize", task.ID, task.Status, task.Result)
		}
	})

	t.Run("NonZeroExitFails", func(t *testing.T) {
		task, _, err := c.Schedule(ctx, workRequest("mode-fail"))
		if err != nil {
			t.Fatal(err)
		}
		task = workWaitTask(t, c, task.ID, "finished", finished)
		if task.Status != "failed" || task.Result == nil || task.Result.Success ||
			!strings.Contains(task.Result.Error, "status 3") || !strings.Contains(task.Result.Summary, "failing on purpose") {
			t.Fatalf("task %s: status %s result %+v, want failed with status 3", task.ID, task.Status, task.Result)
		}
		// The Run records the command and how it ended.
		doc, err := c.GetRun(ctx, task.ID)
		if err != nil {
			t.Fatal(err)
		}
		var started commandRun
		var ended commandExit
		if doc.Run.Phase != "exited" || json.Unmarshal(doc.Run.Contexts["command"].Value, &started) != nil ||
			json.Unmarshal(doc.Run.Contexts["exit"].Value, &ended) != nil {
			t.Fatalf("run of %s: %+v, want phase exited with command and exit contexts", task.ID, doc.Run)
		}
		if started.Command != workScript(dir) || started.Attempt != 1 || ended.Status != 3 || !strings.Contains(ended.OutputTail, "failing on purpose") {
			t.Fatalf("run of %s: command %+v, exit %+v", task.ID, started, ended)
		}
	})

	// A task scheduled from the CLI with two attempts fails its first
	// (the command sees TASKLEDGER_ATTEMPT=1) and succeeds its second;
	// show lists both attempts.
	t.Run("RetrySeesAttempt", func(t *testing.T) {
		var out strings.Builder
		if err := run(ctx, []string{"schedule", "--server", c.BaseURL, "--json", "--queue", "w", "--message", "mode-attempt",
			"--max-attempts", "2", "--backoff", "0s"}, &out); err != nil {
			t.Fatal(err)
		}
		var task api.Task
		if err := json.Unmarshal([]byte(out.String()), &task); err != nil || task.MaxAttempts != 2 || task.Retry == nil || task.Retry.BackoffSeconds != 0 {
			t.Fatalf("scheduled %s: %v", out.String(), err)
		}
		task = workWaitTask(t, c, task.ID, "finished", finished)
		if task.Status != "succeeded" || task.Attempt != 2 || !strings.Contains(task.Result.Summary, "attempt-2") ||
			len(task.Attempts) != 2 || task.Attempts[0].Outcome != "failed" || !strings.Contains(task.Attempts[0].Error, "status 1") {
			t.Fatalf("task %s: status %s attempt %d result %+v attempts %+v", task.ID, task.Status, task.Attempt, task.Result, task.Attempts)
		}
		var show strings.Builder
		if err := run(ctx, []string{"show", "--server", c.BaseURL, task.ID}, &show); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"attempt 2 of 2, backoff 0s up to 3600s, on failed", "1 failed by w-test", "2 succeeded by w-test"} {
			if !strings.Contains(show.String(), want) {
				t.Errorf("show does not print %q:\n%s", want, show.String())
			}
		}
		for _, bad := range [][]string{{"--max-attempts", "x"}, {"--backoff", "1.5s"}, {"--max-attempts", "0"}} {
			err := run(ctx, append([]string{"schedule", "--server", c.BaseURL, "--queue", "w"}, bad...), io.Discard)
			if err == nil {
				t.Errorf("schedule %v: no error", bad)
			}
		}
	})

	t.Run("CancelKillsProcessGroup", func(t *testing.T) {
		task, _, err := c.Schedule(ctx, workRequest("mode-sleep"))
		if err != nil {
			t.Fatal(err)
		}
		shell := workReadPID(t, filepath.Join(dir, task.ID+".pid"))
		sleeper := workReadPID(t, filepath.Join(dir, task.ID+".sleep"))
		if workProcessGone(shell) || workProcessGone(sleeper) {
			t.Fatalf("command not running before the cancel (sh %d, sleep %d)", shell, sleeper)
		}
		if got, err := c.Get(ctx, task.ID); err != nil || got.Status != "running" {
			t.Fatalf("task %s before cancel: %s %v, want running", task.ID, got.Status, err)
		}
		if _, err := c.Cancel(ctx, task.ID, "user gave up"); err != nil {
			t.Fatal(err)
		}
		workEventually(t, "the shell to be killed", func() bool { return workProcessGone(shell) })
		workEventually(t, "the background sleep to be killed", func() bool { return workProcessGone(sleeper) })
		got, err := c.Get(ctx, task.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != "canceled" || got.Result != nil || got.Reason != "user gave up" {
			t.Fatalf("canceled task now %s, result %+v, reason %q", got.Status, got.Result, got.Reason)
		}
		if strings.Contains(stdout.String(), "sleep ended") {
			t.Fatal("the command ran on after the cancel")
		}
	})

	t.Run("KeepsWorking", func(t *testing.T) {
		task, _, err := c.Schedule(ctx, workRequest("after the cancel"))
		if err != nil {
			t.Fatal(err)
		}
		task = workWaitTask(t, c, task.ID, "finished", finished)
		if task.Status != "succeeded" || !strings.Contains(task.Result.Summary, "out-"+task.ID) {
			t.Fatalf("task %s: status %s result %+v, want succeeded", task.ID, task.Status, task.Result)
		}
	})

	t.Run("LeftoverProcessKilled", func(t *testing.T) {
		// The command exits 0 but leaves a background process holding its
		// output: the run still succeeds, and the leftover is killed with
		// the process group rather than outliving the task.
		task, _, err := c.Schedule(ctx, workRequest("mode-leave"))
		if err != nil {
			t.Fatal(err)
		}
		left := workReadPID(t, filepath.Join(dir, task.ID+".left"))
		task = workWaitTask(t, c, task.ID, "finished", finished)
		if task.Status != "succeeded" || !strings.Contains(task.Result.Summary, "out-"+task.ID) {
			t.Fatalf("task %s: status %s result %+v, want succeeded", task.ID, task.Status, task.Result)
		}
		workEventually(t, "the leftover sleep to be killed", func() bool { return workProcessGone(left) })
	})

	t.Run("SIGTERMStops", func(t *testing.T) {
		// A run in progress at shutdown is killed with its process group
		// and left unreported.
		task, _, err := c.Schedule(ctx, workRequest("mode-sleep"))
		if err != nil {
			t.Fatal(err)
		}
		shell := workReadPID(t, filepath.Join(dir, task.ID+".pid"))
		sleeper := workReadPID(t, filepath.Join(dir, task.ID+".sleep"))
		if err := worker.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
			if exitErr != nil {
				t.Fatalf("worker exited with %v after SIGTERM, want status 0", exitErr)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("worker did not exit after SIGTERM")
		}
		if !workProcessGone(shell) {
			t.Fatalf("shell %d outlived the worker", shell)
		}
		workEventually(t, "the background sleep to be killed", func() bool { return workProcessGone(sleeper) })
		// The worker released the claim at shutdown: the task is claimable
		// again, by any worker, and the attempt is not charged.
		if got, err := c.Get(ctx, task.ID); err != nil || got.Status == "running" || got.Status == "failed" ||
			len(got.Attempts) == 0 || got.Attempts[0].Outcome != "released" {
			t.Fatalf("task %s after worker shutdown: %+v %v, want released", task.ID, got, err)
		}
	})
}

// TestWorkExecKillNine: a worker killed with kill -9 mid-command leaves no
// orphan: the command's guard takes the shell and everything it started
// down with the worker. Its claim is lost a heartbeat later, and another
// worker (another id) runs the command again, once, after the first copy
// is gone.
func TestWorkExecKillNine(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	c := srv.client
	ctx := context.Background()
	dir := t.TempDir()
	startWorker := func(id string) (*exec.Cmd, *testlog.Buffer) {
		var stderr testlog.Buffer
		w := exec.Command(taskledgerBinary(t), "work", "--server", c.BaseURL, "--queue", "w", "--heartbeat", "2",
			"--exec", workScript(dir), "--executor-id", id, "--log-format", "json")
		w.Stderr = &stderr
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			w.Process.Kill()
			w.Wait()
			if t.Failed() {
				t.Logf("worker %s stderr:\n%s", id, stderr.String())
			}
		})
		return w, &stderr
	}
	doomed, _ := startWorker("w-doomed")
	req := workRequest("mode-once")
	two := 2
	req.Retry = &api.RetryRequest{MaxAttempts: &two}
	task, _, err := c.Schedule(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	shell := workReadPID(t, filepath.Join(dir, task.ID+".pid"))
	sleeper := workReadPID(t, filepath.Join(dir, task.ID+".sleep"))
	if workProcessGone(shell) || workProcessGone(sleeper) {
		t.Fatalf("command not running before the kill (sh %d, sleep %d)", shell, sleeper)
	}
	if err := doomed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	doomed.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for !workProcessGone(shell) || !workProcessGone(sleeper) {
		if time.Now().After(deadline) {
			t.Fatalf("5 s after kill -9 of the worker: shell %d gone %v, background sleep %d gone %v",
				shell, workProcessGone(shell), sleeper, workProcessGone(sleeper))
		}
		time.Sleep(20 * time.Millisecond)
	}

	startWorker("w-successor")
	done := workWaitTask(t, c, task.ID, "finished", func(task api.Task) bool { return rank[task.Status] == 3 })
	if done.Status != "succeeded" || !strings.Contains(done.Result.Summary, "ran-again") || done.Claim.ExecutorID != "w-successor" {
		t.Fatalf("task %s: %s by %+v, result %+v; want succeeded by w-successor", task.ID, done.Status, done.Claim, done.Result)
	}
	starts, err := os.ReadFile(filepath.Join(dir, task.ID+".starts"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(starts), "\n"); n != 2 {
		t.Fatalf("the command started %d times, want 2 (the killed one and its successor):\n%s", n, starts)
	}
	h, err := c.History(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, ev := range h.Events {
		if ev.Type == "ClaimLost" {
			lost++
		}
	}
	if lost != 1 {
		t.Fatalf("history has %d ClaimLost, want 1", lost)
	}
}
