package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

// TestCLIRelease drives the real binary: show names a claim's heartbeat,
// release hands a running task's claim back (the task is claimable again,
// the attempt released and not charged, the old token's result 409
// claim_lost), and a task that is not running has no claim to release.
func TestCLIRelease(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), freeAddr(t))
	run := cliAgainst(t, srv)
	ctx := context.Background()
	id := strings.Fields(run(0, "schedule", "--queue", "cli-release", "--message", "hold"))[1]
	claimed, ok, err := srv.client.ClaimNext(ctx, "cli-release", "w-stuck", 10*time.Second, api.WithHeartbeat(60))
	if err != nil || !ok || claimed.ID != id {
		t.Fatalf("claim: %v %v %v", claimed.ID, ok, err)
	}
	if out := run(0, "show", id); !strings.Contains(out, "w-stuck (heartbeat every 60s)") {
		t.Fatalf("show of a claim with heartbeats:\n%s", out)
	}
	if out := run(0, "release", id, "--reason", "stuck executor"); !strings.Contains(out, id+" scheduled (attempt 2 due now)") {
		t.Fatalf("release:\n%s", out)
	}
	_, err = srv.client.RecordResult(ctx, id, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true})
	if !errors.Is(err, api.ErrClaimLost) {
		t.Fatalf("the released executor's result: %v", err)
	}
	if out := run(0, "show", id); !strings.Contains(out, "released by w-stuck") || !strings.Contains(out, "stuck executor") {
		t.Fatalf("show after the release:\n%s", out)
	}
	if out := run(1, "release", id); !strings.Contains(out, "not running") {
		t.Fatalf("release of a task not running:\n%s", out)
	}
}
