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
			if pos := s.Position(0, seq); pos != Position(seq) {
				t.Fatalf("Position(0, %d) = %d", seq, pos)
			}
			if shard, got := s.Split(Position(seq)); shard != 0 || got != seq {
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
		prev := Position(0)
		for seq := uint64(1); seq < 50; seq++ {
			pos := s.Position(i, seq)
			if shard, got := s.Split(pos); shard != i || got != seq {
				t.Fatalf("Split(Position(%d, %d)) = %d, %d", i, seq, shard, got)
			}
			if pos.Part(s) != i || pos.Seq(s) != seq {
				t.Fatalf("Position(%d, %d): Part %d, Seq %d", i, seq, pos.Part(s), pos.Seq(s))
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

func TestShardsEpochSlots(t *testing.T) {
	t.Parallel()
	s := Shards{K: 3, Slots: 2}
	if s.N() != 9 {
		t.Fatalf("N = %d, want 3 shards and 2 slots of 3", s.N())
	}
	names := map[string]bool{}
	for part := range s.N() {
		slot, ok := s.SlotOf(part)
		if ok != (part >= 3) || ok && (slot != part/3-1 || s.Part(slot, part%3) != part) {
			t.Fatalf("SlotOf(%d) = %d, %v", part, slot, ok)
		}
		names[s.Stream("TASKLEDGER", part)] = true
		if shard, seq := s.Split(s.Position(part, 5)); shard != part || seq != 5 {
			t.Fatalf("Split(Position(%d, 5)) = %d, %d", part, shard, seq)
		}
	}
	if len(names) != s.N() || !names["TASKLEDGER_2"] || !names["TASKLEDGER_s1_2"] {
		t.Fatalf("stream names %v", names)
	}
	if got := s.SlotParts(1); len(got) != 3 || got[0] != 6 || got[2] != 8 {
		t.Fatalf("SlotParts(1) = %v", got)
	}
	if got := s.Of("cust", "root"); got != (Shards{K: 3}).Of("cust", "root") {
		t.Fatalf("Of with slots = %d, want the shard without", got)
	}
	one := Shards{K: 1, Slots: 2}
	if one.Stream("TASKLEDGER", 0) != "TASKLEDGER_0" || one.Stream("TASKLEDGER", 2) != "TASKLEDGER_s1_0" || one.Subjects(DefaultSubjects, 2).Root != "tl.2" {
		t.Fatalf("one shard with slots: %s %s %v", one.Stream("TASKLEDGER", 0), one.Stream("TASKLEDGER", 2), one.Subjects(DefaultSubjects, 2))
	}
}
