package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
)

// sseMsg is one message of an event stream; a comment has only comment.
type sseMsg struct {
	id, event, data, comment string
}

// seq is the message's id as a number.
func (m sseMsg) seq(t *testing.T) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(m.id, 10, 64)
	if err != nil {
		t.Fatalf("message id %q: %v", m.id, err)
	}
	return n
}

// event decodes the message's data.
func (m sseMsg) decoded(t *testing.T) api.Event {
	t.Helper()
	var e api.Event
	if err := json.Unmarshal([]byte(m.data), &e); err != nil {
		t.Fatalf("data %q: %v", m.data, err)
	}
	return e
}

// stream is an open GET /v1/events/stream.
type stream struct {
	msgs  chan sseMsg // closed when the stream ends
	close func()
}

// openStream opens the event stream of the server at url with token,
// query and, if not empty, Last-Event-ID, and fails t unless it answers
// 200. The stream is closed when the test ends.
func openStream(t *testing.T, url, token, query, lastID string) *stream {
	t.Helper()
	return openSSE(t, url+"/v1/events/stream?"+query, token, lastID)
}

// openSSE opens the Server-Sent Events stream at url, as openStream.
func openSSE(t *testing.T, url, token, lastID string) *stream {
	t.Helper()
	resp, cancel := sseRequest(t, url, token, lastID)
	ctx, stop := context.WithCancel(context.Background())
	s := &stream{msgs: make(chan sseMsg)}
	var wg sync.WaitGroup
	var once sync.Once
	s.close = func() {
		once.Do(func() {
			stop()
			cancel()
			wg.Wait()
		})
	}
	t.Cleanup(s.close)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("stream %s: %d", url, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("Content-Type %q", ct)
	}
	wg.Add(1)
	go func(body io.ReadCloser) {
		defer wg.Done()
		defer body.Close()
		defer close(s.msgs)
		sc := bufio.NewScanner(body)
		sc.Buffer(nil, 8<<20)
		var m sseMsg
		for sc.Scan() {
			line := sc.Text()
			if line != "" {
				k, v, _ := strings.Cut(line, ": ")
				switch k {
				case "id":
					m.id = v
				case "event":
					m.event = v
				case "data":
					m.data = v
				case "":
					m.comment = v
				}
				continue
			}
			select {
			case s.msgs <- m:
			case <-ctx.Done():
				return
			}
			m = sseMsg{}
		}
	}(resp.Body)
	return s
}

// streamRequest sends the request of openStream and returns its answer,
// and a func that cancels it.
func streamRequest(t *testing.T, url, token, query, lastID string) (*http.Response, func()) {
	t.Helper()
	return sseRequest(t, url+"/v1/events/stream?"+query, token, lastID)
}

// sseRequest sends a GET of a stream at url, as streamRequest.
func sseRequest(t *testing.T, url, token, lastID string) (*http.Response, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, cancel
}

// next returns the stream's next event message, skipping comments.
func (s *stream) next(t *testing.T) sseMsg {
	t.Helper()
	for m := range s.msgs {
		if m.comment == "" || m.id != "" {
			return m
		}
	}
	t.Fatal("the stream ended")
	return sseMsg{}
}

// logSeqs returns the sequence of every event of the node's log up to
// last.
func logSeqs(t *testing.T, n *node.Node, last uint64) []uint64 {
	t.Helper()
	var out []uint64
	for _, ev := range testnode.LogEvents(t, n.Store) {
		if uint64(ev.Seq) <= last {
			out = append(out, uint64(ev.Seq))
		}
	}
	return out
}

