package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// summaryLines is how many trailing output lines become the result summary.
const summaryLines = 20

func workCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("work")
	var cf clientFlags
	cf.register(fs)
	var nf natsFlags
	nf.registerRemote(fs)
	queue := fs.String("queue", events.DefaultQueue, "queue to take tasks from")
	command := fs.String("exec", "", "shell command run per task (task JSON on stdin, TASKLEDGER_* in the environment)")
	executorID := fs.String("executor-id", "", "stable executor id (default: host name)")
	concurrency := fs.Int("concurrency", 1, "tasks run at once")
	checkEvery := fs.Duration("check-interval", 3*time.Second, "how often to ask whether to stop")
	heartbeat := fs.Int("heartbeat", executor.DefaultHeartbeatSeconds, "heartbeat interval of the claims in seconds, 1 to 3600 (-1: none); a dead worker's claims are lost after it")
	readyStream := fs.String("ready-stream", events.ReadyStreamName(events.DefaultStream), "ready notification stream (with --nats-url and --server)")
	customer := fs.String("customer", "", "the customer id of --token, for the API over NATS (--nats-url without --server); the token may publish only that customer's requests")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "auto", "text, json, or auto")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *command == "" {
		return fmt.Errorf("%w: --exec is required", errUsage)
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return err
	}
	cfg := executor.WorkerConfig{
		API: cf.client(), Queue: *queue, ExecutorID: *executorID, Concurrency: *concurrency,
		CheckInterval: *checkEvery, ReadyStream: *readyStream, Logger: log, HeartbeatSeconds: *heartbeat,
	}
	serverGiven := false
	fs.Visit(func(f *flag.Flag) { serverGiven = serverGiven || f.Name == "server" })
	switch {
	case nf.url != "" && !serverGiven:
		// The API over NATS: every call (claims, heartbeats, Run saves,
		// results) is a NATS request as the token's customer, and the
		// checkpoints are the scheduler's Runs.
		if cf.token != "" && *customer == "" {
			return fmt.Errorf("%w: --customer is required with --token over NATS (--nats-url without --server)", errUsage)
		}
		if *customer == "" {
			*customer = "operator"
		}
		var opts []nats.Option
		if nf.ca != "" {
			opts = append(opts, nats.RootCAs(nf.ca))
		}
		if nf.cert != "" || nf.key != "" {
			opts = append(opts, nats.ClientCert(nf.cert, nf.key))
		}
		nc, err := api.ConnectNATS(nf.url, *customer, cf.token, append(opts, nats.Name("taskledger work"))...)
		if err != nil {
			return err
		}
		defer nc.Drain()
		cfg.API = api.NewNATSClient(nc, events.DefaultSubjects.Root, *customer, cf.token)
		cf.server = "" // a command run per task gets no HTTP server (TASKLEDGER_SERVER empty)
	case nf.url != "":
		// NATS mode: notifications from the shared durable consumer and
		// checkpoints in a KV bucket, so a restarted worker resumes.
		nc, _, closeNATS, err := nf.connect(log)
		if err != nil {
			return err
		}
		defer closeNATS()
		if cfg.JS, err = jetstream.New(nc); err != nil {
			return err
		}
		if cfg.Checkpoints, err = executor.OpenKVCheckpoints(ctx, cfg.JS, ""); err != nil {
			return err
		}
	}
	var outMu sync.Mutex
	h := func(ctx context.Context, run *executor.Run) (string, error) {
		// The Run says what runs and how it ended: a successor that resumes
		// it after this worker died sees the command was started (and, by
		// the guard, killed with the worker) and runs it once more.
		if _, err := run.SaveContext(ctx, "command", commandRun{Command: *command, Attempt: run.Task.Attempt}); err != nil {
			return "", err
		}
		if err := run.SetPhase(ctx, "running"); err != nil {
			return "", err
		}
		summary, err := runCommand(ctx, *command, cf.server, run, func(line string) {
			outMu.Lock()
			fmt.Fprintf(stdout, "[%s] %s\n", run.Task.ID, line)
			outMu.Unlock()
		})
		var status *exitStatus
		if err == nil || errors.As(err, &status) {
			code := 0
			if status != nil {
				code = status.code
			}
			if _, serr := run.SaveContext(ctx, "exit", commandExit{Status: code, OutputTail: summary}); serr != nil {
				return summary, serr
			}
			if serr := run.SetPhase(ctx, "exited"); serr != nil {
				return summary, serr
			}
		}
		return summary, err
	}
	log.Info().Str("queue", *queue).Str("exec", *command).Msg("worker started")
	w, err := executor.NewWorker(cfg, h)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// runCommand runs command for one task in its own process group, under a
// guard (guardChild) that takes the group down if this process dies, even
// by kill -9; streams its output line by line; and kills the whole group
// when ctx is cancelled (a stop check said stop, or the worker stops) or
// when the shell exits (so nothing it started in the background outlives
// the run). It returns the last
// lines of output and an error for a non-zero exit.
func runCommand(ctx context.Context, command, server string, run *executor.Run, emit func(string)) (string, error) {
	t := run.Task
	input, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	cmd, err := guarded(ctx, command,
		"TASKLEDGER_TASK_ID="+t.ID, "TASKLEDGER_ROOT_ID="+t.RootID, "TASKLEDGER_PARENT_ID="+t.ParentID,
		"TASKLEDGER_CUSTOMER_ID="+t.CustomerID, "TASKLEDGER_QUEUE="+t.Queue, "TASKLEDGER_SERVER="+server,
		"TASKLEDGER_DELIVERY_ID="+t.Claim.DeliveryID, "TASKLEDGER_ATTEMPT="+strconv.Itoa(t.Attempt), "TASKLEDGER_KIND="+t.Kind,
	)
	if err != nil {
		return "", err
	}
	cmd.Stdin = strings.NewReader(string(input) + "\n")
	cmd.WaitDelay = 5 * time.Second
	// An *os.File, not an io.Pipe: Wait then returns when the shell exits
	// instead of waiting (WaitDelay, then ErrWaitDelay) for processes it
	// left running with the pipe open.
	pr, pw, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	err = startGuarded(cmd)
	pw.Close() // the child holds its own copy
	if err != nil {
		return "", err
	}
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			emit(sc.Text())
			if tail = append(tail, sc.Text()); len(tail) > summaryLines {
				tail = tail[1:]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err = waitGuarded(cmd)
	// The shell is gone: end whatever it left in its process group, so
	// nothing outlives the run and the output pipe reaches EOF.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(5 * time.Second): // a process that left the group holds the pipe
		pr.Close()
		<-done
	}
	summary := strings.Join(tail, "\n")
	if len(summary) > events.MaxSummaryBytes {
		summary = summary[len(summary)-events.MaxSummaryBytes:]
	}
	// Without invalid UTF-8 (a rune the cut split, binary output): JSON
	// would turn each such byte into a longer replacement character and
	// push the summary over its limit.
	summary = strings.ToValidUTF8(summary, "")
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && ctx.Err() == nil {
		return summary, &exitStatus{code: exitErr.ExitCode()}
	}
	return summary, err
}

// exitStatus is a command's non-zero exit.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }

// commandRun and commandExit are the Run contexts "command" and "exit" of
// a task work --exec runs: what it started, and how that ended (the last
// lines of output, as in the result's summary).
type (
	commandRun struct {
		Command string `json:"command"`
		Attempt int    `json:"attempt"`
	}
	commandExit struct {
		Status     int    `json:"status"`
		OutputTail string `json:"outputTail"`
	}
)
