package archive

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// CheckLive returns nil when the live streams of m's parts on log still
// exist, are sealed and hold exactly what m describes: the same first and
// last sequences, count (no hole) and chain head at the last event; and,
// for a log with epochs, when m's parts are all those of the live epoch
// m names, so that removing that epoch removes nothing m lacks. An
// operator proves so that an archive, verified, is complete before the
// streams are removed. It reads each stream's info and one message a
// part. Errors wrap ErrLiveMismatch or ErrNotSealed, or are the reads'.
func CheckLive(ctx context.Context, log eventlog.Log, m Manifest) error {
	log = log.WithDefaults()
	if m.Stream != log.Stream || m.Subjects != log.Subjects.Root || m.Layout() != (events.Shards{K: max(log.Shards.K, 1), Slots: log.Shards.Slots}) {
		return fmt.Errorf("%w: the archive is of stream %s on %s with %+v, the log is %s on %s with %+v", ErrLiveMismatch,
			m.Stream, m.Subjects, m.Layout(), log.Stream, log.Subjects.Root, log.Shards)
	}
	if err := wholeEpoch(ctx, log, m); err != nil {
		return err
	}
	for _, p := range m.Parts {
		s, err := log.JS.Stream(ctx, p.Stream)
		if err != nil {
			return fmt.Errorf("archive: part %d: stream %s: %w", p.Part, p.Stream, err)
		}
		if err := checkSealedPart(ctx, log, s.CachedInfo(), p); err != nil {
			return err
		}
	}
	return nil
}

// checkSealedPart returns nil when the stream whose info is info is
// sealed and holds exactly what p describes, its chain head included.
func checkSealedPart(ctx context.Context, log eventlog.Log, info *jetstream.StreamInfo, p Part) error {
	if !info.Config.Sealed {
		return fmt.Errorf("%w: part %d: stream %s", ErrNotSealed, p.Part, p.Stream)
	}
	if st := info.State; !holds(info, p) {
		return fmt.Errorf("%w: part %d: stream %s holds %d messages, sequences %d to %d (%d deleted); the archive %d, %d to %d",
			ErrLiveMismatch, p.Part, p.Stream, st.Msgs, st.FirstSeq, st.LastSeq, st.NumDeleted, p.Count, p.FirstSeq, p.LastSeq)
	}
	if p.Count == 0 {
		return nil
	}
	head, err := log.HeadAt(ctx, log.Shards.Position(p.Part, p.LastSeq))
	if err != nil {
		return fmt.Errorf("archive: part %d: %w", p.Part, err)
	}
	return sameHead(p, head)
}

// sameHead returns nil when head, the live log's chain head at p's last
// event, is the one p recorded.
func sameHead(p Part, head eventlog.Head) error {
	if p.Head == nil || head != *p.Head {
		return fmt.Errorf("%w: part %d: the live chain head at position %d is not the archive's", ErrLiveMismatch, p.Part, head.Pos)
	}
	return nil
}

