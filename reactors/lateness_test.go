package reactors_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/reactors"
)

// TestLatenessWindow: the window reads nearest-rank percentiles per
// timer queue and over all of them, keeps only the last LatenessSamples
// of a queue, and forgets what is older than LatenessAge.
func TestLatenessWindow(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	w := reactors.NewLatenessWindow(func() time.Time { return time.Unix(0, now.Load()) })
	if all, _ := w.Summary(); all != (reactors.Lateness{}) {
		t.Fatalf("an empty window: %+v", all)
	}
	for i := 1; i <= 100; i++ {
		w.Observe(projections.Release, time.Duration(i)*time.Millisecond, nil)
	}
	w.Observe(projections.Expire, -time.Second, nil) // a clock step: 0
	all, by := w.Summary()
	if want := (reactors.Lateness{Samples: 100, P50: 50 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}); by[projections.Release] != want {
		t.Errorf("release: %+v, want %+v", by[projections.Release], want)
	}
	if want := (reactors.Lateness{Samples: 1}); by[projections.Expire] != want {
		t.Errorf("expire: %+v, want %+v", by[projections.Expire], want)
	}
	if all.Samples != 101 || all.Max != 100*time.Millisecond || all.P50 != 50*time.Millisecond {
		t.Errorf("all: %+v", all)
	}

	for range reactors.LatenessSamples {
		w.Observe(projections.Release, time.Second, nil)
	}
	if _, by = w.Summary(); by[projections.Release] != (reactors.Lateness{Samples: reactors.LatenessSamples, P50: time.Second, P99: time.Second, Max: time.Second}) {
		t.Errorf("after %d more: %+v", reactors.LatenessSamples, by[projections.Release])
	}

	now.Add(int64(reactors.LatenessAge + time.Second))
	if all, _ = w.Summary(); all.Samples != 0 {
		t.Errorf("%v later: %+v", reactors.LatenessAge, all)
	}
}
