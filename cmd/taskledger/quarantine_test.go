package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnode"
)

// TestQuarantineWithTheBinary: a garbage message appended to a task's
// subject of a stopped server's log (as a local process with access to
// the stream could). The server starts, the task answers corrupt_event,
// a customer's events carry the marker and a later task's events, /readyz
// warns, also after a start from the snapshot replay rebuild wrote, and
// replay quarantine lists the message.
func TestQuarantineWithTheBinary(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	ctx := context.Background()

	srv, _, _ := replayStartServer(t, data, freeAddr(t))
	hurt, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	hurt = testnode.Settled(t, srv.client, hurt)
	replayStopServer(t, srv)

	js, stop := dataJS(t, data)
	ack, err := js.Publish(ctx, events.DefaultSubjects.Event(hurt.CustomerID, hurt.ID), []byte("\xc1 not an event"))
	stop()
	if err != nil {
		t.Fatal(err)
	}
	garbage := ack.Sequence

	addr := freeAddr(t)
	srv, _, _ = replayStartServer(t, data, addr)
	_, err = srv.client.Get(ctx, hurt.ID)
	if e, ok := errors.AsType[*api.Error](err); !ok || !errors.Is(err, api.ErrCorruptEvent) || e.Status != http.StatusInternalServerError || e.Seq != garbage {
		t.Fatalf("GET of the task with the garbage: %v, want 500 corrupt_event at %d", err, garbage)
	}
	later, _, err := srv.client.Schedule(ctx, api.ScheduleRequest{Queue: "poison"})
	if err != nil {
		t.Fatal(err)
	}
	later = testnode.Settled(t, srv.client, later)
	var marker, afterMarker bool
	err = srv.client.CustomerEvents(ctx, hurt.CustomerID, time.Time{}, func(e api.Event) error {
		switch {
		case e.Type == api.EventQuarantined:
			marker = e.Seq == garbage && e.TaskID == hurt.ID
		case marker && e.TaskID == later.ID:
			afterMarker = true
		}
		return nil
	})
	if err != nil || !marker || !afterMarker {
		t.Fatalf("customer events: marker %v, later task after it %v, err %v", marker, afterMarker, err)
	}
	requireReadyzWarns(t, addr)
	replayStopServer(t, srv)

	// replay rebuild folds the log past the garbage and writes a
	// snapshot: the next start restores it, does not read the garbage
	// again, and still reports it.
	if out, errOut, code := replayCLI(t, "replay", "rebuild", "--data", data); code != 0 {
		t.Fatalf("replay rebuild: exit %d\n%s\n%s", code, out, errOut)
	}
	addr = freeAddr(t)
	srv, _, _ = replayStartServer(t, data, addr)
	requireReadyzWarns(t, addr)
	replayStopServer(t, srv)

	out, errOut, code := replayCLI(t, "replay", "quarantine", "--data", data)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("seq %d %s", garbage, events.DefaultSubjects.Event(hurt.CustomerID, hurt.ID))) ||
		!strings.Contains(out, "task "+hurt.ID) || !strings.Contains(out, ", 1 quarantined") {
		t.Fatalf("replay quarantine: exit %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code = replayCLI(t, "replay", "quarantine", "--data", data, "--json")
	var lines []quarantinedMessage
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var q quarantinedMessage
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, q)
	}
	if code != 0 || len(lines) != 1 || lines[0].Seq != garbage || lines[0].Task != hurt.ID || lines[0].Customer != hurt.CustomerID || !strings.Contains(lines[0].Reason, "malformed") {
		t.Fatalf("replay quarantine --json: exit %d %+v\n%s", code, lines, errOut)
	}
}

// requireReadyzWarns fails t unless the server at addr answers /readyz
// 200 with a warning about quarantined messages.
func requireReadyzWarns(t *testing.T, addr string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Log string `json:"log"`
	}
	if err := json.Unmarshal(body, &r); err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(r.Log, "quarantined (skipped): 1;") {
		t.Fatalf("/readyz: %d %s, want 200 warning about 1 quarantined message", resp.StatusCode, body)
	}
}
