package httpapi_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
)

// TestStreamCustomerCursorsAreOpaque: a customer token's event stream
// carries no log sequence (they would tell how many events every tenant
// stored): its ids are opaque tokens, also the events' cursor, and the
// events have no seq. A token resumes exactly, also on another process
// of the log (the key lives in the log's metadata); it is refused for
// another customer, altered, or replaced by a sequence of the customer's
// choosing. The operator's stream keeps its sequences.
func TestStreamCustomerCursorsAreOpaque(t *testing.T) {
	t.Parallel()
	tokens := func(c *node.Config) { c.Tokens = tenantTokens }
	n1 := validatedNode(t, tokens)
	a, bc := api.NewClient(n1.URL, "tok-a"), api.NewClient(n1.URL, "tok-b")
	scheduleN(t, a, "qa", 2)
	scheduleN(t, bc, "qb", 3) // traffic of another tenant in between
	scheduleN(t, a, "qa", 2)

	// A's whole stream so far: as many events as GET /v1/events shows it.
	mine := 0
	if err := a.CustomerEvents(context.Background(), "", time.Time{}, func(api.Event) error { mine++; return nil }); err != nil || mine < 8 {
		t.Fatalf("A's events: %d %v", mine, err)
	}
	var ids, events []string
	s := openStream(t, n1.URL, "tok-a", "after=0", "")
	for range mine {
		m := s.next(t)
		e := m.decoded(t)
		if !strings.HasPrefix(m.id, "c1.") || e.Cursor != m.id || e.Seq != 0 || strings.Contains(m.data, `"seq"`) {
			t.Fatalf("a customer's message: id %q, data %s; want an opaque id, the same cursor and no seq", m.id, m.data)
		}
		ids, events = append(ids, m.id), append(events, e.ID)
	}
	s.close()

	resumed := func(url, token, lastID string) string {
		t.Helper()
		s := openStream(t, url, token, "", lastID)
		defer s.close()
		return s.next(t).decoded(t).ID
	}
	if got := resumed(n1.URL, "tok-a", ids[3]); got != events[4] {
		t.Fatalf("resumed after the 4th event: %s, want %s", got, events[4])
	}
	// Another process of the same log opens the tokens of the first.
	n1.Stop()
	n2 := validatedNode(t, testnode.On(n1.NC, n1.NS), tokens)
	if got := resumed(n2.URL, "tok-a", ids[6]); got != events[7] {
		t.Fatalf("resumed after the 7th event on a restarted server: %s, want %s", got, events[7])
	}

	altered := []byte(ids[2])
	altered[len(altered)-2] ^= 1
	for _, tc := range []struct{ name, token, query, lastID string }{
		{"AnotherCustomer", "tok-b", "", ids[2]},
		{"Altered", "tok-a", "", string(altered)},
		{"Truncated", "tok-a", "after=" + ids[2][:len(ids[2])-4], ""},
		{"NotBase64", "tok-a", "", "c1.***"},
		{"TooLong", "tok-a", "", "c1." + strings.Repeat("A", 4000)},
		{"ASequence", "tok-a", "after=3", ""},
		{"ASequenceAsLastEventID", "tok-a", "", "5"},
	} {
		resp, cancel := streamRequest(t, n2.URL, tc.token, tc.query, tc.lastID)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", tc.name, resp.StatusCode)
		}
	}

	// The operator's ids are still the log's sequences.
	s = openStream(t, n2.URL, "tok-op", "after=0", "")
	if m := s.next(t); m.seq(t) != 1 || m.decoded(t).Seq != 1 || m.decoded(t).Cursor != "" {
		t.Fatalf("the operator's first message: id %q, data %s", m.id, m.data)
	}
	s.close()

	// The Go client follows a customer's stream by its cursors.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a2 := api.NewClient(n2.URL, "tok-a")
	var got []string
	err := a2.StreamAfter(ctx, api.StreamFilter{}, ids[5], func(e api.Event) error {
		if got = append(got, e.ID); len(got) == mine-6 {
			cancel()
		}
		return nil
	})
	if ctx.Err() == nil || strings.Join(got, " ") != strings.Join(events[6:], " ") {
		t.Fatalf("the Go client after the 6th event: %v (%v), want %v", got, err, events[6:])
	}
}

// TestCustomerAnswersHoldNoSequences: a task's history and GET /v1/events
// show a customer token its events without their log sequences; the
// operator sees them.
func TestCustomerAnswersHoldNoSequences(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	task := scheduleN(t, tokenClient(t, b, "tok-a"), "qa", 1)[0]
	for _, path := range []string{"/v1/tasks/" + task.ID + "/history", "/v1/tasks/" + task.ID + "/history?tree=1", "/v1/events"} {
		mine := authDo(t, b, "Bearer tok-a", http.MethodGet, path, "")
		if mine.status != http.StatusOK || !bytes.Contains(mine.body, []byte(task.ID)) || bytes.Contains(mine.body, []byte(`"seq"`)) {
			t.Errorf("%s for the customer: %d %s; want its events without seq", path, mine.status, mine.body)
		}
		if strings.HasPrefix(path, "/v1/events") {
			path += "?customerId=A"
		}
		if op := authDo(t, b, "Bearer tok-op", http.MethodGet, path, ""); op.status != http.StatusOK || !bytes.Contains(op.body, []byte(`"seq":1,`)) {
			t.Errorf("%s for the operator: %d %s; want seq", path, op.status, op.body)
		}
	}
}
