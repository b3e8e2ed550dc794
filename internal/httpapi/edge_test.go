package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
)

// The HTTP edge: what a hostile client
// can hold of the server (connections, time, slots) and what it gets for
// requests net/http or the mux would otherwise answer in their own way.

// addr is the host:port of b's API.
func (b *bundle) addr() string { return strings.TrimPrefix(b.url, "http://") }

// rawExchange writes raw to a new connection to b and reads one answer.
// The write runs beside the read: a server may answer (and close) before
// it has read everything.
func rawExchange(t *testing.T, b *bundle, raw []byte) rawAnswer {
	t.Helper()
	conn, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	go conn.Write(raw)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%.60q: %v", raw, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%.60q: reading answer: %v", raw, err)
	}
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: data}
}

// slowConn is a connection that has sent a request's headers and part of
// its body, and holds the rest back.
type slowConn struct {
	net.Conn
	r *bufio.Reader
}

// openSlowBody sends a schedule's headers and the first byte of a
// 100-byte body. With expectContinue, it waits for the server's
// "100 Continue", which net/http sends when the handler starts reading
// the body.
func openSlowBody(t *testing.T, b *bundle, expectContinue bool) *slowConn {
	t.Helper()
	conn, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &slowConn{Conn: conn, r: bufio.NewReader(conn)}
	conn.SetDeadline(time.Now().Add(2 * time.Minute))
	head := "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
	if expectContinue {
		head += "Expect: 100-continue\r\n"
	}
	if _, err := io.WriteString(conn, head+"\r\n"); err != nil {
		t.Fatal(err)
	}
	if expectContinue {
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			t.Fatalf("waiting for 100 Continue: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusContinue {
			t.Fatalf("got %d before the body, want 100 Continue", resp.StatusCode)
		}
	}
	if _, err := io.WriteString(conn, "{"); err != nil {
		t.Fatal(err)
	}
	return c
}

// answer reads the server's answer on c.
func (c *slowConn) answer(t *testing.T) rawAnswer {
	t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatalf("reading the answer to a slow body: %v", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: data}
}

// normalTraffic schedules and reads n tasks of queue through c, failing
// on any error (a 503 of a full --max-inflight included).
func normalTraffic(t *testing.T, c *api.Client, queue string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		task, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: queue})
		if err != nil {
			t.Fatalf("schedule %d beside the attack: %v", i, err)
		}
		if _, err := c.Get(ctx, task.ID); err != nil {
			t.Fatalf("get %d beside the attack: %v", i, err)
		}
	}
}

// TestEdgeSlowBodies is row 1: more slow bodies than --max-inflight
// slots leave every other request served (a body is read before a slot
// is taken), and a body that does not arrive in --body-timeout is cut
// with a JSON 408 and its connection closed.
func TestEdgeSlowBodies(t *testing.T) {
	t.Parallel()

	t.Run("HoldNoSlot", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *node.Config) { c.MaxInFlight = 4; c.BodyTimeout = 5 * time.Minute })
		// Each holder is inside the handler, reading its body (it got
		// its 100 Continue), ten times as many as there are slots.
		for range 40 {
			openSlowBody(t, b, true)
		}
		normalTraffic(t, b.client, "beside-slow", 20)
	})

	t.Run("CutAt408", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *node.Config) { c.MaxInFlight = 4; c.BodyTimeout = 200 * time.Millisecond })
		before := lastSeq(t, b)
		conns := make([]*slowConn, 20)
		for i := range conns {
			conns[i] = openSlowBody(t, b, false)
		}
		for _, c := range conns {
			a := c.answer(t)
			requireErrorBody(t, a, http.StatusRequestTimeout, "request_timeout")
			// And the server closes the connection.
			if _, err := c.r.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
				t.Fatalf("after a 408 the connection is still open: read gave %v", err)
			}
		}
		if after := lastSeq(t, b); after != before {
			t.Fatalf("cut bodies appended to the log: %d, want %d", after, before)
		}
		normalTraffic(t, b.client, "after-slow", 5)
	})
}

