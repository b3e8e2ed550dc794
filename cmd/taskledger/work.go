package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
	readyStream := fs.String("ready-stream", events.ReadyStreamName(events.DefaultStream), "ready notification stream (with --nats-url)")
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
	if nf.url != "" {
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
		return runCommand(ctx, *command, cf.server, run, func(line string) {
			outMu.Lock()
			fmt.Fprintf(stdout, "[%s] %s\n", run.Task.ID, line)
			outMu.Unlock()
		})
	}
	log.Info().Str("queue", *queue).Str("exec", *command).Msg("worker started")
	w, err := executor.NewWorker(cfg, h)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// runCommand runs command for one task in its own process group, streams
// its output line by line, and kills the whole group when ctx is
// cancelled (a stop check said stop) or when the shell exits (so nothing
// it started in the background outlives the run). It returns the last
// lines of output and an error for a non-zero exit.
func runCommand(ctx context.Context, command, server string, run *executor.Run, emit func(string)) (string, error) {
	t := run.Task
	input, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.Stdin = strings.NewReader(string(input) + "\n")
	cmd.Env = append(os.Environ(),
		"TASKLEDGER_TASK_ID="+t.ID, "TASKLEDGER_ROOT_ID="+t.RootID, "TASKLEDGER_PARENT_ID="+t.ParentID,
		"TASKLEDGER_CUSTOMER_ID="+t.CustomerID, "TASKLEDGER_QUEUE="+t.Queue, "TASKLEDGER_SERVER="+server,
		"TASKLEDGER_DELIVERY_ID="+t.Claim.DeliveryID, "TASKLEDGER_ATTEMPT="+strconv.Itoa(t.Attempt),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
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
	err = cmd.Start()
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
	err = cmd.Wait()
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
		return summary, fmt.Errorf("command exited with status %d", exitErr.ExitCode())
	}
	return summary, err
}