// CheckRemoval is CheckLive for an epoch whose removal stopped half way
// (eventlog.RemoveEpoch recorded slot's next sequences and chain heads,
// and may have deleted some of its streams): m must hold exactly the
// slot's parts, each ending just before its recorded next sequence; a
// part whose stream is still there must match it as CheckLive checks;
// a part whose stream is gone (or created again, empty) must end in the
// chain head the removal recorded for it. An empty part matches only a
// stream that never held an event. A removal recorded without heads (by
// an older taskledger) cannot vouch for a gone stream's events: that is
// an error, and a running node finishes the removal by itself. Errors
// wrap ErrLiveMismatch or ErrNotSealed, or are the reads'.
func CheckRemoval(ctx context.Context, log eventlog.Log, m Manifest, slot eventlog.Slot, parts []int) error {
	log = log.WithDefaults()
	if m.Stream != log.Stream || m.Subjects != log.Subjects.Root || m.Layout() != (events.Shards{K: max(log.Shards.K, 1), Slots: log.Shards.Slots}) {
		return fmt.Errorf("%w: the archive is of stream %s on %s with %+v, the log is %s on %s with %+v", ErrLiveMismatch,
			m.Stream, m.Subjects, m.Layout(), log.Stream, log.Subjects.Root, log.Shards)
	}
	next := slot.NextSeqs
	if len(m.Parts) != len(parts) || len(next) != len(parts) {
		return fmt.Errorf("%w: the archive holds %d parts, the epoch %d", ErrLiveMismatch, len(m.Parts), len(parts))
	}
	for i, p := range m.Parts {
		switch {
		case p.Part != parts[i]:
			return fmt.Errorf("%w: the archive holds part %d, the epoch part %d", ErrLiveMismatch, p.Part, parts[i])
		case p.Count > 0 && p.LastSeq+1 != next[i], p.Count == 0 && next[i] > 1:
			return fmt.Errorf("%w: the archive's part %d ends at sequence %d, the removal in progress recorded %d as the next: not this removal's archive (a running node finishes a removal by itself)",
				ErrLiveMismatch, p.Part, p.LastSeq, next[i])
		}
		s, err := log.JS.Stream(ctx, p.Stream)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("archive: part %d: stream %s: %w", p.Part, p.Stream, err)
		}
		if err == nil && s.CachedInfo().Config.Sealed {
			if err := checkSealedPart(ctx, log, s.CachedInfo(), p); err != nil {
				return err
			}
			continue
		}
		// The removal deleted this stream (and may have created it
		// again, empty, from next[i]): only its recorded head is left.
		if err == nil {
			if st := s.CachedInfo().State; st.Msgs != 0 || max(s.CachedInfo().Config.FirstSeq, 1) != next[i] {
				return fmt.Errorf("%w: part %d: stream %s is not sealed, and not the empty one the removal creates from sequence %d", ErrLiveMismatch, p.Part, p.Stream, next[i])
			}
		}
		if p.Count == 0 {
			continue
		}
		if len(slot.Heads) != len(parts) {
			return fmt.Errorf("%w: part %d: stream %s is removed and the removal in progress recorded no chain heads, so its events cannot be checked against the archive (a running node finishes a removal by itself)",
				ErrLiveMismatch, p.Part, p.Stream)
		}
		if err := sameHead(p, slot.Heads[i]); err != nil {
			return err
		}
	}
	return nil
}

// holds reports whether the stream whose info is info holds exactly the
// messages p describes, with no hole. An empty part's stream must never
// have stored a message: its last sequence is the one before its first,
// 0, or past 0 for a stream RemoveEpoch created again after its slot's
// earlier epoch.
func holds(info *jetstream.StreamInfo, p Part) bool {
	st := info.State
	if p.Count == 0 {
		return st.Msgs == 0 && st.LastSeq+1 == max(info.Config.FirstSeq, 1)
	}
	return st.Msgs == p.Count && st.FirstSeq == p.FirstSeq && st.LastSeq == p.LastSeq && st.NumDeleted == 0
}

// wholeEpoch returns nil when log has no epochs, or when m's parts are
// exactly those of the slot holding the live epoch m names.
func wholeEpoch(ctx context.Context, log eventlog.Log, m Manifest) error {
	if log.Shards.Slots == 0 {
		return nil
	}
	e, ok, err := eventlog.ReadEpochs(ctx, log.JS, log.Stream)
	if err != nil {
		return err
	}
	n, perr := strconv.ParseInt(m.Epoch, 10, 64)
	slot, live := e.SlotOfEpoch(n)
	if !ok || perr != nil || !live {
		return fmt.Errorf("%w: the archive is of epoch %q, which the log holds no live epoch of", ErrLiveMismatch, m.Epoch)
	}
	parts := make([]int, len(m.Parts))
	for i, p := range m.Parts {
		parts[i] = p.Part
	}
	if want := log.Shards.SlotParts(slot); !slices.Equal(parts, want) {
		return fmt.Errorf("%w: the archive holds parts %v of epoch %d, whose parts are %v", ErrLiveMismatch, parts, n, want)
	}
	return nil
}
