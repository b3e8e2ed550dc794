package projections_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/projections"
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
	if !errors.Is(err, eventlog.ErrShardsMismatch) {
		t.Fatalf("a start with one shard on a log of three: %v, want ErrShardsMismatch", err)
	}
}

// Tasks of many lineages share a concurrency key, whose events live in
// the key's shard while the tasks' live in theirs: the live projections
// and a rebuild that interleaves the shards otherwise agree, and every
// slot is given back.
func TestShardedConcurrencyRebuildEqualsLive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ln := startNode(t, -1, 3)
	live, st, svc, op := ln.node.Engine, ln.node.Store, ln.node.Service, scheduler.Operator
	const tasks = 24
	shardsUsed := map[int]bool{}
	for i := range tasks {
		task, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{
			CustomerID: "acme", Queue: "conc", Concurrency: &events.Concurrency{Key: "deploy", Limit: 2},
			Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "work"}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		shard, _ := st.Shards().Split(task.FirstSeq)
		shardsUsed[shard] = true
		if i%6 == 5 {
			if _, err := svc.Cancel(ctx, op, task.TaskID, "not needed"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(shardsUsed) < 2 {
		t.Fatalf("the tasks used shards %v only", shardsUsed)
	}
	var done atomic.Int64
	claims := int64(tasks - tasks/6)
	var g errgroup.Group
	deadline := time.Now().Add(60 * time.Second)
	for w := range 3 {
		g.Go(func() error {
			for done.Load() < claims {
				if time.Now().After(deadline) {
					return fmt.Errorf("%d of %d tasks run after 60s", done.Load(), claims)
				}
				task, ok, err := svc.ClaimNext(ctx, op, "conc", fmt.Sprintf("w%d", w), 200*time.Millisecond)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				if _, err := svc.RecordResult(ctx, op, task.TaskID, task.Claim.DeliveryID, events.Result{Success: true, Summary: "ok"}); err != nil {
					return err
				}
				done.Add(1)
			}
			return nil
		})
	}
	// Live rebuilds while the tasks run, swapped in under the writes: the
	// projections must still end equal to an offline rebuild.
	rebuilds := 0
	g.Go(func() error {
		for ; done.Load() < claims; rebuilds++ {
			if err := live.Rebuild(ctx, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if rebuilds == 0 {
		t.Fatal("no rebuild ran while the tasks ran")
	}
	eventually(t, "every slot given back", func() bool {
		k, holders, waiters := live.ConcurrencyKey("acme", "deploy", time.Now())
		return quiescent(t, live, st) && k.Exists() && len(holders) == 0 && len(waiters) == 0 && live.TimerLen(projections.Free) == 0
	})
	ln.stop()
	sameProjection(t, live, rebuildShards(t, ln.ns, st.Shards(), logSeqs(t, st), -1))
}
