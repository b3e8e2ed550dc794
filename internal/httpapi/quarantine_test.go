package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testlog"
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
	for _, k := range []int{1, 3} {
		t.Run(fmt.Sprint("Shards", k), func(t *testing.T) {
			t.Parallel()
			testQuarantinedMessage(t, k)
		})
	}
}

func testQuarantinedMessage(t *testing.T, k int) {
	var sink testlog.Buffer
	b := setup(t, func(c *node.Config) {
		c.Tokens, c.Shards = tenantTokens, k
		c.Logger = zerolog.New(io.MultiWriter(&sink, zerolog.NewTestWriter(t))).Level(zerolog.WarnLevel)
	})
	logged := func(msg string) (n int) {
		for _, line := range sink.Lines() {
			if strings.Contains(line, msg) {
				n++
			}
		}
		return n
	}
	a := tokenClient(t, b, "tok-a")
	ctx := context.Background()
	st, shards := b.node.Store, b.node.Store.Shards()

	hurt := mustScheduleAs(t, a, api.ScheduleRequest{Queue: "poison"})
	before := mustScheduleAs(t, a, api.ScheduleRequest{Queue: "poison"})
	first, err := st.Load(ctx, hurt.ID)
	if err != nil {
		t.Fatal(err)
	}
	part := first.FirstSeq.Part(shards)
	ack, err := st.JetStream().Publish(ctx, shards.Subjects(st.Subjects(), part).Event("A", hurt.ID), []byte("\xc1 not an event"))
	if err != nil {
		t.Fatal(err)
	}
	garbage := uint64(shards.Position(part, ack.Sequence))                    // its position: the seq of the API
	after := mustScheduleAs(t, a, api.ScheduleRequest{Queue: "poison-after"}) // a later event of another task
	last, err := st.Load(ctx, after.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, pos := range []events.Position{events.Position(garbage), last.LastSeq} {
		if err := b.node.Engine.WaitFor(ctx, pos); err != nil {
			t.Fatal(err)
		}
	}
	// resume is the stream's resume token just before the garbage.
	resume := make([]string, shards.N())
	for i := range resume {
		resume[i] = "0"
	}
	resume[part] = strconv.FormatUint(ack.Sequence-1, 10)

	t.Run("TaskAnswersCorruptEvent", func(t *testing.T) {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/v1/tasks/" + hurt.ID, ""},
			{"GET", "/v1/tasks/" + hurt.ID + "/history", ""},
			{"POST", "/v1/tasks/" + hurt.ID + "/cancel", `{"reason":"stop"}`},
		} {
			ans := authDo(t, b, "Bearer tok-a", r.method, r.path, r.body)
			requireErrorBody(t, ans, http.StatusInternalServerError, "corrupt_event")
			var e api.Error
			if err := json.Unmarshal(ans.body, &e); err != nil || e.Seq != garbage || !strings.Contains(e.Message, fmt.Sprint(garbage)) || strings.Contains(e.Message, ".evt.") {
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

	// Another customer's corrupt task is missing, as any of its tasks is:
	// not corrupt_event naming its seq, subject or customer.
	t.Run("AnotherCustomerSeesNotFound", func(t *testing.T) {
		lastSeq := func() uint64 {
			seq, err := st.LastSeq(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return seq
		}
		msgs := lastSeq()
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/v1/tasks/" + hurt.ID, ""},
			{"GET", "/v1/tasks/" + hurt.ID + "/history", ""},
			{"GET", "/v1/tasks/" + hurt.ID + "/history?tree=1", ""},
			{"GET", "/v1/tasks/" + hurt.ID + "/tree", ""},
			{"POST", "/v1/tasks/" + hurt.ID + "/cancel", `{"reason":"stop"}`},
			{"POST", "/v1/tasks", `{"queue":"q","parentId":"` + hurt.ID + `"}`},
		} {
			requireErrorBody(t, authDo(t, b, "Bearer tok-b", r.method, r.path, r.body), http.StatusNotFound, "not_found")
		}
		ans := authDo(t, b, "Bearer tok-b", "POST", "/v1/tasks/"+hurt.ID+"/check", `{"deliveryId":"d1"}`)
		var c api.Check
		if err := json.Unmarshal(ans.body, &c); err != nil || ans.status != http.StatusOK || !c.ShouldStop || c.Reason != api.ReasonMissing {
			t.Fatalf("tok-b's check of A's corrupt task: %d %s, want shouldStop with reason missing", ans.status, ans.body)
		}
		if got := lastSeq(); got != msgs {
			t.Fatalf("tok-b's requests appended %d messages to the log, want none (no CheckFailed)", got-msgs)
		}
		// The operator is told the seq, never the subject (A's id).
		ans = authDo(t, b, "Bearer tok-op", "GET", "/v1/tasks/"+hurt.ID, "")
		requireErrorBody(t, ans, http.StatusInternalServerError, "corrupt_event")
		if bytes.Contains(ans.body, []byte(".evt.")) {
			t.Fatalf("operator's corrupt_event names the subject: %s", ans.body)
		}
	})

	t.Run("CustomerEventsCarryMarker", func(t *testing.T) {
		// The customer's marker has no seq (a customer sees none); the
		// operator's names the garbage's.
		for _, r := range []struct {
			token, query string
			seq          uint64
		}{{"tok-a", "", 0}, {"tok-op", "?customerId=A", garbage}} {
			ans := authDo(t, b, "Bearer "+r.token, "GET", "/v1/events"+r.query, "")
			if ans.status != http.StatusOK {
				t.Fatalf("%s: GET /v1/events: %d %s", r.token, ans.status, ans.body)
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
			requireMarkerThenLater(t, got, r.seq, hurt.ID, after.ID, k == 1)
		}
	})

	t.Run("StreamCarriesMarkerAndResumesAcross", func(t *testing.T) {
		for _, from := range []string{"0", strings.Join(resume, "-")} {
			s := openStream(t, b.url, "tok-op", "after="+from, "")
			var got []api.Event
			for !hasMarker(got) || !slices.ContainsFunc(got, func(e api.Event) bool { return e.TaskID == after.ID }) {
				m := s.next(t)
				e := m.decoded(t)
				if e.Type == api.EventQuarantined {
					if k == 1 && m.seq(t) != garbage || k > 1 && (e.Cursor != m.id || strings.Split(m.id, "-")[part] != strconv.FormatUint(ack.Sequence, 10)) {
						t.Fatalf("marker's SSE id %s (cursor %q), want one at the garbage's sequence %d of shard %d", m.id, e.Cursor, ack.Sequence, part)
					}
				}
				got = append(got, e)
			}
			s.close()
			requireMarkerThenLater(t, got, garbage, hurt.ID, after.ID, k == 1)
		}
	})

	// Each read above passed over the message (GET /v1/events, two
	// streams): one log line, the later ones counted.
	t.Run("SkipsLoggedOnce", func(t *testing.T) {
		if n := logged("skipped a message of the log that does not decode"); n != 1 {
			t.Fatalf("%d log lines of skips, want 1 (the rest counted)", n)
		}
	})

	t.Run("CustomerStreamResumesAcrossMarker", func(t *testing.T) {
		// A customer's stream: the marker has no seq and an opaque id, and
		// a resume from that id goes on to the later task's events.
		s := openStream(t, b.url, "tok-a", "after=0", "")
		var got []api.Event
		markerID := ""
		for markerID == "" || !slices.ContainsFunc(got, func(e api.Event) bool { return e.TaskID == after.ID }) {
			m := s.next(t)
			e := m.decoded(t)
			if e.Type == api.EventQuarantined {
				if !strings.HasPrefix(m.id, "c1.") || strings.Contains(m.data, `"seq"`) {
					t.Fatalf("customer's marker: id %q data %s, want an opaque id and no seq", m.id, m.data)
				}
				markerID = m.id
			}
			got = append(got, e)
		}
		s.close()
		requireMarkerThenLater(t, got, 0, hurt.ID, after.ID, k == 1)
		s = openStream(t, b.url, "tok-a", "", markerID)
		defer s.close()
		for {
			e := s.next(t).decoded(t)
			if e.Type == api.EventQuarantined && k == 1 {
				t.Fatal("a resume from the marker's id delivered the marker again")
			}
			if e.TaskID == after.ID {
				return
			}
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

	// A queued task with a garbage message is passed over by the
	// customer's claims without reading it again (and logged once): the
	// task behind it is claimed.
	t.Run("QueuedCorruptTaskPassedOver", func(t *testing.T) {
		const queue = "poison-claim"
		queued := func() api.Task {
			task, _, err := a.Schedule(ctx, api.ScheduleRequest{Queue: queue})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "task "+task.ID+" queued", func() bool {
				got, err := a.Get(ctx, task.ID)
				return err == nil && got.Status == "queued"
			})
			return task
		}
		stuck := queued()
		loaded, err := st.Load(ctx, stuck.ID)
		if err != nil {
			t.Fatal(err)
		}
		p := loaded.FirstSeq.Part(shards)
		ack, err := st.JetStream().Publish(ctx, shards.Subjects(st.Subjects(), p).Event("A", stuck.ID), []byte("\xc1 not an event"))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.node.Engine.WaitFor(ctx, shards.Position(p, ack.Sequence)); err != nil {
			t.Fatal(err)
		}
		next := queued()
		const skipped = "claim skipped: the task holds a message of the log that does not decode"
		before := logged(skipped)
		got, ok, err := a.ClaimNext(ctx, queue, "w", 5*time.Second)
		if err != nil || !ok || got.ID != next.ID {
			t.Fatalf("claims/next past the corrupt task: %s ok %v err %v, want %s", got.ID, ok, err, next.ID)
		}
		for range 3 {
			if got, ok, err := a.ClaimNext(ctx, queue, "w", 100*time.Millisecond); err != nil || ok {
				t.Fatalf("claims/next with only the corrupt task queued: %s ok %v err %v, want nothing", got.ID, ok, err)
			}
		}
		if n := logged(skipped) - before; n != 1 {
			t.Fatalf("%d log lines of claims passing over the corrupt task, want 1", n)
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

// hasMarker reports whether evs hold a Quarantined marker.
func hasMarker(evs []api.Event) bool {
	return slices.ContainsFunc(evs, func(e api.Event) bool { return e.Type == api.EventQuarantined })
}

// requireMarkerThenLater asserts that evs holds one Quarantined marker at
// seq for task hurt and the events of task later: after it when ordered
// (one shard; the shards of a sharded log interleave).
func requireMarkerThenLater(t *testing.T, evs []api.Event, seq uint64, hurt, later string, ordered bool) {
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
	from := 0
	if ordered {
		from = marker + 1
	}
	for _, e := range evs[from:] {
		if e.TaskID == later {
			return
		}
	}
	t.Fatalf("no event of task %s (after the marker: %v)", later, ordered)
}

// TestQuarantinedMessageSparesEvictedLineages: a lineage evicted by
// retention is read from the log, its customer's events from its root's
// first on; a garbage message on another task of that customer, stored
// after the root, is passed over there: the evicted lineage's tree and
// lineage history answer as before, not corrupt_event.
func TestQuarantinedMessageSparesEvictedLineages(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Retain = 1 })
	ctx := context.Background()
	st, shards := b.node.Store, b.node.Store.Shards()
	done := func(queue string) api.Task {
		task := mustSchedule(t, b, api.ScheduleRequest{Queue: queue})
		if _, err := b.client.Cancel(ctx, task.ID, "not needed"); err != nil {
			t.Fatal(err)
		}
		return task
	}
	old := done("old")
	hurt := mustSchedule(t, b, api.ScheduleRequest{Queue: "poison"})
	loaded, err := st.Load(ctx, hurt.ID)
	if err != nil {
		t.Fatal(err)
	}
	part := loaded.FirstSeq.Part(shards)
	if _, err := st.JetStream().Publish(ctx, shards.Subjects(st.Subjects(), part).Event(hurt.CustomerID, hurt.ID), []byte("\xc1 not an event")); err != nil {
		t.Fatal(err)
	}
	done("new")
	done("new")
	settled(t, b)
	if l, err := b.client.List(ctx, api.ListOptions{Status: "canceled", Limit: 100}); err != nil || slices.Contains(taskIDs(l.Tasks), old.ID) {
		t.Fatalf("canceled tasks listed: %v, %v; want %s evicted", taskIDs(l.Tasks), err, old.ID)
	}
	tree, err := b.client.Tree(ctx, old.ID)
	if err != nil || tree.Task.ID != old.ID {
		t.Fatalf("tree of the evicted lineage %s: root %q, %v", old.ID, tree.Task.ID, err)
	}
	h, err := b.client.LineageHistory(ctx, old.ID)
	if err != nil || len(h.Events) == 0 || slices.ContainsFunc(h.Events, func(e api.Event) bool { return e.TaskID != old.ID }) {
		t.Fatalf("lineage history of the evicted lineage %s: %+v, %v", old.ID, h.Events, err)
	}
}
