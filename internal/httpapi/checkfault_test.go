package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
)

// brokenLineage is the node's projection engine with a lineage read that
// always fails.
type brokenLineage struct {
	*projections.Engine
}

var errLineage = errors.New("lineage projection exploded")

func (brokenLineage) Ancestors(string) ([]aggregate.State, error) { return nil, errLineage }

var _ scheduler.Views = brokenLineage{}

// counterValue reads a Prometheus counter.
func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestCheckFailsOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	metrics := scheduler.NewMetrics(nil)
	svc, err := scheduler.New(scheduler.Config{
		Store: b.node.Store, Views: brokenLineage{b.node.Engine}, JS: b.node.Store.JetStream(),
		Logger: zerolog.Nop(), Metrics: metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.NewHandler(httpapi.ServerConfig{Service: svc, Ready: b.node.Engine})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(validated(t, h))
	t.Cleanup(srv.Close)
	faulty := api.NewClient(srv.URL, "")
	t.Cleanup(faulty.HTTP.CloseIdleConnections)

	task := queuedTask(t, b, api.ScheduleRequest{Queue: "faulty"})
	if _, err := b.client.AppendMail(ctx, task.ID, text("m1", "hello")); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, metrics.CheckFailures); got != 0 {
		t.Fatalf("check failures %v before any check", got)
	}

	ch, err := faulty.Check(ctx, task.ID, "")
	if err != nil {
		t.Fatalf("a failing check must still answer 200: %v", err)
	}
	if ch.ShouldStop || ch.Reason != "check_failed" {
		t.Fatalf("failing check answered %+v, want shouldStop false reason check_failed", ch)
	}
	// The messages are handed out even so; no claim holds the queued
	// task, so the check peeks and the cursor stays.
	if ch.Cursor != 0 || !slices.Equal(mailIDs(ch.Messages), []string{"m1"}) {
		t.Fatalf("failing check messages %+v cursor %d, want m1 and cursor 0", ch.Messages, ch.Cursor)
	}
	if got := counterValue(t, metrics.CheckFailures); got != 1 {
		t.Fatalf("check failures %v, want 1", got)
	}

	ch, err = faulty.Check(ctx, task.ID, "")
	if err != nil || ch.ShouldStop || ch.Reason != "check_failed" || len(ch.Messages) != 1 || ch.Cursor != 0 {
		t.Fatalf("second failing check: %v %+v", err, ch)
	}
	if got := counterValue(t, metrics.CheckFailures); got != 2 {
		t.Fatalf("check failures %v, want 2", got)
	}
	// The task's history shows it: one CheckFailed, at most one a minute.
	if n := countType(t, b, task.ID, "CheckFailed"); n != 1 {
		t.Fatalf("%d CheckFailed events in the history, want 1", n)
	}

	// The healthy node answers normally, and other routes of the faulty
	// server are unaffected.
	ch, err = b.client.Check(ctx, task.ID, "")
	if err != nil || ch.ShouldStop || ch.Reason != "active" {
		t.Fatalf("healthy check: %v %+v", err, ch)
	}
	if got, err := faulty.Get(ctx, task.ID); err != nil || got.ID != task.ID {
		t.Fatalf("get through the faulty server: %v %+v", err, got)
	}

	// A terminal task needs no lineage read: it stops without a fault.
	if _, err := b.client.Cancel(ctx, task.ID, "done"); err != nil {
		t.Fatal(err)
	}
	ch, err = faulty.Check(ctx, task.ID, "")
	if err != nil || !ch.ShouldStop || ch.Reason != "terminal" {
		t.Fatalf("check on a terminal task through the faulty server: %v %+v", err, ch)
	}
	// A malformed id is still a 400, not a fail-open answer.
	_, err = faulty.Check(ctx, "bad.id", "")
	apiError(t, err, http.StatusBadRequest, "")
	if got := counterValue(t, metrics.CheckFailures); got != 2 {
		t.Fatalf("check failures %v, want still 2", got)
	}
}
