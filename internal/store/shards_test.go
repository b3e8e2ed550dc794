package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
)

// openSharded opens a Store with k shards (the shared harness's).
var openSharded = testnode.OpenSharded

// lineage schedules a root and a child of it with st, returning their ids.
func lineage(t *testing.T, st *store.Store, customer string) (rootID, childID string) {
	t.Helper()
	ctx := context.Background()
	rootID, childID = events.NewID(), events.NewID()
	for _, c := range []aggregate.Schedule{
		{TaskID: rootID, CustomerID: customer, Spec: events.TaskSpec{RootID: rootID, Queue: "q", TimeoutSeconds: 60}},
		{TaskID: childID, CustomerID: customer, Spec: events.TaskSpec{RootID: rootID, ParentID: rootID, Queue: "q", TimeoutSeconds: 60}},
	} {
		if _, _, err := st.Execute(ctx, c.TaskID, "", c); err != nil {
			t.Fatal(err)
		}
	}
	return rootID, childID
}

func TestShardedLogRoutesLineagesKeysAndSchedules(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	ctx := context.Background()
	ns := testnats.NewNamespace(t)
	st, err := openSharded(t, nc, ns, 3)
	if err != nil {
		t.Fatal(err)
	}
	shards := st.Shards()
	// A second process: no cache, no projections to locate a task.
	other, err := openSharded(t, nc, ns, 3)
	if err != nil {
		t.Fatal(err)
	}
	perShard := map[int]int{}
	const lineages = 45
	for n := range lineages {
		customer := fmt.Sprintf("c%d", n%4)
		rootID, childID := lineage(t, st, customer)
		want := shards.Of(customer, rootID)
		perShard[want]++
		for _, id := range []string{rootID, childID} {
			evs, err := other.History(ctx, id)
			if err != nil || len(evs) != 1 {
				t.Fatalf("history of %s: %d events, %v", id, len(evs), err)
			}
			if got, _ := shards.Split(evs[0].Seq); got != want {
				t.Fatalf("task %s of root %s is in shard %d, want %d (the root's)", id, rootID, got, want)
			}
			if ev, err := other.Event(ctx, evs[0].Seq); err != nil || ev.ID != evs[0].ID {
				t.Fatalf("Event(%d) = %s, %v; want %s", evs[0].Seq, ev.ID, err, evs[0].ID)
			}
		}
		got, err := st.Log().LineageOf(ctx, childID)
		if err != nil || len(got) != 2 || got[0].TaskID != rootID || got[1].TaskID != childID {
			t.Fatalf("lineage of %s: %v, %v", childID, got, err)
		}
	}
	last, err := st.LastPositions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, seq := shards.Split(last[i]); perShard[i] == 0 || seq != uint64(2*perShard[i]) {
			t.Fatalf("shard %d holds %d events, want %d (two a lineage): %v", i, seq, 2*perShard[i], perShard)
		}
	}

	k, _, err := st.ExecuteKey(ctx, aggregate.AcquireSlot{CustomerID: "c1", Key: "k", TaskID: "t1", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := shards.Split(k.LastSeq); got != shards.Of("c1", k.KeyID) {
		t.Fatalf("key %s in shard %d, want %d", k.KeyID, got, shards.Of("c1", k.KeyID))
	}
	if k2, err := other.LoadKey(ctx, "c1", "k"); err != nil || k2.LastSeq != k.LastSeq {
		t.Fatalf("the other process's key: %+v, %v", k2, err)
	}

	var read int
	if err := st.Log().Events(ctx, eventlog.ReadOptions{}, func(events.Event) error { read++; return nil }); err != nil || read != 2*lineages+1 {
		t.Fatalf("the whole log read %d events, %v; want %d", read, err, 2*lineages+1)
	}
}

func TestShardedRacingClaimsOneWinner(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t)
	ns := testnats.NewNamespace(t)
	first, err := openSharded(t, nc, ns, 3)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 6 {
		id, token := released(t, first)
		const racers = 8
		var wins atomic.Int32
		var g errgroup.Group
		for i := range racers {
			g.Go(func() error {
				st, err := store.Open(ctx, nc, store.Config{Stream: ns.Stream, Subjects: ns.Subjects, Shards: 3})
				if err != nil {
					return err
				}
				defer st.Close()
				_, _, err = st.Execute(ctx, id, "", aggregate.Claim{DeliveryID: token, ExecutorID: fmt.Sprintf("w%d", i)})
				switch {
				case err == nil:
					wins.Add(1)
				case !errors.Is(err, aggregate.ErrNotClaimable):
					return err
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		if wins.Load() != 1 {
			t.Fatalf("%d racers won task %s, want 1", wins.Load(), id)
		}
		if n := countTypes(t, first, id, events.TypeClaimed); n != 1 {
			t.Fatalf("log has %d Claimed events, want 1", n)
		}
	}
}
