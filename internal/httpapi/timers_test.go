package httpapi_test

import (
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

// TestDelayedRelease checks that a runAt sent over HTTP comes back as
// sent, and releases the task. (Release and running deadlines are
// reactors' TestAlarmTimers; how the service computes runAt from runAt or
// delaySeconds is internal/scheduler's TestScheduleValidation.)
func TestDelayedRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("RunAtInThePastReleasesAtOnce", func(t *testing.T) {
		t.Parallel()
		runAt := time.Now().Add(-time.Hour).UTC()
		s := mustSchedule(t, b, api.ScheduleRequest{Queue: "past", RunAt: &runAt})
		if !s.RunAt.Equal(runAt) {
			t.Fatalf("runAt %v, want %v", s.RunAt, runAt)
		}
		q := b.waitStatus(t, s.ID, "queued")
		if q.Delivery == nil || q.Delivery.ID == "" {
			t.Fatalf("released task without a delivery: %+v", q)
		}
	})
}
