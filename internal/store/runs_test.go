package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

// TestRuns checks the runs bucket's configuration and its
// compare-and-set: a save on any revision but the stored one fails and
// changes nothing.
func TestRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := testnats.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ns := testnats.NewNamespace(t)
	runs, err := store.OpenRuns(ctx, js, store.RunsConfig{Stream: ns.Stream, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("Bucket", func(t *testing.T) {
		if store.RunsBucket(events.DefaultStream) == "TASKLEDGER_RUNS" {
			t.Fatal("the runs bucket of the default stream is executor.KVCheckpoints' default bucket")
		}
		kv, err := js.KeyValue(ctx, store.RunsBucket(ns.Stream))
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
		if cfg.MaxMsgsPerSubject != 1 || cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 ||
			cfg.MaxAge != time.Hour+events.MaxTimeoutSeconds*time.Second {
			t.Fatalf("bucket: history %d, storage %v, replicas %d, max age %s", cfg.MaxMsgsPerSubject, cfg.Storage, cfg.Replicas, cfg.MaxAge)
		}
	})

	t.Run("CompareAndSet", func(t *testing.T) {
		id := events.NewID()
		if _, err := runs.Get(ctx, id); !errors.Is(err, store.ErrNoRun) {
			t.Fatalf("get before a save: %v, want ErrNoRun", err)
		}
		at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		first, err := runs.Save(ctx, id, 0, store.Run{DeliveryID: "d1", UpdatedAt: at, Doc: json.RawMessage(`{"turn":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		for _, rev := range []uint64{0, first.Revision + 1} {
			if _, err := runs.Save(ctx, id, rev, store.Run{DeliveryID: "d1", Doc: json.RawMessage(`{"turn":9}`)}); !errors.Is(err, store.ErrRunRevision) {
				t.Fatalf("save on revision %d (stored %d): %v, want ErrRunRevision", rev, first.Revision, err)
			}
		}
		got, err := runs.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Revision != first.Revision || got.DeliveryID != "d1" || !got.UpdatedAt.Equal(at) || string(got.Doc) != `{"turn":1}` {
			t.Fatalf("stored %+v, want %+v", got, first)
		}
		second, err := runs.Save(ctx, id, first.Revision, store.Run{DeliveryID: "d1", Doc: json.RawMessage(`{"turn":2}`)})
		if err != nil || second.Revision <= first.Revision {
			t.Fatalf("update: %+v %v", second, err)
		}
	})
}