// isReset reports whether err is a connection reset by the peer.
func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// TestEdgeConnections is row 2: idle keep-alive connections are closed
// after --idle-timeout, and past --max-conns a new connection is
// answered 503 and closed at once instead of piling up.
func TestEdgeConnections(t *testing.T) {
	t.Parallel()

	t.Run("IdleClosed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *node.Config) { c.HTTP.IdleTimeout = 200 * time.Millisecond })
		conns := make([]net.Conn, 100)
		for i := range conns {
			conns[i] = keepAlive(t, b)
		}
		for i, c := range conns {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
				t.Fatalf("idle connection %d: read gave %v, want the server to close it", i, err)
			}
		}
		eventually(t, "the server's idle connections closed", func() bool { return b.node.Server.OpenConns() == 0 })
	})

	t.Run("CapRefusesFast", func(t *testing.T) {
		t.Parallel()
		const maxConns = 50
		b := setup(t, func(c *node.Config) { c.HTTP.MaxConns = maxConns; c.HTTP.IdleTimeout = 5 * time.Minute })
		held := make([]net.Conn, maxConns)
		for i := range held {
			held[i] = keepAlive(t, b)
		}
		// 500 more: each is answered 503 (or closed, if the close beat
		// the request) — never left waiting.
		var refused503 int
		for range 500 {
			a, err := tryExchange(b, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
			switch {
			case err == nil:
				requireErrorBody(t, a, http.StatusServiceUnavailable, "unavailable")
				refused503++
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isReset(err):
			default:
				t.Fatalf("a connection past --max-conns: %v, want a 503 or a close", err)
			}
		}
		t.Logf("%d of 500 connections past the cap read the 503, the rest a close", refused503)
		if open := b.node.Server.OpenConns(); open > maxConns {
			t.Fatalf("%d connections open, want at most %d", open, maxConns)
		}
		if got := b.node.Server.RefusedConns(); got != 500 {
			t.Fatalf("%d connections refused, want 500", got)
		}
		// Freed connections make room again.
		for _, c := range held[:10] {
			c.Close()
		}
		eventually(t, "room after closing connections", func() bool { return b.node.Server.OpenConns() <= maxConns-10 })
		normalTraffic(t, b.client, "after-cap", 5)
	})
}

// keepAlive opens a connection to b and completes one keep-alive request
// on it, so it is open and idle on the server.
func keepAlive(t *testing.T, b *bundle) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz on a keep-alive connection: %d", resp.StatusCode)
	}
	conn.SetDeadline(time.Time{})
	return conn
}

