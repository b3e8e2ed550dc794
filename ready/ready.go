// Package ready is the wire contract of the ready queue that executors
// share with the server: the durable pull consumer every claimer of a
// queue pulls its ready notifications from (executor.Worker with NATS,
// and the server's claims/next alike), its acknowledgement wait and how
// long the server keeps it without a pull.
//
// The notification itself, its subjects and stream name stay in events
// (events.ReadyNotification, events.MarshalReady and UnmarshalReady,
// events.Subjects.Ready, events.ReadyStreamName): the body is encoded
// with the log's codec and its pooled msgpack encoders, and events owns
// subject naming. This package imports events and the NATS client only,
// so an executor links no server code to read the queue.
package ready

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// ConsumerIdle is how long the server keeps a queue's ready consumer that
// nobody pulls from; the next claimer creates it again (the ready stream
// keeps the notifications meanwhile).
const ConsumerIdle = time.Hour

// DefaultAckWait is how long a taken notification stays invisible to
// other claimers unless ConsumerConfig is given another wait.
const DefaultAckWait = 30 * time.Second

// ConsumerConfig is the durable pull consumer of queue's ready
// notifications on the ready stream, shared by every NATS-mode worker of
// the queue and the scheduler's claims/next. ackWait is how long a taken
// notification stays invisible to other claimers; 0 means
// DefaultAckWait. The server deletes it after ConsumerIdle without a
// pull.
func ConsumerConfig(subjects events.Subjects, queue string, ackWait time.Duration) jetstream.ConsumerConfig {
	if ackWait <= 0 {
		ackWait = DefaultAckWait
	}
	return jetstream.ConsumerConfig{
		Durable:           "ready_" + queue,
		FilterSubject:     subjects.Ready(queue),
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           ackWait,
		MaxAckPending:     -1,
		InactiveThreshold: ConsumerIdle,
	}
}
