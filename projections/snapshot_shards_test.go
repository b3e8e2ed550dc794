package projections

import (
	"errors"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// A snapshot stores the applied vector; one shard keeps the format of the
// unsharded log (a single applied sequence).
func TestSnapshotStoresTheAppliedVector(t *testing.T) {
	t.Parallel()
	var b body
	one, err := encodeSnapshot([]uint64{42}, b)
	if err != nil {
		t.Fatal(err)
	}
	var stored snapshot
	if err := msgpack.Unmarshal(one, &stored); err != nil || stored.Applied != 42 || stored.Positions != nil {
		t.Fatalf("one shard stored as %+v, %v; want applied 42 and no positions", stored, err)
	}
	three, err := encodeSnapshot([]uint64{12, 7, 0}, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		data []byte
		last []uint64
		want []uint64
		err  error
	}{
		{"OneShard", one, []uint64{42}, []uint64{42}, nil},
		{"OneShardAhead", one, []uint64{41}, nil, ErrSnapshotAhead},
		{"ThreeShards", three, []uint64{12, 10, 5}, []uint64{12, 7, 0}, nil},
		{"ThreeShardsOneAhead", three, []uint64{12, 4, 5}, nil, ErrSnapshotAhead},
		{"ShardsDiffer", three, []uint64{42}, nil, ErrSnapshotFormat},
		{"UnshardedOnThree", one, []uint64{42, 0, 0}, nil, ErrSnapshotFormat},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, _, err := decodeSnapshot(c.data, c.last)
			if !errors.Is(err, c.err) || !slices.Equal(got, c.want) {
				t.Fatalf("decode = %v, %v; want %v, %v", got, err, c.want, c.err)
			}
		})
	}
}
