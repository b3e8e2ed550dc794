package projections

import (
	"cmp"
	"slices"

	"github.com/taskledger/taskledger/events"
)

// maxQuarantined is how many quarantined messages the views list (the
// lowest positions); past it they are only counted.
const maxQuarantined = 1000

// maxQuarantineReason bounds the reason kept for one quarantined message.
const maxQuarantineReason = 256

// Quarantined is a message of the log that does not decode, which the
// fold skipped: its position and why.
type Quarantined struct {
	Pos    events.Position `msgpack:"pos"`
	Reason string          `msgpack:"reason"`
}

// quarantine is the views' record of the messages the fold skipped
// because they do not decode: counted, and the first maxQuarantined by
// position listed. It is part of the snapshot body, so a restart from a
// snapshot still reports what was met before it.
type quarantine struct {
	list  []Quarantined
	count uint64
}

// add records the message at pos, skipped for bad; one recorded already
// (a snapshot's, met again) changes nothing.
func (q *quarantine) add(pos events.Position, bad error) {
	i, found := slices.BinarySearchFunc(q.list, pos, func(x Quarantined, p events.Position) int { return cmp.Compare(x.Pos, p) })
	if found {
		return
	}
	q.count++
	if i >= maxQuarantined {
		return
	}
	reason := bad.Error()
	if len(reason) > maxQuarantineReason {
		reason = reason[:maxQuarantineReason]
	}
	q.list = slices.Insert(q.list, i, Quarantined{Pos: pos, Reason: reason})
	if len(q.list) > maxQuarantined {
		q.list = q.list[:maxQuarantined]
	}
}

// Quarantined returns how many messages of the log the projections
// skipped because they do not decode, and up to limit of them, by
// position. The count covers what the views were built from (a snapshot's
// included); taskledger replay quarantine reads the whole log. It is safe
// for concurrent use.
func (vw *Views) Quarantined(limit int) (uint64, []Quarantined) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	q := vw.v.quarantine
	return q.count, slices.Clone(q.list[:min(limit, len(q.list))])
}
