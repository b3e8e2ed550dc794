package bench

import (
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
)

// TestLocal checks that httpapi.Local answers as a server would: the same
// statuses and error codes the SDK's worker branches on.
func TestLocal(t *testing.T) {
	t.Parallel()
	srv, nc, err := startServer(filepath.Join(t.TempDir(), "nats"), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	t.Cleanup(nc.Close)
	r := &run{log: io.Discard}
	err = r.withNode(t.Context(), nc, node.Config{}, func(nd *node.Node) error {
		l := httpapi.NewLocal(nd.Service)
		status := func(name string, err error, want int, code string) {
			t.Helper()
			var e *api.Error
			if !errors.As(err, &e) || e.Status != want || e.Code != code {
				t.Errorf("%s: error %v, want *api.Error %d %s", name, err, want, code)
			}
		}
		_, err := l.Get(t.Context(), "no-such-task")
		status("Get missing", err, http.StatusNotFound, "not_found")
		_, err = l.Get(t.Context(), "bad.id")
		status("Get malformed", err, http.StatusBadRequest, "invalid_argument")
		_, _, err = l.ClaimNext(t.Context(), "", "exec-1", -time.Second)
		status("ClaimNext negative wait", err, http.StatusBadRequest, "invalid_argument")

		task, created, err := l.Schedule(t.Context(), scheduleRequest(1, "local"))
		if err != nil || !created {
			t.Fatalf("Schedule = %v, created %v", err, created)
		}
		again := scheduleRequest(1, "local")
		again.RequestID = "req-1"
		first, created, err := l.Schedule(t.Context(), again)
		if err != nil || !created {
			t.Fatalf("Schedule with a request id = %v, created %v", err, created)
		}
		if second, created, err := l.Schedule(t.Context(), again); err != nil || created || second.ID != first.ID {
			t.Errorf("repeated Schedule = %s, created %v, %v; want %s, not created", second.ID, created, err, first.ID)
		}
		_, err = l.Claim(t.Context(), task.ID, "wrong-token", "exec-1")
		status("Claim with a wrong token", err, http.StatusConflict, "conflict")

		claimed, ok, err := l.ClaimNext(t.Context(), "local", "exec-1", 5*time.Second)
		if err != nil || !ok || claimed.Claim == nil {
			t.Fatalf("ClaimNext = %+v, %v, %v; want a claimed task", claimed, ok, err)
		}
		if ch, err := l.Check(t.Context(), claimed.ID, claimed.Claim.DeliveryID); err != nil || ch.ShouldStop {
			t.Errorf("Check = %+v, %v; want continue", ch, err)
		}
		done, err := l.RecordResult(t.Context(), claimed.ID, api.ResultRequest{DeliveryID: claimed.Claim.DeliveryID, Success: true})
		if err != nil || done.Status != "succeeded" {
			t.Errorf("RecordResult = %s, %v; want succeeded", done.Status, err)
		}
		_, err = l.Cancel(t.Context(), claimed.ID, "too late")
		status("Cancel a terminal task", err, http.StatusConflict, "conflict")
		if m, err := l.Mailbox(t.Context(), claimed.ID, 0); err != nil || len(m.Messages) != 0 {
			t.Errorf("Mailbox = %+v, %v; want no messages", m, err)
		}
		_, err = l.Mailbox(t.Context(), claimed.ID, -1)
		status("Mailbox after -1", err, http.StatusBadRequest, "invalid_argument")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