// tryExchange is rawExchange that returns the connection's error.
func tryExchange(b *bundle, raw string) (rawAnswer, error) {
	conn, err := net.Dial("tcp", b.addr())
	if err != nil {
		return rawAnswer{}, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(conn, raw)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return rawAnswer{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: data}, err
}

// TestEdgeHostCheck is row 9: without an auth file only loopback Hosts
// are served, so a DNS-rebinding page cannot act as the operator.
func TestEdgeHostCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := queuedTask(t, b, api.ScheduleRequest{Queue: "hosts"})
	before := lastSeq(t, b)
	for _, host := range []string{"evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "10.0.0.1", "[::2]:80", "0.0.0.0"} {
		for _, req := range []string{
			"POST /v1/tasks HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 2\r\n\r\n{}",
			"GET /v1/tasks HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
			"GET /healthz HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		} {
			a := rawExchange(t, b, []byte(req))
			requireErrorBody(t, a, http.StatusForbidden, "forbidden")
			if !bytes.Contains(a.body, []byte("loopback")) {
				t.Fatalf("Host %s: message %s does not say why", host, a.body)
			}
		}
	}
	if after := lastSeq(t, b); after != before {
		t.Fatalf("refused hosts appended to the log: %d, want %d", after, before)
	}
	for _, host := range []string{"localhost", "LOCALHOST:1234", "127.0.0.1", "127.3.4.5:80", "[::1]", "[::1]:8080"} {
		a := rawExchange(t, b, []byte("GET /v1/tasks/"+task.ID+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n"))
		if a.status != http.StatusOK {
			t.Fatalf("Host %s: %d %s, want 200", host, a.status, a.body)
		}
	}

	t.Run("AuthFileServesAnyHost", func(t *testing.T) {
		t.Parallel()
		b := authSetup(t)
		a := rawExchange(t, b, []byte("GET /v1/tasks HTTP/1.1\r\nHost: scheduler.example\r\nAuthorization: Bearer tok-a\r\n\r\n"))
		if a.status != http.StatusOK {
			t.Fatalf("with an auth file, Host scheduler.example: %d %s, want 200", a.status, a.body)
		}
	})
}

// TestEdgeOperatorInternals is row 10: with an auth file, /metrics and
// the projection digest need an operator token; the probes stay open.
func TestEdgeOperatorInternals(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	if _, _, err := tokenClient(t, b, "tok-a").Schedule(context.Background(), api.ScheduleRequest{Queue: "secret-queue-name"}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/metrics", "/readyz?digest=1"} {
		requireErrorBody(t, authDo(t, b, "", http.MethodGet, path, ""), http.StatusUnauthorized, "unauthenticated")
		requireErrorBody(t, authDo(t, b, "Bearer nope", http.MethodGet, path, ""), http.StatusUnauthorized, "unauthenticated")
		a := authDo(t, b, "Bearer tok-a", http.MethodGet, path, "")
		requireErrorBody(t, a, http.StatusNotFound, "not_found")
		if bytes.Contains(a.body, []byte("secret-queue-name")) || bytes.Contains(a.body, []byte("digest\"")) {
			t.Fatalf("%s to a customer leaks: %s", path, a.body)
		}
	}
	if a := authDo(t, b, "Bearer tok-op", http.MethodGet, "/metrics", ""); a.status != http.StatusOK || !bytes.Contains(a.body, []byte("secret-queue-name")) {
		t.Fatalf("/metrics to the operator: %d, want 200 with the queues", a.status)
	}
	if a := authDo(t, b, "Bearer tok-op", http.MethodGet, "/readyz?digest=1", ""); a.status != http.StatusOK || !bytes.Contains(a.body, []byte(`"digest"`)) {
		t.Fatalf("/readyz?digest=1 to the operator: %d %s, want 200 with the digest", a.status, a.body)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if a := authDo(t, b, "", http.MethodGet, path, ""); a.status != http.StatusOK || bytes.Contains(a.body, []byte("digest")) {
			t.Fatalf("%s without a token: %d %s, want 200 without a digest", path, a.status, a.body)
		}
	}
}

// TestEdgeProtocolErrors is row 11: what net/http refuses before any
// handler runs answers the JSON error shape, and paths are never
// redirected.
func TestEdgeProtocolErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := queuedTask(t, b, api.ScheduleRequest{Queue: "protocol"})
	before := lastSeq(t, b)
	cases := []struct {
		name   string
		raw    string
		status int
		code   string
	}{
		{"CRInHeader", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\rb\r\n\r\n", 400, "invalid_argument"},
		{"HeaderWithoutColon", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nnonsense\r\n\r\n", 400, "invalid_argument"},
		{"HugeHeader", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n", 431, "header_too_large"},
		{"BadRequestLine", "GARBAGE\r\n\r\n", 400, "invalid_argument"},
		{"BadVersion", "GET /healthz HTTP/9.9\r\nHost: localhost\r\n\r\n", 505, "invalid_argument"},
		{"NoHost", "GET /healthz HTTP/1.1\r\n\r\n", 400, "invalid_argument"},
		{"TwoHosts", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n", 400, "invalid_argument"},
		{"BadContentLength", "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: x\r\n\r\n", 400, "invalid_argument"},
		{"UnknownTransferEncoding", "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: zip\r\n\r\n", 501, "invalid_argument"},
		{"DotDot", "GET /v1/tasks/../tasks/" + task.ID + " HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "invalid_argument"},
		{"DotDotPost", "POST /v1/tasks/../tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}", 400, "invalid_argument"},
		{"EncodedDotDot", "GET /v1/tasks/%2e%2e/tasks/" + task.ID + " HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "invalid_argument"},
		{"DoubleSlash", "GET //v1/tasks HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "invalid_argument"},
		{"Dot", "GET /v1/./tasks HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "invalid_argument"},
		{"TrailingSlash", "GET /v1/tasks/" + task.ID + "/ HTTP/1.1\r\nHost: localhost\r\n\r\n", 404, "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := rawExchange(t, b, []byte(c.raw))
			if a.status >= 300 && a.status < 400 {
				t.Fatalf("redirected: %d to %q", a.status, a.header.Get("Location"))
			}
			requireErrorBody(t, a, c.status, c.code)
		})
	}
	if after := lastSeq(t, b); after != before {
		t.Fatalf("refused requests appended to the log: %d, want %d", after, before)
	}
	requireHealthy(t, b)
}

// TestEdgeLimitsNoLeak: none of the edge's refusals leaves a connection
// counted as open once the clients are gone.
func TestEdgeLimitsNoLeak(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.BodyTimeout = 100 * time.Millisecond })
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			raw := []string{
				"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
				"GARBAGE\r\n\r\n",
				"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n{",
				"GET /healthz HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
			}[i%4]
			if _, err := tryExchange(b, raw); err != nil {
				t.Errorf("%q: %v", raw, err)
			}
		})
	}
	wg.Wait()
	b.client.HTTP.CloseIdleConnections()
	eventually(t, fmt.Sprintf("open connections back to 0 (now %d)", b.node.Server.OpenConns()), func() bool { return b.node.Server.OpenConns() == 0 })
}

// TestEdgeLongPollOutlivesBodyTimeout: neither the body deadline, which
// ends with the body, nor a write timeout (there is none) cuts a long
// poll: a task released a second after the poll began, ten body timeouts
// later, is still handed to it.
func TestEdgeLongPollOutlivesBodyTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.BodyTimeout = 100 * time.Millisecond })
	delay := 1.0
	task := mustSchedule(t, b, api.ScheduleRequest{Queue: "late", DelaySeconds: &delay})
	got, ok, err := b.client.ClaimNext(context.Background(), "late", "w1", 30*time.Second)
	if err != nil || !ok || got.ID != task.ID {
		t.Fatalf("long poll past the body timeout: %v ok=%v %+v, want task %s", err, ok, got, task.ID)
	}
}

