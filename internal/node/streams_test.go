package node_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// readyzStreams returns /readyz's status and its "streams" field.
func readyzStreams(t *testing.T, url string) (int, string) {
	t.Helper()
	status, body := readyz(t, url)
	streams, _ := body["streams"].(string)
	return status, streams
}

// TestReadyzWithoutStream: once the event stream is deleted under a
// running node (here by taskledger's own connection, as an attacker with
// the JetStream API would), /readyz answers 503 naming the missing
// stream, instead of 200 while every call answers 503.
func TestReadyzWithoutStream(t *testing.T) {
	t.Parallel()
	n := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	if status, streams := readyzStreams(t, n.URL); status != http.StatusOK || streams != "" {
		t.Fatalf("/readyz before the deletion: %d %q", status, streams)
	}
	js, err := jetstream.New(n.NC)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, n.NS.Stream); err != nil {
		t.Fatal(err)
	}
	status, streams := readyzStreams(t, n.URL)
	if status != http.StatusServiceUnavailable || !strings.Contains(streams, "missing") || !strings.Contains(streams, n.NS.Stream) {
		t.Fatalf("/readyz after the deletion: %d %q, want 503 naming the missing stream", status, streams)
	}
	if err := n.StreamsError(ctx); !errors.Is(err, eventlog.ErrStreamMissing) {
		t.Fatalf("StreamsError: %v, want ErrStreamMissing", err)
	}
}

// TestRestartOnDeletedStream: a node stopped cleanly saves its chain
// head; once its event stream is deleted, a start refuses the empty log
// (ErrLogLost, naming the way out) — every time, although the refused
// start created the stream again — and starts with AllowEmptyLog,
// warning in /readyz.
func TestRestartOnDeletedStream(t *testing.T) {
	t.Parallel()
	n := testnode.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		if _, _, err := n.Client.Schedule(ctx, api.ScheduleRequest{Queue: "q"}); err != nil {
			t.Fatal(err)
		}
	}
	n.Stop() // saves the chain head
	js, err := jetstream.New(n.NC)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, n.NS.Stream); err != nil {
		t.Fatal(err)
	}
	cfg := node.Config{NC: testnats.Conn(t), Stream: n.NS.Stream, ReadyStream: n.NS.ReadyStream, Subjects: n.NS.Subjects,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)}
	for range 2 {
		if _, err := node.New(ctx, cfg); !errors.Is(err, node.ErrLogLost) || !errors.Is(err, eventlog.ErrLogEmpty) || !strings.Contains(err.Error(), "--allow-empty-log") {
			t.Fatalf("start over the deleted stream: %v, want ErrLogLost", err)
		}
	}
	again := testnode.Start(t, testnode.On(nil, n.NS), func(c *node.Config) { c.AllowEmptyLog = true })
	if w := again.LogWarning(); !strings.Contains(w, "holds no event") {
		t.Fatalf("LogWarning %q, want the lost log", w)
	}
	if status, streams := readyzStreams(t, again.URL); status != http.StatusOK || streams != "" {
		t.Fatalf("/readyz of the new empty log: %d %q", status, streams)
	}
}
