package eventlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// StreamConfig is what every stream of a log is created with. The
// caller fills its defaults (store.Config does).
type StreamConfig struct {
	Stream          string          // the log's base stream name
	Subjects        events.Subjects // the log's base subjects
	Replicas        int
	DuplicateWindow time.Duration // server-side dedupe of retried appends
	// MaxEventBytes, if above 0, is each stream's maximum message size.
	MaxEventBytes int32
}

// Part is one stream of the log (a shard, or a shard of an epoch slot):
// the stream, the subjects it holds and its direct-get reader.
type Part struct {
	Stream   jetstream.Stream
	Subjects events.Subjects
	Get      *DirectGetter
}

// OpenPart creates part i's stream, or updates it to cfg, and its
// reader; epochs are the log's epoch slots (the zero value without
// epochs). A sealed stream is left as it is; a missing stream of a slot
// whose epoch was removed starts after the removed one's last sequence.
// The caller closes the Part's Get.
func OpenPart(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, cfg StreamConfig, shards events.Shards, i int, epochs Epochs) (Part, error) {
	name, subjects := shards.Stream(cfg.Stream, i), shards.Subjects(cfg.Subjects, i)
	stream, err := js.Stream(ctx, name)
	switch {
	case err == nil && stream.CachedInfo().Config.Sealed:
		get, err := NewDirectGetter(nc, name)
		return Part{Stream: stream, Subjects: subjects, Get: get}, err
	case err != nil && !errors.Is(err, jetstream.ErrStreamNotFound):
		return Part{}, fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	var first uint64 // an update keeps the stream's
	if err == nil {
		first = stream.CachedInfo().Config.FirstSeq
	} else if slot, ok := shards.SlotOf(i); ok {
		if next := epochs.Slots[slot].NextSeqs; next != nil {
			first = next[i%len(next)]
		}
	}
	stream, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		FirstSeq:    first,
		Name:        name,
		Description: "taskledger event log: one subject per task, per concurrency key and per schedule",
		Subjects:    subjects.Log(),
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowDirect: true,
		MaxMsgSize:  cfg.MaxEventBytes,
	})
	if err != nil {
		return Part{}, fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	get, err := NewDirectGetter(nc, name)
	if err != nil {
		return Part{}, err
	}
	return Part{Stream: stream, Subjects: subjects, Get: get}, nil
}

// IsConflict reports whether err is JetStream's answer to a wrong expected
// last sequence: 10071 on a single replica, 10164 on a replicated stream.
func IsConflict(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
