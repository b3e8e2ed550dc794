package archive

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/store"
)

// CheckLive returns nil when the live streams of m's parts on log still
// exist, are sealed and hold exactly what m describes: the same first and
// last sequences, count (no hole) and chain head at the last event. An
// operator proves so that an archive, verified, is complete before the
// streams are removed. It reads each stream's info and one message a
// part. Errors wrap ErrLiveMismatch or ErrNotSealed, or are the reads'.
func CheckLive(ctx context.Context, log store.Log, m Manifest) error {
	log = log.WithDefaults()
	if m.Stream != log.Stream || m.Subjects != log.Subjects.Root || m.Layout() != (events.Shards{K: max(log.Shards.K, 1), Slots: log.Shards.Slots}) {
		return fmt.Errorf("%w: the archive is of stream %s on %s with %+v, the log is %s on %s with %+v", ErrLiveMismatch,
			m.Stream, m.Subjects, m.Layout(), log.Stream, log.Subjects.Root, log.Shards)
	}
	for _, p := range m.Parts {
		s, err := log.JS.Stream(ctx, p.Stream)
		if err != nil {
			return fmt.Errorf("archive: part %d: stream %s: %w", p.Part, p.Stream, err)
		}
		info := s.CachedInfo()
		if !info.Config.Sealed {
			return fmt.Errorf("%w: part %d: stream %s", ErrNotSealed, p.Part, p.Stream)
		}
		if st := info.State; !holds(info, p) {
			return fmt.Errorf("%w: part %d: stream %s holds %d messages, sequences %d to %d (%d deleted); the archive %d, %d to %d",
				ErrLiveMismatch, p.Part, p.Stream, st.Msgs, st.FirstSeq, st.LastSeq, st.NumDeleted, p.Count, p.FirstSeq, p.LastSeq)
		}
		if p.Count == 0 {
			continue
		}
		head, err := log.HeadAt(ctx, log.Shards.Position(p.Part, p.LastSeq))
		if err != nil {
			return fmt.Errorf("archive: part %d: %w", p.Part, err)
		}
		if p.Head == nil || head != *p.Head {
			return fmt.Errorf("%w: part %d: the live chain head at position %d is not the archive's", ErrLiveMismatch, p.Part, head.Seq)
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
