package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// ErrShardsMismatch is returned (wrapped) by Open when the log was
// created with another number of shards than Config.Shards asks for: K
// is fixed when the log is created (docs/DESIGN.md, "Sharded log").
var ErrShardsMismatch = errors.New("store: the log has another number of shards")

// MaxShards is the most shards a log may have: each is a stream with a
// leader of its own, and every process follows every one.
const MaxShards = 64

// MetaBucket is the KV bucket of a stream's metadata: the entry
// shardsKey records the number of shards.
func MetaBucket(stream string) string { return stream + "_META" }

const shardsKey = "shards"

// meta is the stored form of the shards entry.
type meta struct {
	Shards int `json:"shards"`
}

// agreeShards records k as the log's number of shards, or checks it
// against the one recorded. A log with no entry whose stream (the
// unsharded one, named stream) exists predates sharding: it has one
// shard. Two processes creating one log at once both read what the
// first recorded.
func agreeShards(ctx context.Context, js jetstream.JetStream, stream string, k, replicas int) error {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: MetaBucket(stream), Description: "taskledger log metadata", History: 1,
		Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return fmt.Errorf("store: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	for range 2 {
		recorded, ok, err := recordedShards(ctx, kv)
		if err != nil {
			return err
		}
		if !ok {
			if _, serr := js.Stream(ctx, stream); serr == nil {
				recorded, ok = 1, true // a log from before sharding
			} else if !errors.Is(serr, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("store: stream %s: %w", stream, serr)
			}
			if err := noShardsWithoutEntry(ctx, js, stream); err != nil {
				return err
			}
		}
		if ok && recorded != k {
			return fmt.Errorf("%w: %s has %d, --shards asks for %d", ErrShardsMismatch, stream, recorded, k)
		}
		data, _ := json.Marshal(meta{Shards: k})
		if _, err = kv.Create(ctx, shardsKey, data); err == nil || ok && errors.Is(err, jetstream.ErrKeyExists) {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("store: record shards: %w", err)
		}
		// Another process recorded it first: check against its entry.
	}
	return fmt.Errorf("store: record shards: the entry changed while it was recorded")
}

// recordedShards returns the number of shards kv records; ok is false
// when it records none.
func recordedShards(ctx context.Context, kv jetstream.KeyValue) (k int, ok bool, err error) {
	e, err := kv.Get(ctx, shardsKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("store: read shards: %w", err)
	}
	var m meta
	if err := json.Unmarshal(e.Value(), &m); err != nil || m.Shards < 1 {
		return 0, false, fmt.Errorf("store: bad shards entry %q", e.Value())
	}
	return m.Shards, true, nil
}

// ReadShards returns the number of shards of the log named stream, as its
// metadata records it, without creating anything: 1 when no metadata
// exists (a log from before sharding, or none yet). Offline tools call it
// to read a log they do not open for writing.
func ReadShards(ctx context.Context, js jetstream.JetStream, stream string) (events.Shards, error) {
	kv, err := js.KeyValue(ctx, MetaBucket(stream))
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return events.Shards{}, fmt.Errorf("store: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	if err == nil {
		k, ok, err := recordedShards(ctx, kv)
		if err != nil || ok {
			return events.Shards{K: k}, err
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
		return fmt.Errorf("store: stream %s: %w", first, err)
	}
}
