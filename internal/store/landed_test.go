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

// TestCatchUpFindsOwnEvent: an append whose ack was lost is retried with
// the same event after the same sequence; nats-server answers "wrong last
// sequence". After such a conflict the store reads
// what was appended since its state and must recognise its own event —
// and otherwise bring its state up to date without a full reload.
func TestCatchUpFindsOwnEvent(t *testing.T) {
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
	spec := events.TaskSpec{RootID: "t1", Queue: "q", TimeoutSeconds: 1}
	s1, _, err := st.Execute(ctx, "t1", "", aggregate.Schedule{TaskID: "t1", CustomerID: "c1", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	mine := events.Event{ID: "evt-mine", TaskID: "t1", CustomerID: "c1", Number: 2, At: time.Now(),
		Data: events.MailboxAppended{Index: 1, Message: events.Message{ID: "m1"}}}
	data, err := events.Encode(mine)
	if err != nil {
		t.Fatal(err)
	}
	// The first attempt lands; its ack is lost; the retry conflicts.
	ack, err := st.js.PublishMsg(ctx, &nats.Msg{Subject: st.cfg.Subjects.Event("c1", "t1"), Data: data},
		jetstream.WithExpectLastSequencePerSubject(s1.LastSeq.Seq(st.shards)))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.publish(ctx, &mine, st.shards.OfEvent(mine, ""), s1.LastSeq); !errors.Is(err, aggregate.ErrConflict) {
		t.Fatalf("retry: %v, want a conflict", err)
	}
	caught, seq, err := st.catchUp(ctx, s1, mine)
	if err != nil || seq != st.shards.Position(0, ack.Sequence) || caught.Version != 2 || caught.MailIndex("m1") != 1 {
		t.Fatalf("catchUp = v%d, seq %d, %v; want v2 with m1, seq %d", caught.Version, seq, err, ack.Sequence)
	}
	// Someone else's event at that place: caught up, not ours.
	other := mine
	other.ID = "evt-other"
	caught, seq, err = st.catchUp(ctx, s1, other)
	if err != nil || seq != 0 || caught.Version != 2 {
		t.Fatalf("catchUp of another's event = v%d, seq %d, %v; want v2, seq 0", caught.Version, seq, err)
	}
}
