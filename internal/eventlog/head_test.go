package eventlog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/testnats"
)

// TestCheckStreams: a log's stream that is purged, deleted and created
// again empty, or deleted, fails CheckStreams with the matching error;
// an empty stream nothing was read from passes; a saved chain head over
// the emptied stream fails Check with ErrLogEmpty.
func TestCheckStreams(t *testing.T) {
	t.Parallel()
	ns := testnats.NewNamespace(t)
	js, err := jetstream.New(testnats.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Without DenyPurge, so that the test may purge it.
	cfg := jetstream.StreamConfig{Name: ns.Stream, Subjects: ns.Subjects.Log(), Storage: jetstream.FileStorage}
	create := func() jetstream.Stream {
		t.Helper()
		s, err := js.CreateStream(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := create()
	for range 3 {
		if _, err := js.Publish(ctx, ns.Subjects.Event("c", "t"), []byte("event")); err != nil {
			t.Fatal(err)
		}
	}
	log := eventlog.Log{JS: js, Stream: ns.Stream, Subjects: ns.Subjects}
	read := []events.Position{3}
	if err := log.CheckStreams(ctx, read); err != nil {
		t.Fatalf("intact: %v", err)
	}
	head, err := log.HeadAt(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}

	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if err := log.CheckStreams(ctx, read); !errors.Is(err, eventlog.ErrEventsMissing) {
		t.Fatalf("purged: %v, want ErrEventsMissing", err)
	}
	if err := log.Check(ctx, head); !errors.Is(err, eventlog.ErrLogEmpty) || !errors.Is(err, eventlog.ErrLogTruncated) {
		t.Fatalf("chain head over the purged stream: %v, want ErrLogEmpty", err)
	}

	if err := js.DeleteStream(ctx, ns.Stream); err != nil {
		t.Fatal(err)
	}
	if err := log.CheckStreams(ctx, read); !errors.Is(err, eventlog.ErrStreamMissing) {
		t.Fatalf("deleted: %v, want ErrStreamMissing", err)
	}
	create()
	if err := log.CheckStreams(ctx, read); !errors.Is(err, eventlog.ErrLogTruncated) {
		t.Fatalf("created again after events were read: %v, want ErrLogTruncated", err)
	}
	if err := log.CheckStreams(ctx, nil); err != nil {
		t.Fatalf("an empty stream nothing was read from: %v", err)
	}
	if err := log.Check(ctx, head); !errors.Is(err, eventlog.ErrLogEmpty) {
		t.Fatalf("chain head over the new empty stream: %v, want ErrLogEmpty", err)
	}
}
