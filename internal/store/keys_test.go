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
	"github.com/taskledger/taskledger/internal/testnats"
)

// TestRacingSlotsNeverExceedTheLimit races 24 acquisitions of a key with
// limit 3 through two stores (two processes' caches) on one stream: three
// win, the rest are ErrKeyFull, and the key's subject holds exactly three
// SlotAcquired. Releasing one makes room for exactly one more.
func TestRacingSlotsNeverExceedTheLimit(t *testing.T) {
	t.Parallel()
	a := setup(t, testnats.Conn(t))
	b := another(t, testnats.Conn(t), a)
	ctx := context.Background()
	acquire := func(i int) aggregate.AcquireSlot {
		return aggregate.AcquireSlot{CustomerID: "cust", Key: "repo:x", TaskID: fmt.Sprintf("t%d", i), Limit: 3}
	}
	var won, full atomic.Int32
	var g errgroup.Group
	for i := range 24 {
		st := a
		if i%2 == 1 {
			st = b
		}
		g.Go(func() error {
			_, evs, err := st.ExecuteKey(ctx, acquire(i))
			switch {
			case errors.Is(err, aggregate.ErrKeyFull):
				full.Add(1)
			case err != nil:
				return err
			case len(evs) == 1:
				won.Add(1)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if won.Load() != 3 || full.Load() != 21 {
		t.Fatalf("%d acquired, %d full; want 3 and 21", won.Load(), full.Load())
	}
	evs, err := b.KeyHistory(ctx, "cust", "repo:x")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("%d key events, want 3", len(evs))
	}
	holder := evs[0].Data.(events.SlotAcquired).TaskID
	if _, evs, err := a.ExecuteKey(ctx, aggregate.ReleaseSlot{CustomerID: "cust", Key: "repo:x", TaskID: holder}); err != nil || len(evs) != 1 {
		t.Fatalf("release: %v %v", evs, err)
	}
	// b's cached state is behind: it catches up before deciding.
	k, evs, err := b.ExecuteKey(ctx, acquire(100))
	if err != nil || len(evs) != 1 || len(k.Holders) != 3 {
		t.Fatalf("after a release: %v %v %+v", evs, err, k)
	}
	if _, _, err := a.ExecuteKey(ctx, acquire(101)); !errors.Is(err, aggregate.ErrKeyFull) {
		t.Fatalf("a fourth holder: %v", err)
	}
}
