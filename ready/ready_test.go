package ready_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/ready"
)

// TestConsumerConfig: every claimer of a queue gets the same durable
// consumer, filtered to the queue's subject, with explicit acks, the
// default ack wait unless given one, and the server's idle expiry.
func TestConsumerConfig(t *testing.T) {
	t.Parallel()
	subjects := events.Subjects{Root: "tl"}
	got := ready.ConsumerConfig(subjects, "deploy", 0)
	want := jetstream.ConsumerConfig{
		Durable: "ready_deploy", FilterSubject: "tl.ready.deploy", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ready.DefaultAckWait, MaxAckPending: -1, InactiveThreshold: ready.ConsumerIdle,
	}
	if got.Durable != want.Durable || got.FilterSubject != want.FilterSubject || got.AckPolicy != want.AckPolicy ||
		got.AckWait != want.AckWait || got.MaxAckPending != want.MaxAckPending || got.InactiveThreshold != want.InactiveThreshold {
		t.Fatalf("ConsumerConfig = %+v, want %+v", got, want)
	}
	if got := ready.ConsumerConfig(subjects, "deploy", time.Minute); got.AckWait != time.Minute {
		t.Fatalf("ack wait %v, want the 1m given", got.AckWait)
	}
}
