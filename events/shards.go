package events

import (
	"hash/fnv"
	"strconv"
)

// Shards routes the log over its streams, its parts (docs/DESIGN.md,
// "Sharded log" and "Epochs"). K streams, the shards, hold the log's
// concurrency keys and schedules, and, without epochs (Slots = 0), its
// tasks too. With epochs, the tasks live in Slots more sets of K streams,
// one epoch in each at a time: part K×(1+slot)+i is shard i of that slot.
// K = 1 without epochs is the unsharded log: one stream named by the base
// name, on the base subjects, and positions equal to stream sequences.
// The zero value is K = 1 without epochs. A Shards value is immutable and
// safe for concurrent use.
type Shards struct {
	K     int
	Slots int
}

// N returns the number of parts: K × (1 + Slots), at least 1.
func (s Shards) N() int { return s.shards() * (1 + s.Slots) }

// shards returns K, at least 1.
func (s Shards) shards() int { return max(s.K, 1) }

// Part returns the part of shard i of epoch slot slot.
func (s Shards) Part(slot, i int) int { return s.shards()*(1+slot) + i }

// SlotOf returns the epoch slot part is in; false for a part of the
// shards that hold keys and schedules (and, without epochs, tasks).
func (s Shards) SlotOf(part int) (slot int, ok bool) {
	return part/s.shards() - 1, part >= s.shards()
}

// SlotParts returns the parts of epoch slot slot.
func (s Shards) SlotParts(slot int) []int {
	parts := make([]int, s.shards())
	for i := range parts {
		parts[i] = s.Part(slot, i)
	}
	return parts
}

// Stream returns the name of part i's stream: base itself for the
// unsharded log (one part), else base + "_" + i for shard i and base +
// "_s" + slot + "_" + shard for a part of an epoch slot.
func (s Shards) Stream(base string, i int) string {
	if slot, ok := s.SlotOf(i); ok {
		return base + "_s" + strconv.Itoa(slot) + "_" + strconv.Itoa(i%s.shards())
	}
	if s.N() == 1 {
		return base
	}
	return base + "_" + strconv.Itoa(i)
}

// Subjects returns the subjects of part i's stream: subj itself for the
// unsharded log, else subj with the root <root>.<i> (two streams may
// not share a subject).
func (s Shards) Subjects(subj Subjects, i int) Subjects {
	if s.N() == 1 {
		return subj
	}
	return Subjects{Root: subj.Root + "." + strconv.Itoa(i)}
}

// Of returns the shard of the events whose shard id is id and whose
// customer is customerID: FNV-1a of customerID "/" id, mod K. With
// epochs a task's part is that shard of its lineage's epoch slot. A task's
// shard id is its root's id, so a lineage shares a shard; a concurrency
// key's is its key id, a schedule's its schedule id.
func (s Shards) Of(customerID, id string) int {
	if s.shards() == 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(customerID))
	h.Write([]byte{'/'})
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(s.shards()))
}

// Position is a place in the log: stream sequence seq of part i is
// position seq × N + i, for the N parts of a Shards (seq itself when
// N = 1). Positions of one part grow with its sequence; positions of
// different parts interleave but say nothing about which was stored
// first. Position 0 is "nothing yet" in any part. A Position does not
// know N: its part and sequence are read with the Shards that made it.
type Position uint64

// Position returns the log position of stream sequence seq of part i.
// Sequence 0, "nothing yet", is position 0 whatever the part.
func (s Shards) Position(i int, seq uint64) Position {
	if seq == 0 {
		return 0
	}
	return Position(seq*uint64(s.N()) + uint64(i))
}

// Split returns the part and the stream sequence of position pos, the
// inverse of Position. Position 0 is sequence 0 of part 0.
func (s Shards) Split(pos Position) (part int, seq uint64) {
	return pos.Part(s), pos.Seq(s)
}

// Part returns the part (the stream) of the log position p of s.
func (p Position) Part(s Shards) int { return int(uint64(p) % uint64(s.N())) }

// Seq returns the stream sequence, in its part's stream, of the log
// position p of s.
func (p Position) Seq(s Shards) uint64 { return uint64(p) / uint64(s.N()) }

// SumSeqs returns the sum of the stream sequences of positions: with one
// shard the sequence itself, with K a count of events that grows by one
// with each, whatever its shard.
func (s Shards) SumSeqs(positions []Position) uint64 {
	var n uint64
	for _, pos := range positions {
		n += pos.Seq(s)
	}
	return n
}

// OfEvent returns the shard of ev: a schedule's or a concurrency key's
// event is routed by its TaskID (the schedule's or the key's id), a
// task's by rootID, the root of its lineage (with epochs, that shard of
// its epoch slot holds it: see Part).
func (s Shards) OfEvent(ev Event, rootID string) int {
	if IsSchedule(ev.Type()) || KeyEvent(ev.Type()) {
		return s.Of(ev.CustomerID, ev.TaskID)
	}
	return s.Of(ev.CustomerID, rootID)
}
