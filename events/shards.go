package events

import (
	"hash/fnv"
	"strconv"
)

// Shards routes the log over K streams (docs/DESIGN.md, "Sharded log").
// K = 1 is the unsharded log: one stream named by the base name, on the
// base subjects, and positions equal to stream sequences. The zero value
// is K = 1. A Shards value is immutable and safe for concurrent use.
type Shards struct{ K int }

// N returns K, at least 1.
func (s Shards) N() int { return max(s.K, 1) }

// Stream returns the name of shard i's stream: base itself when K = 1,
// else base + "_" + i.
func (s Shards) Stream(base string, i int) string {
	if s.N() == 1 {
		return base
	}
	return base + "_" + strconv.Itoa(i)
}

// Subjects returns the subjects of shard i's stream: subj itself when
// K = 1, else subj with the root <root>.<i> (two streams may not share
// a subject).
func (s Shards) Subjects(subj Subjects, i int) Subjects {
	if s.N() == 1 {
		return subj
	}
	return Subjects{Root: subj.Root + "." + strconv.Itoa(i)}
}

// Of returns the shard of the events whose shard id is id and whose
// customer is customerID: FNV-1a of customerID "/" id, mod K. A task's
// shard id is its root's id, so a lineage shares a shard; a concurrency
// key's is its key id, a schedule's its schedule id.
func (s Shards) Of(customerID, id string) int {
	if s.N() == 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(customerID))
	h.Write([]byte{'/'})
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(s.N()))
}

// Position returns the log position of stream sequence seq of shard i:
// seq × K + i (seq itself when K = 1). Sequence 0, "nothing yet", is
// position 0 whatever the shard.
func (s Shards) Position(i int, seq uint64) uint64 {
	if seq == 0 {
		return 0
	}
	return seq*uint64(s.N()) + uint64(i)
}

// Split returns the shard and the stream sequence of position pos, the
// inverse of Position. Position 0 is sequence 0 of shard 0.
func (s Shards) Split(pos uint64) (shard int, seq uint64) {
	n := uint64(s.N())
	return int(pos % n), pos / n
}

// SumSeqs returns the sum of the stream sequences of positions: with one
// shard the sequence itself, with K a count of events that grows by one
// with each, whatever its shard.
func (s Shards) SumSeqs(positions []uint64) uint64 {
	var n uint64
	for _, pos := range positions {
		_, seq := s.Split(pos)
		n += seq
	}
	return n
}

// OfEvent returns the shard of ev: a schedule's or a concurrency key's
// event is routed by its TaskID (the schedule's or the key's id), a
// task's by rootID, the root of its lineage.
func (s Shards) OfEvent(ev Event, rootID string) int {
	if IsSchedule(ev.Type()) || KeyEvent(ev.Type()) {
		return s.Of(ev.CustomerID, ev.TaskID)
	}
	return s.Of(ev.CustomerID, rootID)
}
