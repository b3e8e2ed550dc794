package httpapi_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/projections"
)

// TestDigestAfterRebuild: the digest /readyz?digest=1 answers is a
// function of the log position alone. A task queued longer than the
// alarm's republish check (a minute) has that check postponed without an
// event; the projections rebuilt from the log then still show the live
// digest.
func TestDigestAfterRebuild(t *testing.T) {
	t.Parallel()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	clk := newClock(t0)
	b := setup(t, func(c *node.Config) { c.Now = clk.Now })
	digest := func() string {
		t.Helper()
		a := rawDo(t, b, http.MethodGet, "/readyz?digest=1", "")
		var body struct{ Digest string }
		if err := json.Unmarshal(a.body, &body); a.status != http.StatusOK || err != nil || body.Digest == "" {
			t.Fatalf("readyz: %d %s (%v)", a.status, a.body, err)
		}
		return body.Digest
	}
	rebuild := func() {
		t.Helper()
		if a := rawDo(t, b, http.MethodPost, "/v1/admin/projections/rebuild", ""); a.status != http.StatusOK {
			t.Fatalf("rebuild: %d %s", a.status, a.body)
		}
	}
	queuedTask(t, b, api.ScheduleRequest{})
	rebuild()
	if first, again := digest(), digest(); first != again {
		t.Fatalf("the digest of unchanged projections changed: %s, then %s", first, again)
	}

	// Two minutes on: the alarm checks the notification (a task
	// scheduled for later wakes it on the new clock), finds it stored and
	// postpones the next check, appending nothing.
	clk.set(t0.Add(2 * time.Minute))
	mustSchedule(t, b, api.ScheduleRequest{DelaySeconds: new(3600.0)})
	eventually(t, "the republish check postponed", func() bool {
		next, ok := b.node.Engine.Next(projections.Republish, clk.Now(), nil)
		return ok && !next.Before(t0.Add(time.Minute))
	})
	live := digest()
	rebuild()
	if got := digest(); got != live {
		t.Fatalf("digest after the rebuild %s, live %s", got, live)
	}
}
