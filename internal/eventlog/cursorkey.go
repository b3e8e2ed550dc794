package eventlog

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// cursorKeyName is the key of the metadata bucket that holds CursorKey.
const cursorKeyName = "cursor-key"

// CursorKeySize is the length of CursorKey's key: AES-256.
const CursorKeySize = 32

// CursorKey returns the key that seals the event stream's resume tokens
// for customer tokens (internal/httpapi), creating it on first use: 32
// random bytes in the log's metadata bucket (MetaBucket, key
// "cursor-key"), which AgreeLayout created. Every process of the log
// reads the same key, so a stream resumes on any of them and after a
// restart. The key hides the log's sequences from API customers; whoever
// can read the bucket can read the log itself. Two processes creating it
// at once both return the first one's.
func CursorKey(ctx context.Context, js jetstream.JetStream, stream string) ([]byte, error) {
	kv, err := js.KeyValue(ctx, MetaBucket(stream))
	if err != nil {
		return nil, fmt.Errorf("eventlog: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	for range 2 {
		entry, err := kv.Get(ctx, cursorKeyName)
		if err == nil {
			if len(entry.Value()) != CursorKeySize {
				return nil, fmt.Errorf("eventlog: %s key %q holds %d bytes, want %d: delete it to make a new one (customers' saved resume tokens then answer 400)",
					MetaBucket(stream), cursorKeyName, len(entry.Value()), CursorKeySize)
			}
			return entry.Value(), nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("eventlog: read cursor key: %w", err)
		}
		key := make([]byte, CursorKeySize)
		rand.Read(key)
		if _, err := kv.Create(ctx, cursorKeyName, key); err == nil {
			return key, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("eventlog: record cursor key: %w", err)
		}
		// Another process created it first: read its key.
	}
	return nil, errors.New("eventlog: the cursor key changed while it was created")
}
