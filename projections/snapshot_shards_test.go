package projections

import (
	"errors"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/taskledger/taskledger/events"
)

// A snapshot stores the applied vector; one shard keeps the format of the
// unsharded log (a single applied sequence).
func TestSnapshotStoresTheAppliedVector(t *testing.T) {
	t.Parallel()
	var b body
	one, err := encodeSnapshot([]events.Position{42}, b)
	if err != nil {
		t.Fatal(err)
	}
	var stored snapshot
	if err := msgpack.Unmarshal(one, &stored); err != nil || stored.Applied != 42 || stored.Positions != nil {
		t.Fatalf("one shard stored as %+v, %v; want applied 42 and no positions", stored, err)
	}
	three, err := encodeSnapshot([]events.Position{12, 7, 0}, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		data []byte
		last []events.Position
		want []events.Position
		err  error
	}{
		{"OneShard", one, []events.Position{42}, []events.Position{42}, nil},
		{"OneShardAhead", one, []events.Position{41}, nil, ErrSnapshotAhead},
		{"ThreeShards", three, []events.Position{12, 10, 5}, []events.Position{12, 7, 0}, nil},
		{"ThreeShardsOneAhead", three, []events.Position{12, 4, 5}, nil, ErrSnapshotAhead},
		{"ShardsDiffer", three, []events.Position{42}, nil, ErrSnapshotFormat},
		{"UnshardedOnThree", one, []events.Position{42, 0, 0}, nil, ErrSnapshotFormat},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, _, err := decodeSnapshot(c.data, c.last)
			if !errors.Is(err, c.err) || !slices.Equal(got, c.want) {
				t.Fatalf("decode = %v, %v; want %v, %v", got, err, c.want, c.err)
			}
		})
	}
}
