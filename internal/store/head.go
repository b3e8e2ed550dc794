package store

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/events"
)

// Chain head errors, returned (wrapped, with the sequences) by
// Log.CheckHead.
var (
	// ErrLogTruncated: the log ends before the sequence of its saved
	// chain head, so events it once held are gone (a cut block file).
	ErrLogTruncated = errors.New("store: the log ends before its saved chain head")
	// ErrHeadMismatch: the message at the saved head's sequence is not
	// the one that was there when the head was saved.
	ErrHeadMismatch = errors.New("store: the log differs from its saved chain head")
)

// Head is a chain head: a stream sequence of the log and the SHA-256 of
// the message stored there. Saved from time to time (with every
// projection snapshot and at clean shutdown), it lets a later reader tell
// a log that lost its tail from one that simply ended: every task's
// events are chained by their hashes, but the last events of the stream
// have no successor to vouch for them.
type Head struct {
	Seq  uint64
	Hash events.Hash
}

type wireHead struct {
	Seq    uint64 `json:"seq"`
	SHA256 string `json:"sha256"`
}

// MarshalJSON implements json.Marshaler: {"seq": N, "sha256": "hex"}.
func (h Head) MarshalJSON() ([]byte, error) {
	return json.Marshal(wireHead{Seq: h.Seq, SHA256: hex.EncodeToString(h.Hash[:])})
}

// UnmarshalJSON implements json.Unmarshaler.
func (h *Head) UnmarshalJSON(b []byte) error {
	var w wireHead
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	sum, err := hex.DecodeString(w.SHA256)
	if err != nil || len(sum) != len(h.Hash) {
		return fmt.Errorf("store: chain head: bad sha256 %q", w.SHA256)
	}
	h.Seq = w.Seq
	copy(h.Hash[:], sum)
	return nil
}

// HeadAt returns the chain head at stream sequence seq, or at the
// stream's last message when seq is 0. An empty stream has the zero Head.
func (l Log) HeadAt(ctx context.Context, seq uint64) (Head, error) {
	l = l.withDefaults()
	s, err := l.JS.Stream(ctx, l.Stream)
	if err != nil {
		return Head{}, fmt.Errorf("store: stream %s: %w", l.Stream, err)
	}
	if seq == 0 {
		if seq = s.CachedInfo().State.LastSeq; seq == 0 {
			return Head{}, nil
		}
	}
	msg, err := s.GetMsg(ctx, seq)
	if err != nil {
		return Head{}, fmt.Errorf("store: chain head at %d: %w", seq, err)
	}
	return Head{Seq: seq, Hash: events.HashOf(msg.Data)}, nil
}

// CheckHead returns nil when the log still holds h: its stream reaches
// h.Seq and the message there hashes to h.Hash. Otherwise it returns an
// error wrapping ErrLogTruncated or ErrHeadMismatch, or the read's error.
func (l Log) CheckHead(ctx context.Context, h Head) error {
	if h.Seq == 0 {
		return nil
	}
	l = l.withDefaults()
	s, err := l.JS.Stream(ctx, l.Stream)
	if err != nil {
		return fmt.Errorf("store: stream %s: %w", l.Stream, err)
	}
	if last := s.CachedInfo().State.LastSeq; last < h.Seq {
		return fmt.Errorf("%w: the stream ends at sequence %d, the head saved at %d", ErrLogTruncated, last, h.Seq)
	}
	got, err := l.HeadAt(ctx, h.Seq)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrHeadMismatch, err)
	}
	if got.Hash != h.Hash {
		return fmt.Errorf("%w: the message at sequence %d is not the one saved", ErrHeadMismatch, h.Seq)
	}
	return nil
}
