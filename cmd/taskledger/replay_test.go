package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testlog"
)

// replayCLI runs the taskledger binary and returns its stdout, stderr and
// exit code.
// cliAgainst returns a runner of the real binary against srv: it runs
// the command with --server, fails the test unless it exits wantCode, and
// returns its stdout and stderr together.
func cliAgainst(t *testing.T, srv *process) func(wantCode int, args ...string) string {
	server := []string{"--server", srv.client.BaseURL}
	return func(wantCode int, args ...string) string {
		t.Helper()
		out, errOut, code := replayCLI(t, append(args, server...)...)
		if code != wantCode {
			t.Fatalf("taskledger %v: exit %d, want %d\nstdout %s\nstderr %s", args, code, wantCode, out, errOut)
		}
		return out + errOut
	}
}

func replayCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, taskledgerBinary(t), args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("taskledger %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// replayStopServer ends a server with SIGTERM, as an operator would, and waits.
func replayStopServer(t *testing.T, p *process) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("server exited with %v", err)
		}
	case <-time.After(90 * time.Second):
		p.cmd.Process.Kill()
		<-done
		t.Fatal("server did not stop within 90s of SIGTERM")
	}
}

// replayReadyz is the server's readiness answer with its projection digest.
type replayReadyz struct {
	Applied  uint64 `json:"applied"`
	CaughtUp bool   `json:"caughtUp"`
	Digest   string `json:"digest"`
}

// replayStartServer runs `taskledger serve` with an info-level JSON log
// kept in memory and waits until its projections have caught up.
func replayStartServer(t *testing.T, dataDir, addr string) (*process, *testlog.Buffer, replayReadyz) {
	t.Helper()
	logs := &testlog.Buffer{}
	cmd := exec.Command(taskledgerBinary(t), "serve", "--data", dataDir, "--http", addr, "--log-format", "json", "--log-level", "info")
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, client: api.NewClient("http://"+addr, "")}
	t.Cleanup(func() { p.kill() })
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/readyz?digest=1")
		if err == nil {
			var r replayReadyz
			err = json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK && r.CaughtUp {
				return p, logs, r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server on %s not ready: %v\nlog:\n%s", addr, err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replayLogLine returns the first JSON log line with message msg, waiting
// up to 10 s for it: the server's stderr reaches logs through a pipe and
// a copying goroutine, so a line written before the server answered ready
// can still be on its way.
func replayLogLine(t *testing.T, logs *testlog.Buffer, msg string) (map[string]any, bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["message"] == msg {
				return line, true
			}
		}
		if time.Now().After(deadline) {
			return nil, false
		}
	}
}

// replayTraffic schedules 20 roots and a child on a server, sends mail,
// cancels one and runs every other to a result. It returns the roots.
func replayTraffic(t *testing.T, c *api.Client) []string {
	t.Helper()
	ctx := context.Background()
	msg := func(s string) events.Message {
		return events.Message{Content: []events.ContentPart{{Type: "text", Text: s}}}
	}
	var roots []string
	for i := range 20 {
		task, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "cli", Message: msg(fmt.Sprintf("root %d", i))})
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, task.ID)
	}
	if _, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "cli", ParentID: roots[0], Message: msg("child")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AppendMail(ctx, roots[1], msg("a follow-up")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, roots[2], "not needed"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	// 19 roots and the child, unless roots[0] ended first: the claim
	// that finds the child then cancels it (ancestor_terminal).
	for claimed := 0; claimed < 20; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 20 claims after 60s", claimed)
		}
		if claimed == 19 && childClosed(ctx, t, c, roots[0]) {
			break
		}
		task, ok, err := c.ClaimNext(ctx, "cli", "cli-exec", 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		claimed++
		if task.ID == roots[1] {
			if ch, err := c.Check(ctx, task.ID, task.Claim.DeliveryID); err != nil || len(ch.Messages) != 1 {
				t.Fatalf("check: %+v %v", ch, err)
			}
		}
		if _, err := c.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true, Summary: "done"}); err != nil {
			t.Fatal(err)
		}
	}
	return roots
}

