package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
)

// TestSchedulesCommand drives `taskledger schedules` against a served
// node: create, list, show, trigger, pause, resume, history, delete.
func TestSchedulesCommand(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	startServer(t, t.TempDir(), addr)
	ctx := context.Background()
	cli := func(t *testing.T, args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, append(args, "--server", "http://"+addr), &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String()
	}
	out := cli(t, "schedules", "create", "nightly", "--cron", "30 2 * * *", "--timezone", "Europe/Berlin", "--queue", "cli-sched", "--message", "triage")
	if !strings.Contains(out, "created schedule nightly") || !strings.Contains(out, `cron "30 2 * * *" Europe/Berlin`) {
		t.Fatalf("create: %s", out)
	}
	if out := cli(t, "schedules", "list"); !strings.Contains(out, "nightly") || !strings.Contains(out, "active") {
		t.Fatalf("list: %s", out)
	}
	if out := cli(t, "schedules", "trigger", "nightly"); !strings.Contains(out, "triggered nightly: task r") {
		t.Fatalf("trigger: %s", out)
	}
	var s api.Schedule
	if err := json.Unmarshal([]byte(cli(t, "schedules", "show", "nightly", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Next) != 5 || s.RunCount != 1 || !s.Runs[0].Manual || s.Task.Queue != "cli-sched" {
		t.Fatalf("show --json: %+v", s)
	}
	if out := cli(t, "schedules", "show", "nightly"); !strings.Contains(out, "trigger") || !strings.Contains(out, "next") {
		t.Fatalf("show: %s", out)
	}
	if out := cli(t, "schedules", "pause", "nightly"); !strings.Contains(out, "paused") {
		t.Fatalf("pause: %s", out)
	}
	if out := cli(t, "schedules", "resume", "nightly"); !strings.Contains(out, "active") {
		t.Fatalf("resume: %s", out)
	}
	if out := cli(t, "schedules", "delete", "nightly"); !strings.Contains(out, "deleted") {
		t.Fatalf("delete: %s", out)
	}
	out = cli(t, "schedules", "history", "nightly")
	for _, want := range []string{"ScheduleCreated", "ScheduleFired", "triggered: task", "SchedulePaused", "ScheduleResumed", "ScheduleDeleted", "deleted (history kept)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("history lacks %q:\n%s", want, out)
		}
	}
	var buf bytes.Buffer
	if err := run(ctx, []string{"schedules", "pause", "nightly", "--server", "http://" + addr}, &buf); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("pause of a deleted schedule: %v", err)
	}
	if err := run(ctx, []string{"schedules", "create", "x", "--every", "1ms", "--server", "http://" + addr}, &buf); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("every 1ms: %v", err)
	}
	if err := run(ctx, []string{"schedules"}, &buf); !errors.Is(err, errUsage) {
		t.Fatalf("no subcommand: %v", err)
	}
}
