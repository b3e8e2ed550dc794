package main

import (
	"context"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
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
	var stats strings.Builder
	if err := run(ctx, []string{"stats", "--server", c.BaseURL}, &stats); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stats.String(), "cli") || !strings.Contains(stats.String(), "queued=1") {
		t.Fatalf("stats:\n%s", stats.String())
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
