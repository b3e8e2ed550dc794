package archive

import (
	"context"
	"fmt"

	"github.com/taskledger/taskledger/events"
)

// Verify reads the whole archive at dir and returns its manifest when it
// is whole: every part file has its manifest's SHA-256, well-framed
// records with contiguous sequences from the first to the last, its
// count and its chain; every event decodes; each task's, key's and
// schedule's hash chain (an event's prev, as replay verify checks it)
// holds from one of its archived events to the next, and an event that
// is the first of its task names no previous one; and the last event of
// each part is the manifest's chain head of the live log. Otherwise it
// returns an error wrapping ErrDamaged that names the part and the
// sequence of the first problem. It holds one record and a hash a
// subject of the part being read.
func Verify(dir string) (Manifest, error) {
	a, err := openManifest(dir) // the records, read, tell more than the sizes

	if err != nil {
		return Manifest{}, err
	}
	for _, p := range a.Manifest.Parts {
		if err := a.verifyPart(p); err != nil {
			return Manifest{}, err
		}
	}
	return a.Manifest, nil
}

func (a *Archive) verifyPart(p Part) error {
	// Each subject (a task's, a key's, a schedule's) lives in one part.
	type link struct {
		seq  uint64
		hash events.Hash
	}
	prev := map[string]link{}
	var last events.Hash
	err := a.scanPart(context.Background(), p, func(p Part, rec record) error {
		pos := a.shards.Position(p.Part, rec.seq)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: part %d (%s) sequence %d (position %d): %s", ErrDamaged, p.Part, p.File, rec.seq, pos, fmt.Sprintf(format, args...))
		}
		ev, err := events.DecodeHashed(rec.data, pos)
		if err != nil {
			return bad("the event does not decode: %v", err)
		}
		// A v1 event predates the chain and starts it (replay.Verifier).
		l, seen := prev[rec.subject]
		switch {
		case ev.Version < 2:
		case seen && ev.Prev != l.hash:
			return bad("event %d of %s names previous hash %x, its previous event (sequence %d) hashes to %x: one of them was changed",
				ev.Number, rec.subject, ev.Prev[:6], l.seq, l.hash[:6])
		case !seen && ev.Number == 1 && !ev.Prev.IsZero():
			return bad("the first event of %s names a previous hash", rec.subject)
		}
		prev[rec.subject], last = link{rec.seq, ev.Hash}, ev.Hash
		return nil
	})
	if err != nil {
		return err
	}
	if p.Count > 0 && p.Head.Hash != last {
		return fmt.Errorf("%w: part %d (%s) sequence %d: the last event is not the live log's chain head the manifest names", ErrDamaged, p.Part, p.File, p.LastSeq)
	}
	return nil
}
