package delivery

import (
	"bytes"
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/reactors"
)

// Publisher is the alarm's, and HoldOrHandoff its Handoff (checked here,
// so the package itself does not import the alarm's).
var (
	_ reactors.Publisher                         = (*Publisher)(nil)
	_ func(aggregate.State, []events.Event) bool = (*Queues)(nil).HoldOrHandoff
)

// TestPublisher: a notification published twice under one message id is
// stored once, decodes to the task's delivery in either encoding, and
// ReadyStored finds it until it is gone, and never finds another
// delivery's notification at its sequence.
func TestPublisher(t *testing.T) {
	t.Parallel()
	for _, asJSON := range []bool{false, true} {
		ctx := context.Background()
		ns := testnats.NewNamespace(t)
		js, err := jetstream.New(testnats.Conn(t))
		if err != nil {
			t.Fatal(err)
		}
		rs, err := EnsureStream(ctx, js, ns.ReadyStream, ns.Subjects, 1)
		if err != nil {
			t.Fatal(err)
		}
		p := Publisher{JS: js, Subjects: ns.Subjects, Stream: rs, JSON: asJSON}
		st := aggregate.State{TaskID: "t1", CustomerID: "acme", Spec: events.TaskSpec{Queue: "q", RootID: "t1", Kind: "resize", Payload: []byte(`{"secret":1}`)},
			Delivery: aggregate.Delivery{ID: "d1"}}

		seq, err := p.PublishReady(ctx, st, st.Delivery.ID)
		if err != nil {
			t.Fatal(err)
		}
		again, err := p.PublishReady(ctx, st, st.Delivery.ID)
		if err != nil || again != seq {
			t.Fatalf("JSON %v: the same message id again stored at %d (%v), want %d", asJSON, again, err, seq)
		}
		msg, err := rs.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Subject != ns.Subjects.Ready("q") {
			t.Fatalf("JSON %v: published on %s, want %s", asJSON, msg.Subject, ns.Subjects.Ready("q"))
		}
		n, err := events.UnmarshalReady(msg.Data, msg.Header.Get(events.ContentTypeHeader))
		if err != nil || n.TaskID != "t1" || n.DeliveryID != "d1" || n.CustomerID != "acme" || n.Queue != "q" || n.Kind != "resize" {
			t.Fatalf("JSON %v: notification %+v (%v), want task t1's delivery d1 of kind resize", asJSON, n, err)
		}
		if bytes.Contains(msg.Data, []byte("secret")) {
			t.Fatalf("JSON %v: the notification carries the payload: %q", asJSON, msg.Data)
		}

		st.Delivery.ReadySeq = seq
		if ok, err := p.ReadyStored(ctx, st); err != nil || !ok {
			t.Fatalf("JSON %v: ReadyStored = %v, %v; want true", asJSON, ok, err)
		}
		other := st
		other.Delivery.ID = "d2"
		if ok, err := p.ReadyStored(ctx, other); err != nil || ok {
			t.Fatalf("JSON %v: ReadyStored of another delivery at the same sequence = %v, %v; want false", asJSON, ok, err)
		}
		if err := rs.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
		if ok, err := p.ReadyStored(ctx, st); err != nil || ok {
			t.Fatalf("JSON %v: ReadyStored after the delete = %v, %v; want false", asJSON, ok, err)
		}
	}
}
