package eventlog

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// Log damage errors, returned (wrapped, with the sequences) by Log.Check.
var (
	// ErrEventsMissing: sequences inside the stream hold no message. The
	// event stream denies deletes, so a hole means the server dropped a
	// message it could not read back (a damaged block file) or someone
	// edited the files.
	ErrEventsMissing = errors.New("eventlog: events are missing from the log")
	// ErrLogTruncated: the log ends before the sequence of its saved
	// chain head, so events it once held are gone (a cut block file).
	ErrLogTruncated = errors.New("eventlog: the log ends before its saved chain head")
	// ErrHeadMismatch: the message at the saved head's sequence is not
	// the one that was there when the head was saved.
	ErrHeadMismatch = errors.New("eventlog: the log differs from its saved chain head")
	// ErrLogEmpty: a stream of the log holds no event, though its saved
	// chain head says it held some: it was deleted (and created again
	// empty) or purged. Check wraps it with ErrLogTruncated.
	ErrLogEmpty = errors.New("eventlog: the log holds no event where its saved chain head says it held some")
	// ErrStreamMissing: a stream of the log does not exist (CheckStreams).
	ErrStreamMissing = errors.New("eventlog: a stream of the log is missing")
)

// Head is a chain head: a position of the log and the SHA-256 of
// the message stored there. Saved from time to time (with every
// projection snapshot and at clean shutdown), it lets a later reader tell
// a log that lost its tail from one that simply ended: every task's
// events are chained by their hashes, but the last events of the stream
// have no successor to vouch for them.
type Head struct {
	Pos  events.Position // the head's log position
	Hash events.Hash
}

type wireHead struct {
	Seq    uint64 `json:"seq"`
	SHA256 string `json:"sha256"`
}

// MarshalJSON implements json.Marshaler: {"seq": N, "sha256": "hex"}.
func (h Head) MarshalJSON() ([]byte, error) {
	return json.Marshal(wireHead{Seq: uint64(h.Pos), SHA256: hex.EncodeToString(h.Hash[:])})
}

// UnmarshalJSON implements json.Unmarshaler.
func (h *Head) UnmarshalJSON(b []byte) error {
	var w wireHead
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	sum, err := hex.DecodeString(w.SHA256)
	if err != nil || len(sum) != len(h.Hash) {
		return fmt.Errorf("eventlog: chain head: bad sha256 %q", w.SHA256)
	}
	h.Pos = events.Position(w.Seq)
	copy(h.Hash[:], sum)
	return nil
}

// LastPositions returns the position of every shard's last stored event,
// by shard, 0 for an empty shard (for a stream created again after its
// epoch was removed, the position before its first sequence). It reads each message itself: after a
// block file lost its tail, a stream's state may still name a last
// sequence whose message is gone. That costs one read a shard; only when
// the message is missing does it ask for the last one on the stream's
// subjects (which walks the server's subject index).
func (l Log) LastPositions(ctx context.Context) ([]events.Position, error) {
	l = l.withDefaults()
	last := make([]events.Position, l.Shards.N())
	for i := range last {
		var err error
		if last[i], err = l.lastOf(ctx, i); err != nil {
			return nil, err
		}
	}
	return last, nil
}