// childClosed reports whether the child of root ended canceled by a claim
// (ancestor_terminal) because root had ended first.
func childClosed(ctx context.Context, t *testing.T, c *api.Client, root string) bool {
	t.Helper()
	tree, err := c.Tree(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	return len(tree.Children) == 1 && tree.Children[0].Task.Status == "canceled"
}

var replayVerifySummary = regexp.MustCompile(`(?m)^(\d+) events, (\d+) tasks, (\d+) violations$`)

// TestReplayCommands runs the offline log tools of the binary against the
// data directory a stopped server left: verify (text and JSON), history
// --offline, rebuild, and a restart that loads the rebuilt snapshot.
func TestReplayCommands(t *testing.T) {
	t.Parallel()
	data, addr := t.TempDir(), freeAddr(t)
	srv := startServer(t, data, addr)
	roots := replayTraffic(t, srv.client)
	mailed, err := srv.client.History(context.Background(), roots[1])
	if err != nil {
		t.Fatal(err)
	}
	replayStopServer(t, srv)

	var lastSeq uint64
	t.Run("Verify", func(t *testing.T) {
		out, errOut, code := replayCLI(t, "replay", "verify", "--data", data)
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		m := replayVerifySummary.FindStringSubmatch(out)
		if m == nil || m[3] != "0" || m[2] != "21" {
			t.Fatalf("output %q, want N events, 21 tasks, 0 violations", out)
		}
		if !strings.Contains(errOut, "verify:") {
			t.Errorf("no progress on stderr: %q", errOut)
		}
	})

	t.Run("VerifyJSON", func(t *testing.T) {
		out, errOut, code := replayCLI(t, "replay", "verify", "--data", data, "--json")
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		var report struct {
			Events     int               `json:"events"`
			Tasks      int               `json:"tasks"`
			LastSeq    uint64            `json:"lastSeq"`
			Violations []json.RawMessage `json:"violations"`
		}
		if err := json.Unmarshal([]byte(out), &report); err != nil {
			t.Fatalf("%v in %q", err, out)
		}
		if report.Events == 0 || uint64(report.Events) != report.LastSeq || report.Tasks != 21 || len(report.Violations) != 0 {
			t.Fatalf("report %+v", report)
		}
		lastSeq = report.LastSeq
	})

	t.Run("HistoryOffline", func(t *testing.T) {
		if lastSeq == 0 {
			t.Fatal("needs the log's last sequence from VerifyJSON")
		}
		out, errOut, code := replayCLI(t, "history", roots[1], "--offline", "--data", data, "--ndjson")
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		var got, want []uint64
		for _, e := range mailed.Events {
			want = append(want, e.Seq)
		}
		for line := range strings.Lines(out) {
			var e struct {
				Seq    uint64 `json:"seq"`
				TaskID string `json:"taskId"`
				Type   string `json:"type"`
				Status string `json:"status"`
			}
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			if e.TaskID != roots[1] || e.Type == "" || e.Status == "" {
				t.Fatalf("line %q", line)
			}
			got = append(got, e.Seq)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("offline history seqs %v, server said %v", got, want)
		}

		out, _, code = replayCLI(t, "history", roots[0], "--tree", "--offline", "--data", data)
		if code != 0 || !strings.Contains(out, "TASK") || !strings.Contains(out, "succeeded") || strings.Count(out, "TaskScheduled") != 2 {
			t.Fatalf("tree history (exit %d):\n%s", code, out)
		}

		out, _, code = replayCLI(t, "history", "--customer", "default", "--since", "1h", "--offline", "--data", data, "--ndjson")
		if n := strings.Count(out, "\n"); code != 0 || uint64(n) != lastSeq {
			t.Fatalf("customer history (exit %d): %d lines, want %d", code, n, lastSeq)
		}

		_, errOut, code = replayCLI(t, "history", "NOSUCHTASK", "--offline", "--data", data)
		if code != 1 || !strings.Contains(errOut, "not in the log") {
			t.Fatalf("unknown task: exit %d, %q", code, errOut)
		}
	})

	t.Run("RebuildThenServe", func(t *testing.T) {
		if lastSeq == 0 {
			t.Fatal("needs the log's last sequence from VerifyJSON")
		}
		out, errOut, code := replayCLI(t, "replay", "rebuild", "--data", data)
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		m := regexp.MustCompile(`^rebuilt (\d+) events in .*; snapshot written; digest ([0-9a-f]{64})\n$`).FindStringSubmatch(out)
		if m == nil || m[1] != strconv.FormatUint(lastSeq, 10) {
			t.Fatalf("output %q, want rebuilt %d events", out, lastSeq)
		}
		srv, logs, ready := replayStartServer(t, data, freeAddr(t))
		defer replayStopServer(t, srv)
		line, ok := replayLogLine(t, logs, "projection snapshot loaded")
		if !ok || line["applied"] != float64(lastSeq) {
			t.Fatalf("the rebuilt snapshot was not loaded (%v); log:\n%s", line, logs.String())
		}
		if ready.Applied != lastSeq || ready.Digest != m[2] {
			t.Fatalf("serving at %d with digest %s; rebuilt %d with %s", ready.Applied, ready.Digest, lastSeq, m[2])
		}
	})

	t.Run("VerifyReportsViolation", func(t *testing.T) {
		// Append garbage to the log behind taskledger's back.
		js, stop := dataJS(t, data)
		ack, err := js.Publish(context.Background(), "tl.evt.default.planted", []byte("not an event"))
		stop()
		if err != nil {
			t.Fatal(err)
		}
		out, _, code := replayCLI(t, "replay", "verify", "--data", data)
		want := fmt.Sprintf("seq %d task planted: undecodable: ", ack.Sequence)
		if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, " 1 violations\n") {
			t.Fatalf("exit %d, output %q; want exit 1 and %q", code, out, want)
		}
		out, _, code = replayCLI(t, "replay", "verify", "--data", data, "--json")
		var report struct {
			Violations []struct {
				Seq    uint64 `json:"seq"`
				TaskID string `json:"taskId"`
				Kind   string `json:"kind"`
			} `json:"violations"`
		}
		if err := json.Unmarshal([]byte(out), &report); err != nil || code != 1 || len(report.Violations) != 1 ||
			report.Violations[0].Seq != ack.Sequence || report.Violations[0].Kind != "undecodable" {
			t.Fatalf("exit %d, report %+v (%v)", code, report, err)
		}
	})
}
