package eventlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// ErrShardsMismatch is returned (wrapped) by AgreeLayout (and so by
// store.Open) when the log was created with another layout than the one
// asked for, and by ReadShards when a sharded log lost its layout entry:
// the layout is fixed when the log is created (the package doc, "Sharded
// log").
var ErrShardsMismatch = errors.New("eventlog: the log has another number of shards")

// MaxShards is the most shards a log may have: each is a stream with a
// leader of its own, and every process follows every one.
const MaxShards = 64

// MetaBucket is the KV bucket of a stream's metadata: the entry
// shardsKey records the number of shards.
func MetaBucket(stream string) string { return stream + "_META" }

const shardsKey = "shards"

// MaxEpochSlots is the most epoch slots a log may have, and
// MinEpochPeriod the shortest epoch period.
const (
	MaxEpochSlots  = 16
	MinEpochPeriod = time.Second
)

// Layout is the stored form of the shards entry: the number of shards
// and, for a log with epochs, its slots and period.
type Layout struct {
	Shards int           `json:"shards"`
	Slots  int           `json:"epochSlots,omitempty"`
	Period time.Duration `json:"epochPeriod,omitempty"`
}

func (l Layout) String() string {
	if l.Slots == 0 {
		return fmt.Sprintf("%d shards", l.Shards)
	}
	return fmt.Sprintf("%d shards, %d epoch slots of %s", l.Shards, l.Slots, l.Period)
}

// AgreeLayout records want as the log's layout, or checks it against
// the one recorded. A log with no entry whose stream (the unsharded one,
// named stream) exists predates sharding: it has one shard. Two
// processes creating one log at once both read what the first recorded.
// A new log with epochs records its epoch slots too, the first holding
// the epoch of now.
func AgreeLayout(ctx context.Context, js jetstream.JetStream, stream string, want Layout, replicas int, now time.Time) error {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: MetaBucket(stream), Description: "taskledger log metadata", History: 1,
		Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return fmt.Errorf("eventlog: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	for range 2 {
		recorded, ok, err := recordedLayout(ctx, kv)
		if err != nil {
			return err
		}
		if !ok {
			if _, serr := js.Stream(ctx, stream); serr == nil {
				recorded, ok = Layout{Shards: 1}, true // a log from before sharding
			} else if !errors.Is(serr, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("eventlog: stream %s: %w", stream, serr)
			}
			if err := noShardsWithoutEntry(ctx, js, stream); err != nil {
				return err
			}
		}
		if ok && recorded != want {
			return fmt.Errorf("%w: %s has %s, the configuration asks for %s", ErrShardsMismatch, stream, recorded, want)
		}
		if want.Slots > 0 {
			if err := initEpochs(ctx, kv, want.Slots, want.Period, now); err != nil {
				return err
			}
		}
		data, _ := json.Marshal(want)
		if _, err = kv.Create(ctx, shardsKey, data); err == nil || ok && errors.Is(err, jetstream.ErrKeyExists) {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("eventlog: record shards: %w", err)
		}
		// Another process recorded it first: check against its entry.
	}
	return fmt.Errorf("eventlog: record shards: the entry changed while it was recorded")
}

// recordedLayout returns the layout kv records; ok is false when it
// records none.
func recordedLayout(ctx context.Context, kv jetstream.KeyValue) (l Layout, ok bool, err error) {
	e, err := kv.Get(ctx, shardsKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return l, false, nil
	}
	if err != nil {
		return l, false, fmt.Errorf("eventlog: read shards: %w", err)
	}
	if err := json.Unmarshal(e.Value(), &l); err != nil || l.Shards < 1 || l.Slots < 0 || l.Slots > 0 && l.Period < MinEpochPeriod {
		return l, false, fmt.Errorf("eventlog: bad shards entry %q", e.Value())
	}
	return l, true, nil
}

// ReadShards returns the layout of the log named stream (shards and epoch
// slots), as its metadata records it, without creating anything: one
// shard when no metadata exists (a log from before sharding, or none
// yet). Offline tools call it to read a log they do not open for writing.
func ReadShards(ctx context.Context, js jetstream.JetStream, stream string) (events.Shards, error) {
	kv, err := js.KeyValue(ctx, MetaBucket(stream))
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return events.Shards{}, fmt.Errorf("eventlog: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	if err == nil {
		l, ok, err := recordedLayout(ctx, kv)
		if err != nil || ok {
			return events.Shards{K: l.Shards, Slots: l.Slots}, err
		}
	}
	return events.Shards{K: 1}, noShardsWithoutEntry(ctx, js, stream)
}

// noShardsWithoutEntry fails with ErrShardsMismatch when stream's first
// shard stream exists although no entry records the number of shards:
// taking the log for one stream then would read nothing of it, or start
// a second log beside it.
func noShardsWithoutEntry(ctx context.Context, js jetstream.JetStream, stream string) error {
	first := events.Shards{K: 2}.Stream(stream, 0)
	_, err := js.Stream(ctx, first)
	switch {
	case err == nil:
		return fmt.Errorf("%w: stream %s exists but %s records no number of shards; restore its entry (key %q: {\"shards\": K})", ErrShardsMismatch, first, MetaBucket(stream), shardsKey)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	default:
		return fmt.Errorf("eventlog: stream %s: %w", first, err)
	}
}
