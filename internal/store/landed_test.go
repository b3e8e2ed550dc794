package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
)

// TestRetryOfLandedAppend: an append whose ack was lost is retried with
// the same event id; the server answers "wrong last sequence" (it checks
// that before its dedupe window), and the store must recognise its own
// event instead of reporting a conflict.
func TestRetryOfLandedAppend(t *testing.T) {
	t.Parallel()
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx := context.Background()
	st, err := Open(ctx, nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ev := events.Event{ID: "evt-1", TaskID: "t1", CustomerID: "c1", Number: 1, At: time.Now(),
		Data: events.TaskScheduled{Spec: events.TaskSpec{RootID: "t1", Queue: "q", TimeoutSeconds: 1}}}
	data, err := events.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	// The first attempt lands; its ack is lost.
	first, err := st.js.PublishMsg(ctx, &nats.Msg{Subject: st.cfg.Subjects.Event("c1", "t1"), Data: data},
		jetstream.WithMsgID(ev.ID), jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil {
		t.Fatal(err)
	}
	seq, err := st.publish(ctx, ev, 0)
	if err != nil || seq != first.Sequence {
		t.Fatalf("retry = %d, %v; want the first attempt's seq %d", seq, err, first.Sequence)
	}
	// Another writer's event at that place is still a conflict.
	other := ev
	other.ID = "evt-2"
	if _, err := st.publish(ctx, other, 0); !errors.Is(err, aggregate.ErrConflict) {
		t.Fatalf("another event at the same place: %v, want a conflict", err)
	}
}