// TestEdgeBodyMemory: bodies are read before a slot is taken, so what
// they hold in memory is bounded on its own (--max-body-memory): past
// it a request is answered 503, and the memory comes back when the body
// holding it is gone.
func TestEdgeBodyMemory(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.MaxBodyMemory = api.MaxBatchBodyBytes })
	before := lastSeq(t, b)
	// An empty batch is a 400 once its body is in; 3 MiB of padding.
	probe := padded(`{"tasks":[]}`, 3<<20)

	conn, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprintf(conn, "POST /v1/tasks/batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", api.MaxBatchBodyBytes)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("waiting for 100 Continue: %v %v", err, resp)
	}
	resp.Body.Close()
	// 6 of its 8 MiB, and the rest held back.
	if _, err := conn.Write(bytes.Repeat([]byte(" "), 6<<20)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the server to hold the slow body's 6 MiB", func() bool {
		return admMetric(t, b, "taskledger_http_body_bytes") >= 6<<20
	})
	requireErrorBody(t, abuseDo(t, b, http.MethodPost, "/v1/tasks/batch", probe, nil), http.StatusServiceUnavailable, "unavailable")

	conn.Close()
	eventually(t, "the memory back once the slow body is gone", func() bool {
		return abuseDo(t, b, http.MethodPost, "/v1/tasks/batch", probe, nil).status == http.StatusBadRequest
	})
	if after := lastSeq(t, b); after != before {
		t.Fatalf("refused bodies appended to the log: %d, want %d", after, before)
	}
}
