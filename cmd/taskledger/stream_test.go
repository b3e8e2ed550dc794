package main

import (
	"context"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnode"
)

// lineWriter hands each Write to a channel until done is closed.
type lineWriter struct {
	lines chan string
	done  <-chan struct{}
}

func (w lineWriter) Write(p []byte) (int, error) {
	select {
	case w.lines <- string(p):
	case <-w.done:
	}
	return len(p), nil
}

// TestStatsAndEventsCommands: `taskledger stats` prints a task's queue
// and status count; `taskledger events` follows the stream with its
// filters and ends cleanly when interrupted.
func TestStatsAndEventsCommands(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	ctx, c := context.Background(), srv.client
	task, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "keyed", Concurrency: &events.Concurrency{Key: "repo:cli", Limit: 3}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.CreateSchedule(ctx, api.ScheduleCreateRequest{ID: "hourly", Every: "1h", Task: api.ScheduleTask{Queue: "cron"}}); err != nil {
		t.Fatal(err)
	}
	var stats strings.Builder
	testnode.Eventually(t, "the key and the schedule in the stats", func() bool {
		stats.Reset()
		if err := run(ctx, []string{"stats", "--server", c.BaseURL}, &stats); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(stats.String(), "repo:cli")
	})
	for _, want := range []string{"cli", "queued=1", "alarm lateness", "repo:cli", "hourly"} {
		if !strings.Contains(stats.String(), want) {
			t.Fatalf("stats without %q:\n%s", want, stats.String())
		}
	}
	var list strings.Builder
	if err := run(ctx, []string{"list", "--server", c.BaseURL, "--id-prefix", task.ID}, &list); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(list.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], task.ID) {
		t.Fatalf("list --id-prefix %s:\n%s", task.ID, list.String())
	}

	follow, interrupt := context.WithCancel(ctx)
	w := lineWriter{lines: make(chan string), done: follow.Done()}
	done := make(chan error, 1)
	go func() {
		done <- run(follow, []string{"events", "--server", c.BaseURL, "--type", "ReadyPublished,TaskScheduled", "--queue", "cli"}, w)
	}()
	if line := <-w.lines; !strings.Contains(line, task.ID) || !strings.Contains(line, "TaskScheduled") {
		t.Fatalf("first event line %q", line)
	}
	interrupt()
	if err := <-done; err != nil {
		t.Fatalf("events after an interrupt: %v", err)
	}
}
