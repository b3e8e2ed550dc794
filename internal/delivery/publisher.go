package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// EnsureStream creates or updates the work-queue stream that carries
// ready notifications. Queues carry notifications; they do not define
// truth, so its retention is the work queue's: a notification is gone once
// a claimer acknowledged it.
func EnsureStream(ctx context.Context, js jetstream.JetStream, name string, subjects events.Subjects, replicas int) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        name,
		Description: "taskledger ready notifications",
		Subjects:    []string{subjects.AllReady()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("delivery: ready stream %s: %w", name, err)
	}
	return s, nil
}

// Publisher publishes ready notifications to the ready stream and looks
// them up there; it is the alarm's reactors.Publisher. Its fields are set
// once; it is safe for concurrent use.
type Publisher struct {
	JS       jetstream.JetStream
	Subjects events.Subjects
	Stream   jetstream.Stream // the ready stream, for ReadyStored
	// JSON publishes JSON bodies (ContentTypeJSON) for consumers that
	// read only JSON; default msgpack (ContentTypeMsgpack). Either way the
	// Content-Type header names the encoding.
	JSON bool
	// Acked, if set, publishes the notifications instead of JS (the
	// log's append pipeline, which costs less a message).
	Acked AckedPublisher
}

// AckedPublisher publishes a message to a stream once and returns the
// sequence the stream's ack names, or its error (*jetstream.APIError for
// the server's answer). eventlog.Pipeline implements it.
type AckedPublisher interface {
	Publish(ctx context.Context, msg *nats.Msg) (uint64, error)
}

// publish sends msg through Acked, or else JS.
func (p Publisher) publish(ctx context.Context, msg *nats.Msg) (uint64, error) {
	if p.Acked != nil {
		return p.Acked.Publish(ctx, msg)
	}
	ack, err := p.JS.PublishMsg(ctx, msg)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// contentType is the encoding p publishes.
func (p Publisher) contentType() string {
	if p.JSON {
		return events.ContentTypeJSON
	}
	return events.ContentTypeMsgpack
}

// notification is the ready notification of s's current delivery.
func notification(s aggregate.State) events.ReadyNotification {
	return events.ReadyNotification{
		TaskID: s.TaskID, CustomerID: s.CustomerID, RootID: s.Spec.RootID, ParentID: s.Spec.ParentID,
		Queue: s.Spec.Queue, DeliveryID: s.Delivery.ID, Signal: s.Spec.Signal, Attempt: s.Attempt(), Labels: s.Spec.Labels, Kind: s.Spec.Kind,
	}
}

// PublishReady publishes the notification for s's current delivery with
// Nats-Msg-Id msgID, waits for the stream's acknowledgement and returns
// the sequence the notification is stored at. A copy published again
// under the same msgID within the dedupe window is dropped, and its
// acknowledgement names the first copy's sequence. ctx bounds the publish
// and its retries; an error is the stream's or the connection's.
func (p Publisher) PublishReady(ctx context.Context, s aggregate.State, msgID string) (uint64, error) {
	ct := p.contentType()
	body, err := events.MarshalReady(notification(s), ct)
	if err != nil {
		return 0, err
	}
	// The message id as a header, not a publish option: nats.go then
	// allocates no options.
	msg := &nats.Msg{Subject: p.Subjects.Ready(s.Spec.Queue), Data: body,
		Header: nats.Header{events.ContentTypeHeader: {ct}, jetstream.MsgIDHeader: {msgID}}}
	for attempt := 1; ; attempt++ {
		seq, err := p.publish(ctx, msg)
		if err == nil {
			return seq, nil
		}
		// On a replicated stream a notification another scheduler is
		// publishing at this moment answers "duplicate message id is in
		// process"; once that copy is stored a retry is acknowledged as
		// its duplicate.
		var apiErr *jetstream.APIError
		if attempt == 5 || !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeDuplicateInProcess {
			return 0, err
		}
		select {
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		case <-ctx.Done():
			return 0, err
		}
	}
}

// ReadyStored reports whether the ready stream still holds the
// notification of s's delivery at s.Delivery.ReadySeq. A work-queue stream
// removes a notification once a claimer acknowledged it, so a stored one
// is waiting for a claimer or taken by one and not yet settled. An error
// means the stream did not answer, not that the notification is gone.
func (p Publisher) ReadyStored(ctx context.Context, s aggregate.State) (bool, error) {
	msg, err := p.Stream.GetMsg(ctx, s.Delivery.ReadySeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// A stream deleted and created again reuses sequences: the message
	// there must be this delivery's.
	n, err := events.UnmarshalReady(msg.Data, msg.Header.Get(events.ContentTypeHeader))
	return err == nil && n.TaskID == s.TaskID && n.DeliveryID == s.Delivery.ID, nil
}

// errCodeDuplicateInProcess is a replicated stream's answer to a message
// id whose first copy is still being stored (JSStreamDuplicateMessageConflict).
const errCodeDuplicateInProcess jetstream.ErrorCode = 10158
