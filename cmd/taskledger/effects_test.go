package main

import (
	"context"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// TestShowEffectsOfTimedOutTask: the effects a run reported before it
// timed out are what `taskledger show` and `taskledger history` print.
func TestShowEffectsOfTimedOutTask(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	ctx, c := context.Background(), srv.client
	one := 1
	task, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "effects", TimeoutSeconds: &one})
	if err != nil {
		t.Fatal(err)
	}
	task = workWaitTask(t, c, task.ID, "queued", func(task api.Task) bool { return task.Status == "queued" })
	if _, err := c.Claim(ctx, task.ID, task.Delivery.ID, "w1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReportEffects(ctx, task.ID, task.Delivery.ID, []events.Effect{
		{Kind: "pull_request", Ref: "#12", URL: "https://example.com/pr/12"}, {Kind: "comment", Ref: "c-1", Uncertain: true},
	}); err != nil {
		t.Fatal(err)
	}
	workWaitTask(t, c, task.ID, "timed out", func(task api.Task) bool { return task.Status == "timed_out" })

	var show strings.Builder
	if err := run(ctx, []string{"show", "--server", c.BaseURL, task.ID}, &show); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"timed_out", "pull_request #12 https://example.com/pr/12", "comment c-1 (uncertain)"} {
		if !strings.Contains(show.String(), want) {
			t.Errorf("show does not print %q:\n%s", want, show.String())
		}
	}
	var history strings.Builder
	if err := run(ctx, []string{"history", "--server", c.BaseURL, task.ID}, &history); err != nil {
		t.Fatal(err)
	}
	if want := "reported 2 effects: pull_request #12 https://example.com/pr/12, comment c-1 (uncertain)"; !strings.Contains(history.String(), want) {
		t.Errorf("history does not print %q:\n%s", want, history.String())
	}
}
