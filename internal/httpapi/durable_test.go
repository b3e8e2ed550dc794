package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// countedCommit is the package server's group commit, counting its
// callers, that fails while failing is set (an fsync's EIO).
type countedCommit struct {
	*broker.Embedded
	calls   atomic.Int64
	failing atomic.Bool
}

func (c *countedCommit) Sync(ctx context.Context) error {
	c.calls.Add(1)
	if c.failing.Load() {
		return errors.New("fsync: input/output error")
	}
	return c.Embedded.Sync(ctx)
}

// TestDurableAnswers: the answer to a write waits for the group commit
// (and a read's does not); when the fsync fails, the write is answered
// 503, never as done.
func TestDurableAnswers(t *testing.T) {
	c := &countedCommit{Embedded: testnats.Server()}
	b := testnode.Start(t, func(cfg *node.Config) { cfg.Durable = c })
	ctx := t.Context()
	rounds := testnats.Server().CommitStats().Rounds
	task, created, err := b.Client.Schedule(ctx, api.ScheduleRequest{Queue: "durable", Message: text("", "on disk")})
	if err != nil || !created {
		t.Fatalf("schedule: created %v, %v", created, err)
	}
	if c.calls.Load() != 1 || testnats.Server().CommitStats().Rounds == rounds {
		t.Fatalf("the schedule's answer made %d Sync calls and the rounds went from %d to %d; want 1 call and a round",
			c.calls.Load(), rounds, testnats.Server().CommitStats().Rounds)
	}
	if _, err := b.Client.Get(ctx, task.ID); err != nil {
		t.Fatal(err)
	}
	if c.calls.Load() != 1 {
		t.Fatalf("a GET waited for the group commit (%d calls)", c.calls.Load())
	}
	c.failing.Store(true)
	_, _, err = b.Client.Schedule(ctx, api.ScheduleRequest{Queue: "durable", Message: text("", "not on disk")})
	var e *api.Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || e.Code != api.ErrUnavailable.Code {
		t.Fatalf("schedule while fsync fails: %v, want 503 unavailable", err)
	}
	c.failing.Store(false)
	if _, err := b.Client.Cancel(ctx, task.ID, "done"); err != nil {
		t.Fatalf("cancel once fsync works again: %v", err)
	}
}