// FirstSeq returns the first stream sequence of part i's stream: 1, or
// for an epoch slot whose epoch was removed, the one after the removed
// epoch's last (RemoveEpoch).
func (l Log) FirstSeq(ctx context.Context, i int) (uint64, error) {
	l = l.withDefaults()
	name := l.Shards.Stream(l.Stream, i)
	s, err := l.JS.Stream(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	return max(s.CachedInfo().Config.FirstSeq, 1), nil
}

// lastOf is LastPositions of shard i.
func (l Log) lastOf(ctx context.Context, i int) (events.Position, error) {
	l = l.withDefaults()
	name := l.Shards.Stream(l.Stream, i)
	s, err := l.JS.Stream(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	last := s.CachedInfo().State.LastSeq
	if last == 0 {
		return 0, nil
	}
	if last < s.CachedInfo().Config.FirstSeq {
		// A stream created again after its epoch was removed
		// (RemoveEpoch), with nothing since: its positions go on from
		// the removed epoch's last.
		return l.Shards.Position(i, last), nil
	}
	_, err = s.GetMsg(ctx, last)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		last, err = 0, nil
		for _, subject := range l.Shards.Subjects(l.Subjects, i).Log() {
			msg, gerr := s.GetLastMsgForSubject(ctx, subject)
			if gerr == nil {
				last = max(last, msg.Sequence)
			} else if !errors.Is(gerr, jetstream.ErrMsgNotFound) {
				err = gerr
			}
		}
	}
	if err != nil {
		return 0, fmt.Errorf("eventlog: last event: %w", err)
	}
	return l.Shards.Position(i, last), nil
}

// HeadAt returns the chain head at position pos, or at shard 0's last
// event when pos is 0. An empty shard, and a position of a removed
// epoch, have the zero Head.
func (l Log) HeadAt(ctx context.Context, pos events.Position) (Head, error) {
	l = l.withDefaults()
	if pos == 0 {
		var err error
		if pos, err = l.lastOf(ctx, 0); err != nil || pos == 0 {
			return Head{}, err
		}
	}
	i, seq := l.Shards.Split(pos)
	name := l.Shards.Stream(l.Stream, i)
	s, err := l.JS.Stream(ctx, name)
	if err != nil {
		return Head{}, fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	if seq < s.CachedInfo().Config.FirstSeq {
		return Head{}, nil // in a removed epoch (RemoveEpoch)
	}
	msg, err := s.GetMsg(ctx, seq)
	if err != nil {
		return Head{}, fmt.Errorf("eventlog: chain head at %d: %w", pos, err)
	}
	return Head{Pos: pos, Hash: events.HashOf(msg.Data)}, nil
}

// Message returns the stored bytes of the message at position pos.
func (l Log) Message(ctx context.Context, pos events.Position) ([]byte, error) {
	l = l.withDefaults()
	i, seq := l.Shards.Split(pos)
	name := l.Shards.Stream(l.Stream, i)
	s, err := l.JS.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	msg, err := s.GetMsg(ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("eventlog: message at %d: %w", pos, err)
	}
	return msg.Data, nil
}

// HeadsAt returns the chain head at each of positions (nil: at every
// shard's last event), leaving out an empty shard's.
func (l Log) HeadsAt(ctx context.Context, positions []events.Position) ([]Head, error) {
	if positions == nil {
		var err error
		if positions, err = l.LastPositions(ctx); err != nil {
			return nil, err
		}
	}
	var heads []Head
	for _, pos := range positions {
		if pos == 0 {
			continue
		}
		h, err := l.HeadAt(ctx, pos)
		if err != nil {
			return nil, err
		}
		if h.Pos != 0 {
			heads = append(heads, h)
		}
	}
	return heads, nil
}

// CheckHeads is Check of every head of hs (a sharded log's are one a
// shard), looking for holes once.
func (l Log) CheckHeads(ctx context.Context, hs []Head) error {
	if len(hs) == 0 {
		return l.Check(ctx, Head{})
	}
	errs := []error{l.Check(ctx, hs[0])}
	for _, h := range hs[1:] {
		errs = append(errs, l.checkHead(ctx, h))
	}
	return errors.Join(errs...)
}

// Check returns nil when the log has no hole and still holds h (the zero
// Head: none saved): its stream reaches h.Seq and the message there
// hashes to h.Hash. Otherwise it returns an error wrapping
// ErrEventsMissing, ErrLogTruncated or ErrHeadMismatch, or the read's
// error. Holes are looked for in every shard, the head in its own. It
// costs two reads, and one stream info a shard, whatever the log's size.
func (l Log) Check(ctx context.Context, h Head) error {
	l = l.withDefaults()
	var missing []error
	for i := range l.Shards.N() {
		name := l.Shards.Stream(l.Stream, i)
		s, err := l.JS.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("eventlog: stream %s: %w", name, err)
		}
		if st := s.CachedInfo().State; st.NumDeleted > 0 {
			missing = append(missing, fmt.Errorf("%w: %d of sequences %d to %d of %s hold no message", ErrEventsMissing, st.NumDeleted, st.FirstSeq, st.LastSeq, name))
		}
	}
	if h.Pos == 0 {
		return errors.Join(missing...)
	}
	return errors.Join(append(missing, l.checkHead(ctx, h))...)
}

// checkHead returns nil when the log reaches h (not the zero Head) and
// holds it, else an error wrapping ErrLogTruncated or ErrHeadMismatch,
// or the read's error.
func (l Log) checkHead(ctx context.Context, h Head) error {
	shard, seq := l.Shards.Split(h.Pos)
	if first, err := l.FirstSeq(ctx, shard); err != nil || seq < first {
		return err // a head in a removed epoch: its archive holds it
	}
	last, err := l.lastOf(ctx, shard)
	if err != nil {
		return err
	}
	if last < h.Pos {
		if empty, err := l.emptied(ctx, shard); err != nil {
			return err
		} else if empty {
			return fmt.Errorf("%w (%w): stream %s holds no event, the head was saved at %d", ErrLogEmpty, ErrLogTruncated, l.Shards.Stream(l.Stream, shard), h.Pos)
		}
		return fmt.Errorf("%w: the last event is at sequence %d, the head saved at %d", ErrLogTruncated, last, h.Pos)
	} else if got, err := l.HeadAt(ctx, h.Pos); err != nil {
		return fmt.Errorf("%w: %w", ErrHeadMismatch, err)
	} else if got.Hash != h.Hash {
		return fmt.Errorf("%w: the message at sequence %d is not the one saved", ErrHeadMismatch, h.Pos)
	}
	return nil
}

// emptied reports whether part i's stream holds no message.
func (l Log) emptied(ctx context.Context, i int) (bool, error) {
	name := l.Shards.Stream(l.Stream, i)
	s, err := l.JS.Stream(ctx, name)
	if err != nil {
		return false, fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	return s.CachedInfo().State.Msgs == 0, nil
}

// CheckStreams returns nil when every stream of the log exists and still
// holds what a reader saw of it: applied is, by shard, the position of
// the last event read (nil or 0: none; projections.Engine.Positions).
// Otherwise it returns an error wrapping ErrStreamMissing (the stream
// was deleted), ErrLogTruncated (it ends before applied: deleted and
// created again) or ErrEventsMissing (it holds no message though its
// sequences have advanced past its first: purged), or the read's error.
// It lists the streams on the log's subjects, one JetStream API request
// a page of 256 streams, however many parts the log has: cheap enough
// for a readiness probe. An epoch's streams, replaced by RemoveEpoch,
// start after their last sequence and pass (for the moment between the
// deletion and the re-creation the stream is missing).
func (l Log) CheckStreams(ctx context.Context, applied []events.Position) error {
	l = l.withDefaults()
	infos := map[string]*jetstream.StreamInfo{}
	lister := l.JS.ListStreams(ctx, jetstream.WithStreamListSubject(l.Subjects.Root+".>"))
	for info := range lister.Info() {
		infos[info.Config.Name] = info
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return fmt.Errorf("eventlog: list streams: %w", err)
	}
	var errs []error
	for i := range l.Shards.N() {
		name := l.Shards.Stream(l.Stream, i)
		info, ok := infos[name]
		if !ok {
			errs = append(errs, fmt.Errorf("%w: stream %s", ErrStreamMissing, name))
			continue
		}
		first := max(info.Config.FirstSeq, 1)
		if i < len(applied) && applied[i] != 0 {
			if _, seq := l.Shards.Split(applied[i]); seq >= first && info.State.LastSeq < seq {
				errs = append(errs, fmt.Errorf("%w: stream %s ends at sequence %d, before the event read at %d", ErrLogTruncated, name, info.State.LastSeq, seq))
				continue
			}
		}
		if info.State.Msgs == 0 && info.State.LastSeq >= first {
			errs = append(errs, fmt.Errorf("%w: stream %s holds no message, though its sequences reached %d", ErrEventsMissing, name, info.State.LastSeq))
		}
	}
	return errors.Join(errs...)
}
