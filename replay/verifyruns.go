package replay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"slices"

	"github.com/taskledger/taskledger/events"
)

// RunReader reads the stored revisions of a task's Run (the scheduler's
// runs bucket, internal/store.Runs): Revisions calls fn with revisions
// after+1 to upto in order, each as its canonical bytes, and stops at
// fn's first error, which it returns, or at the first revision it cannot
// read, with that error.
type RunReader interface {
	Revisions(ctx context.Context, taskID string, after, upto uint64, fn func(revision uint64, doc []byte) error) error
}

// VerifyRuns checks every Run revision the events added so far record
// (RunSaved) against the bytes r stores: each must hash (SHA-256) to its
// digest. It reports RunMismatch for a
// revision whose bytes differ and RunUnreadable for one r cannot read
// (and stops with that task: later revisions build on it). Call it after
// the last Add. It returns an error only when ctx ends.
func (v *Verifier) VerifyRuns(ctx context.Context, r RunReader) error {
	for _, id := range slices.Sorted(maps.Keys(v.runs)) {
		rr := v.runs[id]
		last := rr.first + uint64(len(rr.digests)) - 1
		next := rr.first
		err := r.Revisions(ctx, id, rr.first-1, last, func(revision uint64, doc []byte) error {
			i := revision - rr.first
			if revision != next || i >= uint64(len(rr.digests)) {
				return errors.New("revisions out of order")
			}
			next++
			sum := sha256.Sum256(doc)
			if got := hex.EncodeToString(sum[:]); got != rr.digests[i] {
				v.fail(rr.seqs[i], id, RunMismatch, "run revision %d hashes to %.12s (%d bytes), its RunSaved records %.12s", revision, got, len(doc), rr.digests[i])
			}
			return nil
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && next <= last {
			v.fail(rr.seqs[next-rr.first], id, RunUnreadable, "run revision %d (of %d): %v", next, last, err)
		}
	}
	return nil
}

// addRun records the Run revision a RunSaved at seq made.
func (v *Verifier) addRun(seq events.Position, taskID string, p events.RunSaved) {
	rr := v.runs[taskID]
	if rr == nil {
		rr = &runRevisions{first: p.Revision}
		v.runs[taskID] = rr
	}
	rr.seqs = append(rr.seqs, seq)
	rr.digests = append(rr.digests, p.Digest)
}
