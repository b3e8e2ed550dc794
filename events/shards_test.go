package events

import "testing"

func TestShardsOneIsTheUnshardedLog(t *testing.T) {
	t.Parallel()
	for _, s := range []Shards{{}, {K: 1}} {
		if got := s.Stream("TASKLEDGER", 0); got != "TASKLEDGER" {
			t.Fatalf("Stream = %q", got)
		}
		if got := s.Subjects(DefaultSubjects, 0); got != DefaultSubjects {
			t.Fatalf("Subjects = %v", got)
		}
		if got := s.Of("c1", "root"); got != 0 {
			t.Fatalf("Of = %d", got)
		}
		for _, seq := range []uint64{0, 1, 7, 1 << 40} {
			if pos := s.Position(0, seq); pos != seq {
				t.Fatalf("Position(0, %d) = %d", seq, pos)
			}
			if shard, got := s.Split(seq); shard != 0 || got != seq {
				t.Fatalf("Split(%d) = %d, %d", seq, shard, got)
			}
		}
	}
}

func TestShardsPositionsRoundTripAndKeepShardOrder(t *testing.T) {
	t.Parallel()
	s := Shards{K: 3}
	if got := s.Stream("TASKLEDGER", 2); got != "TASKLEDGER_2" {
		t.Fatalf("Stream = %q", got)
	}
	if got := s.Subjects(DefaultSubjects, 1).Event("c", "t"); got != "tl.1.evt.c.t" {
		t.Fatalf("subject = %q", got)
	}
	for i := range 3 {
		prev := uint64(0)
		for seq := uint64(1); seq < 50; seq++ {
			pos := s.Position(i, seq)
			if shard, got := s.Split(pos); shard != i || got != seq {
				t.Fatalf("Split(Position(%d, %d)) = %d, %d", i, seq, shard, got)
			}
			if pos <= prev {
				t.Fatalf("position %d of seq %d not above %d", pos, seq, prev)
			}
			prev = pos
		}
	}
}

func TestShardsOfSpreadsAndIsStable(t *testing.T) {
	t.Parallel()
	s := Shards{K: 3}
	seen := map[int]int{}
	for i := range 300 {
		id := "root-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		shard := s.Of("cust", id)
		if shard < 0 || shard >= 3 || shard != s.Of("cust", id) {
			t.Fatalf("Of(cust, %s) = %d", id, shard)
		}
		seen[shard]++
	}
	for i := range 3 {
		if seen[i] < 50 {
			t.Fatalf("shard %d got %d of 300 ids: %v", i, seen[i], seen)
		}
	}
}
