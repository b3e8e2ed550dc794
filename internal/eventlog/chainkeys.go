package eventlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrChainKeyMismatch is returned (wrapped) by AgreeChainKeys when a key
// id the log records has another fingerprint than the caller's key of
// that id: the caller's key file is not the log's.
var ErrChainKeyMismatch = errors.New("eventlog: the chain key is not the log's")

// chainKeysKey is the metadata entry of the log's chain keys: by key id,
// each key's fingerprint (events.Keyring.Fingerprints), never a secret.
const chainKeysKey = "chainkeys"

// ChainKeys returns the fingerprints of the chain keys the log named
// stream records, by key id; none for a log that was never keyed (or no
// metadata bucket). It creates nothing.
func ChainKeys(ctx context.Context, js jetstream.JetStream, stream string) (map[uint32]string, error) {
	kv, err := js.KeyValue(ctx, MetaBucket(stream))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("eventlog: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	fps, _, err := recordedChainKeys(ctx, kv)
	return fps, err
}

// AgreeChainKeys checks the fingerprints of a process's chain keys (by
// id) against those the log records, and records those of the ids it
// does not know yet: the first process to key a log records its key, a
// rotation adds the new one. A recorded id with another fingerprint is
// ErrChainKeyMismatch. It returns the ids the log records that keys
// lacks (a key rotated in by another process, not copied here yet). Two
// processes agreeing at once both end up checked against one record.
func AgreeChainKeys(ctx context.Context, js jetstream.JetStream, stream string, keys map[uint32]string) (missing []uint32, err error) {
	kv, err := js.KeyValue(ctx, MetaBucket(stream))
	if err != nil {
		return nil, fmt.Errorf("eventlog: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	for range 8 {
		recorded, rev, err := recordedChainKeys(ctx, kv)
		if err != nil {
			return nil, err
		}
		missing = missing[:0]
		for id, fp := range recorded {
			mine, ok := keys[id]
			if !ok {
				missing = append(missing, id)
			} else if mine != fp {
				return nil, fmt.Errorf("%w: the log's chain key %d has fingerprint %s, this key file's %s", ErrChainKeyMismatch, id, fp, mine)
			}
		}
		slices.Sort(missing)
		merged := maps.Clone(recorded)
		if merged == nil {
			merged = map[uint32]string{}
		}
		maps.Copy(merged, keys)
		if len(merged) == len(recorded) {
			return missing, nil
		}
		data, err := json.Marshal(merged)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, chainKeysKey, data)
		} else {
			_, err = kv.Update(ctx, chainKeysKey, data, rev)
		}
		if err == nil {
			return missing, nil
		}
		var apiErr *jetstream.APIError
		if !errors.Is(err, jetstream.ErrKeyExists) && !(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
			return nil, fmt.Errorf("eventlog: record chain keys: %w", err)
		}
		// Another process recorded first: check against its entry.
	}
	return nil, errors.New("eventlog: record chain keys: the entry kept changing")
}

// recordedChainKeys returns the chain keys kv records and the entry's
// revision, 0 when there is none.
func recordedChainKeys(ctx context.Context, kv jetstream.KeyValue) (map[uint32]string, uint64, error) {
	e, err := kv.Get(ctx, chainKeysKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("eventlog: read chain keys: %w", err)
	}
	var fps map[uint32]string
	if err := json.Unmarshal(e.Value(), &fps); err != nil {
		return nil, 0, fmt.Errorf("eventlog: bad chain keys entry %q", e.Value())
	}
	return fps, e.Revision(), nil
}
