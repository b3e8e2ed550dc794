package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testlog"
	"github.com/taskledger/taskledger/projections"
)

// stuckViews is the node's projection engine that never catches up with
// a write: every write answers 503 after it is appended, as when the
// projections lag.
type stuckViews struct {
	*projections.Engine
}

func (stuckViews) WaitFor(context.Context, events.Position) error { return context.DeadlineExceeded }

// ApplyOwn folds nothing in either: every write waits, and times out.
func (stuckViews) ApplyOwn([]events.Event) bool { return false }

var _ scheduler.Views = stuckViews{}

// TestRepeatedErrorsLoggedOnce is row 12: 300 identical 503s make one
// log line, not 300.
func TestRepeatedErrorsLoggedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var sink testlog.Buffer
	log := zerolog.New(&sink)
	svc, err := scheduler.New(scheduler.Config{
		Store: b.node.Store, Views: stuckViews{b.node.Engine}, JS: b.node.Store.JetStream(),
		Logger: zerolog.Nop(), Metrics: scheduler.NewMetrics(nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.NewHandler(httpapi.ServerConfig{Service: svc, Ready: b.node.Engine, Logger: log, ErrorLog: ratelog.New(log, time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	stuck := api.NewClient(srv.URL, "")
	t.Cleanup(stuck.HTTP.CloseIdleConnections)

	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			_, _, err := stuck.Schedule(ctx, api.ScheduleRequest{Queue: "stuck", RequestID: fmt.Sprintf("stuck-%d", i)})
			if !errors.Is(err, api.ErrUnavailable) {
				t.Errorf("schedule through stuck projections: %v, want 503 unavailable", err)
			}
		})
	}
	wg.Wait()
	if n := len(sink.Lines()); n != 1 {
		t.Fatalf("300 identical 503s logged %d lines, want 1:\n%s", n, sink.String())
	}
}