func logLast(t *testing.T, n *node.Node) uint64 {
	t.Helper()
	seq, err := n.Store.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// validatedNode starts a node as setup does, returning the test node
// (to stop it and start another on its log).
func validatedNode(t *testing.T, opts ...testnode.Option) *testnode.Node {
	t.Helper()
	return testnode.Start(t, append([]testnode.Option{func(c *node.Config) {
		c.Middleware = func(h http.Handler) http.Handler { return validated(t, h) }
	}}, opts...)...)
}

func scheduleN(t *testing.T, c *api.Client, queue string, n int) []api.Task {
	t.Helper()
	out := make([]api.Task, n)
	for i := range out {
		task, _, err := c.Schedule(context.Background(), api.ScheduleRequest{Queue: queue})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = testnode.Settled(t, c, task) // its ReadyPublished in the log too
	}
	return out
}

// TestStreamResumesExactly reads part of the log, disconnects, resumes
// with Last-Event-ID (also on a restarted server on the same log) and
// with ?after=, and gets every event of the log once, in order.
func TestStreamResumesExactly(t *testing.T) {
	t.Parallel()
	n1 := validatedNode(t)
	scheduleN(t, n1.Client, "q", 3)
	var got []uint64
	s := openStream(t, n1.URL, "", "after=0", "")
	for range 4 {
		m := s.next(t)
		if e := m.decoded(t); e.Status == "" || e.Detail == "" {
			t.Fatalf("event without status or detail: %s", m.data)
		}
		got = append(got, m.seq(t))
	}
	s.close()

	scheduleN(t, n1.Client, "q", 2)
	readTo := func(s *stream, last uint64) {
		for got[len(got)-1] < last {
			got = append(got, s.next(t).seq(t))
		}
		s.close()
	}
	s = openStream(t, n1.URL, "", "after=1", strconv.FormatUint(got[len(got)-1], 10)) // Last-Event-ID wins
	readTo(s, logLast(t, n1.Node))

	// A restart on the same log: the client resumes with its last id.
	n1.Stop()
	n2 := validatedNode(t, testnode.On(n1.NC, n1.NS))
	scheduleN(t, n2.Client, "q", 2)
	s = openStream(t, n2.URL, "", "after="+strconv.FormatUint(got[len(got)-1], 10), "")
	last := logLast(t, n2.Node)
	readTo(s, last)
	if want := logSeqs(t, n2.Node, last); !slices.Equal(got, want) {
		t.Fatalf("streamed %v, the log holds %v", got, want)
	}

	// Live: without a resume point the stream starts at the next event.
	s = openStream(t, n2.URL, "", "", "")
	task := scheduleN(t, n2.Client, "q", 1)[0]
	if e := s.next(t).decoded(t); e.TaskID != task.ID || e.Type != "TaskScheduled" || e.Seq != last+1 {
		t.Fatalf("first live event %+v, want %s's TaskScheduled at %d", e, task.ID, last+1)
	}
}

// TestStreamTenancyAndFilters: a customer sees only its own events, also
// through filters naming another customer's task, lineage or queue; the
// filters select what they say; malformed arguments are 400.
func TestStreamTenancyAndFilters(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	a, bc := api.NewClient(b.url, "tok-a"), api.NewClient(b.url, "tok-b")
	theirs := scheduleN(t, bc, "qb", 1)[0]
	mine := scheduleN(t, a, "qa", 1)[0]
	// Sentinels: each filter names the other customer's task first and a
	// task of its own after it; the first event must be its own.
	for _, q := range []string{"taskId=" + theirs.ID + "," + mine.ID, "rootId=" + theirs.ID + "&rootId=" + mine.ID, "queue=qb,qa", ""} {
		s := openStream(t, b.url, "tok-a", q+"&after=0", "")
		if e := s.next(t).decoded(t); e.TaskID != mine.ID || e.Type != "TaskScheduled" {
			t.Fatalf("%s: first event %+v, want %s's TaskScheduled", q, e, mine.ID)
		}
		s.close()
	}
	// The other customer's queue name matches nothing of theirs.
	onTheirQueue := scheduleN(t, a, "qb", 1)[0]
	s := openStream(t, b.url, "tok-a", "queue=qb&after=0", "")
	if e := s.next(t).decoded(t); e.TaskID != onTheirQueue.ID {
		t.Fatalf("queue qb: first event %+v, want %s's", e, onTheirQueue.ID)
	}
	s.close()

	// type: only claims, and the message's event name is the type.
	claimed, ok, err := a.ClaimNext(ctx, "qa", "w1", 0)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	s = openStream(t, b.url, "tok-a", "type=Claimed&after=0", "")
	if m := s.next(t); m.event != "Claimed" || m.decoded(t).TaskID != claimed.ID || m.decoded(t).Status != "running" {
		t.Fatalf("type=Claimed: %+v", m)
	}
	s.close()

	// The operator sees every customer's events.
	s = openStream(t, b.url, "tok-op", "taskId="+theirs.ID+"&after=0", "")
	if e := s.next(t).decoded(t); e.TaskID != theirs.ID {
		t.Fatalf("operator: %+v", e)
	}
	s.close()

	many := strings.Repeat("t,", api.MaxStreamFilterValues) + "t"
	for _, tc := range []struct{ query, lastID string }{
		{"type=Bogus", ""}, {"taskId=a.b", ""}, {"queue=" + strings.Repeat("q", 65), ""}, {"rootId=" + many, ""},
		{"after=-1", ""}, {"after=x", ""}, {"", "1e3"}, {"after=18446744073709551615", ""},
	} {
		resp, cancel := streamRequest(t, b.url, "tok-a", tc.query, tc.lastID)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q %q: %d, want 400", tc.query, tc.lastID, resp.StatusCode)
		}
	}
	resp, cancel := streamRequest(t, b.url, "", "", "")
	resp.Body.Close()
	cancel()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %d", resp.StatusCode)
	}
}

