package node

import (
	"bytes"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

// Heartbeats across processes. A claim's heartbeat renews the projections
// of the process that served it (projections.Engine.Renew); that process
// announces the renewal on events.Subjects.Heartbeats (core NATS: nothing
// is stored, a lost announcement costs at most that one renewal), and
// every process renews its own projections with what it hears, so the
// process whose alarm holds the task's timer partition sees every
// heartbeat whichever process served it.

// announceRenewals returns scheduler.Config.Renewed for nc: it publishes
// each renewal, without waiting.
func announceRenewals(nc *nats.Conn, subjects events.Subjects) func(taskID, deliveryID string) {
	subject := subjects.Heartbeats()
	return func(taskID, deliveryID string) {
		nc.Publish(subject, []byte(taskID+" "+deliveryID)) // best effort: a failure costs one renewal elsewhere
	}
}

// followRenewals renews eng's claims with the renewals announced on nc
// until the returned stop is called. A malformed announcement is ignored.
func followRenewals(nc *nats.Conn, subjects events.Subjects, eng *projections.Engine, now func() time.Time) (stop func(), err error) {
	sub, err := nc.Subscribe(subjects.Heartbeats(), func(m *nats.Msg) {
		taskID, deliveryID, ok := bytes.Cut(m.Data, []byte{' '})
		if !ok || events.ValidID(string(taskID)) != nil || events.ValidID(string(deliveryID)) != nil {
			return
		}
		eng.Renew(string(taskID), string(deliveryID), now())
	})
	if err != nil {
		return nil, err
	}
	return func() { sub.Unsubscribe() }, nil
}
