package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testlog"
)

// TestWorkOverNATS: serve with an auth file exposes its NATS client port
// (--nats-listen); `taskledger work` given only that URL, a token and its
// customer runs a task over the API over NATS; a connection without a
// token is refused, and work with a token but no customer is a usage
// error.
func TestWorkOverNATS(t *testing.T) {
	t.Parallel()
	natsAddr, httpAddr := freeAddr(t), freeAddr(t)
	path := writeAuthFile(t, "tok-a A\ntok-op *\n")
	srv := exec.Command(taskledgerBinary(t), "serve", "--data", t.TempDir(), "--http", httpAddr, "--nats-listen", natsAddr,
		"--auth-file", path, "--log-format", "json", "--log-level", "warn")
	srv.Stdout, srv.Stderr = os.Stderr, os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGKILL); srv.Wait() })
	c := api.NewClient("http://"+httpAddr, testToken("tok-a"))
	defer c.HTTP.CloseIdleConnections()
	workEventually(t, "the server answering", func() bool {
		resp, err := c.HTTP.Get(c.BaseURL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})

	if nc, err := nats.Connect("nats://" + natsAddr); err == nil {
		nc.Close()
		t.Fatal("a connection without a token was admitted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connection without a token: %v, want an authorization violation", err)
	}
	usage := exec.Command(taskledgerBinary(t), "work", "--nats-url", "nats://"+natsAddr, "--token", testToken("tok-a"), "--exec", "true")
	if out, err := usage.CombinedOutput(); err == nil || !strings.Contains(string(out), "--customer is required") {
		t.Fatalf("work without --customer: %v\n%s", err, out)
	}

	var stdout, stderr testlog.Buffer
	worker := exec.Command(taskledgerBinary(t), "work", "--nats-url", "nats://"+natsAddr, "--token", testToken("tok-a"), "--customer", "A",
		"--queue", "w", "--exec", `echo "out-$TASKLEDGER_TASK_ID server=[$TASKLEDGER_SERVER]"`, "--executor-id", "nats-w",
		"--heartbeat", "3", "--log-format", "json")
	worker.Stdout, worker.Stderr = &stdout, &stderr
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		worker.Process.Signal(syscall.SIGKILL)
		worker.Wait()
		if t.Failed() {
			t.Logf("worker stdout:\n%s\nworker stderr:\n%s", stdout.String(), stderr.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	task, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "w", Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "hi"}}}})
	if err != nil {
		t.Fatal(err)
	}
	task = workWaitTask(t, c, task.ID, "finished", func(task api.Task) bool { return rank[task.Status] == 3 })
	if task.Status != api.StatusSucceeded || !strings.Contains(task.Result.Summary, "out-"+task.ID+" server=[]") {
		t.Fatalf("task %s: %s %+v, want succeeded with out-%s and no HTTP server", task.ID, task.Status, task.Result, task.ID)
	}
	if task.Claim == nil || task.Claim.ExecutorID != "nats-w" {
		t.Fatalf("claim %+v, want executor nats-w", task.Claim)
	}
	doc, err := c.GetRun(ctx, task.ID)
	if err != nil || doc.Run.Phase != "exited" {
		t.Fatalf("Run %+v, %v: want phase exited, saved over NATS", doc.Run, err)
	}
}