// TestStreamLimits: past --max-streams or a customer's share a stream is
// 503; open streams take no --max-inflight slot; a heartbeat comes on an
// idle stream; closing the service (shutdown) ends every stream.
func TestStreamLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) {
		c.Tokens = tenantTokens
		c.MaxInFlight = 1
		c.Streams = httpapi.StreamLimits{Max: 2, MaxPerCustomer: 1, Heartbeat: 10 * time.Millisecond}
	})
	first := openStream(t, b.url, "tok-a", "", "")
	refused := func(token string) {
		t.Helper()
		resp, cancel := streamRequest(t, b.url, token, "", "")
		defer cancel()
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: %d, want 503 with Retry-After", token, resp.StatusCode)
		}
	}
	refused("tok-a") // its share
	second := openStream(t, b.url, "tok-b", "", "")
	refused("tok-op") // the process's limit
	// Two streams open, one in-flight slot: a request is still served.
	if _, err := api.NewClient(b.url, "tok-op").List(context.Background(), api.ListOptions{}); err != nil {
		t.Fatalf("list with streams open: %v", err)
	}
	if m := <-first.msgs; m.comment != "ping" {
		t.Fatalf("idle stream sent %+v, want the heartbeat", m)
	}
	// A slot is given back once the server sees the client gone, which
	// can come after the client's close returns.
	second.close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, cancel := streamRequest(t, b.url, "tok-op", "", "")
		resp.Body.Close()
		cancel()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("stream after one was closed: %d", resp.StatusCode)
		}
	}

	b.node.Service.Close() // what shutdown does first
	for m := range first.msgs {
		if m.comment == "" {
			t.Fatalf("message after shutdown: %+v", m)
		}
	}
}

// TestStreamDropsASlowClient: a client that reads nothing while the log
// grows is sent what its stream held and a final overflow naming the
// last event it got, and resuming there continues without a gap.
func TestStreamDropsASlowClient(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Streams = httpapi.StreamLimits{Buffer: 8} })
	// A small receive window, so the kernel holds little for it.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
	}}
	host := strings.TrimPrefix(b.url, "http://")
	conn, err := d.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/events/stream?after=0 HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	overflowed := func() bool {
		resp, err := http.Get(b.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(body), "\ntaskledger_http_event_stream_overflows_total 1\n")
	}
	reqs := make([]api.ScheduleRequest, 500)
	for i := range reqs {
		reqs[i] = api.ScheduleRequest{Queue: "q", Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: strings.Repeat("x", 1000)}}}}
	}
	for i := 0; !overflowed(); i++ {
		if i == 20 {
			t.Fatal("no overflow after 10,000 tasks")
		}
		if _, err := b.client.ScheduleBatch(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
	}

	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 8<<20)
	var ids []uint64
	var overflow api.StreamOverflow
	event := ""
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		switch k {
		case "id":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, n)
		case "event":
			event = v
		case "data":
			if event == api.StreamOverflowEvent {
				if err := json.Unmarshal([]byte(v), &overflow); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if overflow.Reason == "" || len(ids) == 0 || overflow.After != ids[len(ids)-1] {
		t.Fatalf("got %d events, the last %v, then overflow %+v", len(ids), ids[len(ids)-1:], overflow)
	}
	log := logSeqs(t, b.node, overflow.After)
	if !slices.Equal(ids, log) {
		t.Fatalf("streamed %d events, the log holds %d up to %d", len(ids), len(log), overflow.After)
	}
	s := openStream(t, b.url, "", "after="+strconv.FormatUint(overflow.After, 10), "")
	if got, want := s.next(t).seq(t), logSeqs(t, b.node, overflow.After+1); want[len(want)-1] != got {
		t.Fatalf("resumed at %d, want %d", got, want[len(want)-1])
	}
}
