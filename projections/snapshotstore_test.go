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
	t.Run("LoadWhileReplaced", func(t *testing.T) {
		// Every load during a run of saves returns one whole saved snapshot:
		// a save replacing the object a load is reading must not fail it.
		s := open(t)
		value := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 200<<10) } // two chunks
		if err := s.Save(ctx, value(0)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			defer close(done)
			for i := 1; i <= 100; i++ {
				if err := s.Save(ctx, value(i)); err != nil {
					done <- err
					return
				}
			}
		}()
		loads := 0
		for saving := true; saving || loads < 10; loads++ {
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
				saving = false
			default:
			}
			data, ok := load(t, s)
			if !ok || len(data) != 200<<10 || !bytes.Equal(data, bytes.Repeat(data[:1], len(data))) {
				t.Fatalf("load %d returned %d bytes (ok %v), not one saved snapshot", loads, len(data), ok)
			}
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
