package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// TestQuarantinedMessage: one undecodable message on a task's subject, as
// an attacker with access to the stream, a bug or damaged storage could
// leave there. That task answers 500 corrupt_event naming the message's
// sequence (never 503 for good); GET /v1/events and the event stream
// carry a Quarantined marker in its place and every later event, a resume
// across it goes on; /readyz warns, and operators see the sequence in
// /readyz?digest=1 and GET /v1/stats, customers do not.
func TestQuarantinedMessage(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	a := tokenClient(t, b, "tok-a")
	ctx := context.Background()

	hurt := mustScheduleAs(t, a, api.ScheduleRequest{Queue: "poison"})
	before := mustScheduleAs(t, a, api.ScheduleRequest{Queue: "poison"})
	ack, err := b.node.Store.JetStream().Publish(ctx, b.node.Store.Subjects().Event("A", hurt.ID), []byte("\xc1 not an event"))
	if err != nil {
		t.Fatal(err)
	}
	garbage := ack.Sequence
	after := mustScheduleAs(t, a, api.ScheduleRequest{Queue: "poison-after"}) // a later event of another task
	if err := b.node.Engine.WaitFor(ctx, events.Position(garbage+1)); err != nil {
		t.Fatal(err)
	}

	t.Run("TaskAnswersCorruptEvent", func(t *testing.T) {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/v1/tasks/" + hurt.ID, ""},
			{"GET", "/v1/tasks/" + hurt.ID + "/history", ""},
			{"POST", "/v1/tasks/" + hurt.ID + "/cancel", `{"reason":"stop"}`},
		} {
			ans := authDo(t, b, "Bearer tok-a", r.method, r.path, r.body)
			requireErrorBody(t, ans, http.StatusInternalServerError, "corrupt_event")
			var e api.Error
			if err := json.Unmarshal(ans.body, &e); err != nil || e.Seq != garbage || !strings.Contains(e.Message, fmt.Sprint(garbage)) {
				t.Fatalf("%s %s: %s, want seq %d named", r.method, r.path, ans.body, garbage)
			}
		}
		// The Go client sees the sentinel, and the other tasks are fine.
		if _, err := a.Get(ctx, hurt.ID); err == nil || !strings.Contains(err.Error(), "corrupt_event") {
			t.Fatalf("client Get: %v, want corrupt_event", err)
		}
		for _, id := range []string{before.ID, after.ID} {
			if _, err := a.Get(ctx, id); err != nil {
				t.Fatalf("task %s beside the corrupt one: %v", id, err)
			}
		}
		list, err := a.List(ctx, api.ListOptions{})
		if err != nil || len(list.Tasks) != 3 {
			t.Fatalf("list: %d tasks, %v; want all 3", len(list.Tasks), err)
		}
	})

	t.Run("CustomerEventsCarryMarker", func(t *testing.T) {
		ans := authDo(t, b, "Bearer tok-a", "GET", "/v1/events", "")
		if ans.status != http.StatusOK {
			t.Fatalf("GET /v1/events: %d %s", ans.status, ans.body)
		}
		var got []api.Event
		sc := bufio.NewScanner(bytes.NewReader(ans.body))
		for sc.Scan() {
			var e api.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			got = append(got, e)
		}
		requireMarkerThenLater(t, got, garbage, hurt.ID, after.ID)
	})

	t.Run("StreamCarriesMarkerAndResumesAcross", func(t *testing.T) {
		for _, from := range []uint64{0, garbage - 1} {
			s := openStream(t, b.url, "tok-a", "after="+strconv.FormatUint(from, 10), "")
			var got []api.Event
			for len(got) == 0 || got[len(got)-1].TaskID != after.ID {
				m := s.next(t)
				e := m.decoded(t)
				if e.Type == api.EventQuarantined && m.seq(t) != garbage {
					t.Fatalf("marker's SSE id %s, want %d", m.id, garbage)
				}
				got = append(got, e)
			}
			s.close()
			requireMarkerThenLater(t, got, garbage, hurt.ID, after.ID)
		}
	})

	t.Run("Readyz", func(t *testing.T) {
		var body struct {
			Log        string               `json:"log"`
			Quarantine *api.QuarantineStats `json:"quarantine"`
		}
		ans := authDo(t, b, "", "GET", "/readyz", "")
		if err := json.Unmarshal(ans.body, &body); err != nil || ans.status != http.StatusOK || !strings.Contains(body.Log, "quarantined") || body.Quarantine != nil {
			t.Fatalf("/readyz: %d %s, want 200 with a quarantine warning and no list", ans.status, ans.body)
		}
		ans = authDo(t, b, "Bearer tok-op", "GET", "/readyz?digest=1", "")
		if err := json.Unmarshal(ans.body, &body); err != nil || body.Quarantine == nil || body.Quarantine.Count != 1 ||
			len(body.Quarantine.Sequences) != 1 || body.Quarantine.Sequences[0].Seq != garbage || body.Quarantine.Sequences[0].Reason == "" {
			t.Fatalf("/readyz?digest=1: %s, want sequence %d quarantined", ans.body, garbage)
		}
	})

	t.Run("StatsForOperatorsOnly", func(t *testing.T) {
		st, err := tokenClient(t, b, "tok-op").Stats(ctx)
		if err != nil || st.Quarantine == nil || st.Quarantine.Count != 1 || st.Quarantine.Sequences[0].Seq != garbage {
			t.Fatalf("operator's stats: %+v, %v; want sequence %d quarantined", st.Quarantine, err, garbage)
		}
		ans := authDo(t, b, "Bearer tok-a", "GET", "/v1/stats", "")
		if ans.status != http.StatusOK || bytes.Contains(ans.body, []byte(`"quarantine"`)) {
			t.Fatalf("customer's stats: %d %s, want no quarantine", ans.status, ans.body)
		}
	})

	t.Run("Metrics", func(t *testing.T) {
		ans := authDo(t, b, "Bearer tok-op", "GET", "/metrics", "")
		for _, want := range []string{"taskledger_projection_undecodable_events_total 1", "taskledger_quarantine_skips_total "} {
			if !bytes.Contains(ans.body, []byte(want)) {
				t.Fatalf("/metrics lacks %q", want)
			}
		}
		if bytes.Contains(ans.body, []byte("taskledger_quarantine_skips_total 0")) {
			t.Fatal("no skip counted")
		}
	})
}

// mustScheduleAs schedules req (due in an hour: the alarm leaves it be)
// with c.
func mustScheduleAs(t *testing.T, c *api.Client, req api.ScheduleRequest) api.Task {
	t.Helper()
	req.DelaySeconds = new(3600.0)
	task, _, err := c.Schedule(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return task
}

// requireMarkerThenLater asserts that evs holds a Quarantined marker at
// seq for task hurt, and after it the events of task later.
func requireMarkerThenLater(t *testing.T, evs []api.Event, seq uint64, hurt, later string) {
	t.Helper()
	marker := -1
	for i, e := range evs {
		if e.Type == api.EventQuarantined {
			if marker >= 0 || e.Seq != seq || e.TaskID != hurt || e.Status != "" || !strings.Contains(e.Detail, "quarantined") {
				t.Fatalf("marker %+v, want one at %d for task %s", e, seq, hurt)
			}
			marker = i
		}
	}
	if marker < 0 {
		t.Fatalf("no Quarantined marker in %d events", len(evs))
	}
	for _, e := range evs[marker+1:] {
		if e.TaskID == later && e.Seq > seq {
			return
		}
	}
	t.Fatalf("no event of task %s after the marker", later)
}
