package eventlog_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// openSharded opens a Store with k shards (the shared harness's).
var openSharded = testnode.OpenSharded

// TestShardsAreFixedWhenTheLogIsCreated: AgreeLayout records the layout
// of a new log and refuses another one; ReadShards reads it.
func TestShardsAreFixedWhenTheLogIsCreated(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("Sharded", func(t *testing.T) {
		ns := testnats.NewNamespace(t)
		if _, err := openSharded(t, nc, ns, 3); err != nil {
			t.Fatal(err)
		}
		if _, err := openSharded(t, nc, ns, 3); err != nil {
			t.Fatalf("a start with the same shards: %v", err)
		}
		for _, k := range []int{1, 2} {
			if _, err := openSharded(t, nc, ns, k); !errors.Is(err, eventlog.ErrShardsMismatch) {
				t.Fatalf("a start with %d shards: %v, want ErrShardsMismatch", k, err)
			}
		}
		if got, err := eventlog.ReadShards(ctx, js, ns.Stream); err != nil || got.N() != 3 {
			t.Fatalf("ReadShards = %v, %v; want 3", got, err)
		}
		for i := range 3 {
			if _, err := js.Stream(ctx, fmt.Sprintf("%s_%d", ns.Stream, i)); err != nil {
				t.Fatalf("shard %d: %v", i, err)
			}
		}
		if _, err := js.Stream(ctx, ns.Stream); err == nil {
			t.Fatalf("a sharded log has the unsharded stream %s", ns.Stream)
		}
	})

	t.Run("ShardedLogWithoutEntry", func(t *testing.T) {
		ns := testnats.NewNamespace(t)
		if _, err := openSharded(t, nc, ns, 3); err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteKeyValue(ctx, eventlog.MetaBucket(ns.Stream)); err != nil {
			t.Fatal(err)
		}
		for _, k := range []int{1, 3} {
			if _, err := openSharded(t, nc, ns, k); !errors.Is(err, eventlog.ErrShardsMismatch) {
				t.Fatalf("a start with %d shards on a sharded log without its entry: %v, want ErrShardsMismatch", k, err)
			}
		}
		if _, err := eventlog.ReadShards(ctx, js, ns.Stream); !errors.Is(err, eventlog.ErrShardsMismatch) {
			t.Fatalf("ReadShards on a sharded log without its entry: %v, want ErrShardsMismatch", err)
		}
		if _, err := js.Stream(ctx, ns.Stream); err == nil {
			t.Fatalf("a refused start created the unsharded stream %s", ns.Stream)
		}
	})

	t.Run("LogFromBeforeSharding", func(t *testing.T) {
		ns := testnats.NewNamespace(t)
		st, err := openSharded(t, nc, ns, 1)
		if err != nil {
			t.Fatal(err)
		}
		schedule(t, st)
		// A data directory written before the metadata entry existed.
		if err := js.DeleteKeyValue(ctx, eventlog.MetaBucket(ns.Stream)); err != nil {
			t.Fatal(err)
		}
		if got, err := eventlog.ReadShards(ctx, js, ns.Stream); err != nil || got.N() != 1 {
			t.Fatalf("ReadShards = %v, %v; want 1", got, err)
		}
		if _, err := openSharded(t, nc, ns, 3); !errors.Is(err, eventlog.ErrShardsMismatch) {
			t.Fatalf("3 shards on an unsharded log: %v, want ErrShardsMismatch", err)
		}
		if _, err := openSharded(t, nc, ns, 1); err != nil {
			t.Fatalf("the unsharded log's own start: %v", err)
		}
		if _, err := openSharded(t, nc, ns, 2); !errors.Is(err, eventlog.ErrShardsMismatch) {
			t.Fatalf("2 shards once 1 is recorded: %v, want ErrShardsMismatch", err)
		}
	})
}
