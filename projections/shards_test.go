package projections_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
)

// A node on a log of three shards writes a snapshot of its applied vector;
// restarted, it loads it and catches up each shard from its component.
// A start with another number of shards is refused.
func TestShardedSnapshotRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, ns := testnats.Conn(t), testnats.NewNamespace(t)
	three := func(c *node.Config) { c.Shards = 3 }
	first := startLoggedNode(t, nc, ns, three)
	settledTraffic(t, first, 60)
	if err := first.Engine.SaveSnapshot(ctx); err != nil {
		t.Fatal(err)
	}
	saved := first.Engine.Positions()
	if len(saved) != 3 || slices.Contains(saved, 0) {
		t.Fatalf("applied vector %v, want three shards each with events", saved)
	}
	for i, pos := range saved {
		if shard, _ := first.Store.Shards().Split(pos); shard != i {
			t.Fatalf("component %d is position %d of shard %d", i, pos, shard)
		}
	}
	applied := first.Engine.Applied()
	first.Stop()

	second := startLoggedNode(t, nc, ns, three)
	if got := second.logUint(t, "projection snapshot loaded", "applied"); got != applied {
		t.Fatalf("snapshot loaded at %d, want %d", got, applied)
	}
	if got := second.Engine.Positions(); !slices.Equal(got, saved) {
		t.Fatalf("restarted at %v, want %v", got, saved)
	}
	for _, pos := range saved {
		if !second.Engine.Covers(pos) {
			t.Fatalf("restarted engine does not cover %d", pos)
		}
	}
	second.Stop()

	_, err := node.New(ctx, node.Config{NC: nc, Stream: ns.Stream, ReadyStream: ns.ReadyStream, Subjects: ns.Subjects})
	if !errors.Is(err, store.ErrShardsMismatch) {
		t.Fatalf("a start with one shard on a log of three: %v, want ErrShardsMismatch", err)
	}
}
