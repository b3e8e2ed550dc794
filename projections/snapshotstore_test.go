package projections_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/taskledger/taskledger/projections"
)

// TestSnapshotStores runs one behaviour suite against every SnapshotStore
// implementation.
func TestSnapshotStores(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) projections.SnapshotStore{
		"Memory": func(*testing.T) projections.SnapshotStore { return &projections.MemorySnapshots{} },
		"Object": func(t *testing.T) projections.SnapshotStore {
			b := setupLog(t)
			s, err := projections.OpenObjectSnapshots(context.Background(), b.store.JetStream(), b.ns.Stream+"_SNAPSHOTS", "projections", 1)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testSnapshotStore(t, open)
		})
	}
}

func testSnapshotStore(t *testing.T, open func(t *testing.T) projections.SnapshotStore) {
	ctx := context.Background()
	load := func(t *testing.T, s projections.SnapshotStore) ([]byte, bool) {
		t.Helper()
		data, ok, err := s.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return data, ok
	}
	t.Run("EmptyHasNone", func(t *testing.T) {
		if _, ok := load(t, open(t)); ok {
			t.Fatal("a new store has a snapshot")
		}
	})
	t.Run("SaveReplaces", func(t *testing.T) {
		s := open(t)
		for i := range 3 {
			if err := s.Save(ctx, []byte(fmt.Sprint("snapshot ", i))); err != nil {
				t.Fatal(err)
			}
		}
		if data, ok := load(t, s); !ok || string(data) != "snapshot 2" {
			t.Fatalf("Load = %q, %v; want the last save", data, ok)
		}
	})
	t.Run("LargeRoundTrip", func(t *testing.T) {
		s := open(t)
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: several object chunks
		if err := s.Save(ctx, big); err != nil {
			t.Fatal(err)
		}
		big[0] = 'X' // the store keeps its own copy
		if data, ok := load(t, s); !ok || len(data) != len(big) || data[0] != '0' || !bytes.Equal(data[1:], big[1:]) {
			t.Fatalf("Load returned %d bytes (ok %v), not the %d saved", len(data), ok, len(big))
		}
	})
	t.Run("DeleteRemoves", func(t *testing.T) {
		s := open(t)
		if err := s.Delete(ctx); err != nil {
			t.Fatalf("Delete with no snapshot: %v", err)
		}
		if err := s.Save(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := load(t, s); ok {
			t.Fatal("a deleted snapshot still loads")
		}
	})
}
