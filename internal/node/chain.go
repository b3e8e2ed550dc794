package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/replay"
)

// The keyed chain at start (events/doc.go, "Keyed chain"): find or make
// the key file, and check the events the saved chain heads do not cover.

// ErrChainKeyMissing is returned by New when the log holds keyed events
// and the chain key file does not exist: signing with a new key would
// leave every earlier event unverifiable, so the process refuses to
// start until the file is restored (or --chain-key-file names it).
var ErrChainKeyMissing = errors.New("node: the log is keyed and its chain key file is missing")

// maxChainReports is how many chain violations the start-up check logs
// one by one; the rest are counted.
const maxChainReports = 10

// openChain returns the key file at path, creating it when it does not
// exist and the log has no keyed event: a new log is keyed from its first
// event, an older one from the sequence each stream takes next (its
// earlier unkeyed events verify by their hash links, as before). When the
// log's last event in some stream is keyed, the file must exist: it
// returns an error wrapping ErrChainKeyMissing.
func openChain(ctx context.Context, log eventlog.Log, path string, now time.Time) (chainkey.File, bool, error) {
	f, err := chainkey.Load(path)
	if !errors.Is(err, chainkey.ErrNoFile) {
		return f, false, err
	}
	last, err := log.LastPositions(ctx)
	if err != nil {
		return f, false, err
	}
	keyedFrom := map[string]uint64{}
	for i, pos := range last {
		seq := pos.Seq(log.Shards)
		if seq == 0 {
			continue
		}
		if first, err := log.FirstSeq(ctx, i); err != nil || seq < first {
			keyedFrom[log.Shards.Stream(log.Stream, i)] = seq + 1 // a removed epoch's stream, empty since
			if err != nil {
				return f, false, err
			}
			continue
		}
		h, err := log.Message(ctx, pos)
		if err != nil {
			return f, false, err
		}
		if ev, err := events.Decode(h); err == nil && ev.Key != 0 {
			return f, false, fmt.Errorf("%w: the last event of stream %s (sequence %d) is signed with chain key %d, and %s does not exist: restore the key file from its backup, or name it with --chain-key-file (docs/operations.md, \"Chain key\")",
				ErrChainKeyMissing, log.Shards.Stream(log.Stream, i), seq, ev.Key, path)
		}
		keyedFrom[log.Shards.Stream(log.Stream, i)] = seq + 1
	}
	f, err = chainkey.Create(path, keyedFrom, now)
	return f, err == nil, err
}

// checkChain checks every event after the saved chain heads (from each
// head on, or from a stream's start where none was saved) against the
// keyed chain's rule, and returns a warning, also logged, when one is
// not keyed where it must be or its MAC does not verify. It warns rather
// than refuses: one forged message must not keep the scheduler down (the
// projections apply what they read; replay verify names every violation).
func (n *Node) checkChain(ctx context.Context, f chainkey.File, kr *events.Keyring) string {
	log := n.Store.Log()
	heads, err := LoadHeads(ctx, n.Store.JetStream(), n.cfg.Stream)
	if err != nil {
		n.cfg.Logger.Warn().Err(err).Msg("keyed chain not checked")
		return ""
	}
	from := make([]uint64, log.Shards.N())
	for _, h := range heads {
		part, seq := log.Shards.Split(h.Pos)
		from[part] = seq
	}
	parts := f.Parts(log.Stream, log.Shards)
	for part, keyedFrom := range parts { // the unkeyed events before it are the hash links' to vouch for
		from[part] = max(from[part], keyedFrom)
	}
	rule := replay.NewChain(kr, parts)
	var bad int
	var first replay.Violation
	for i := range from {
		o := eventlog.ReadOptions{Shards: []int{i}, From: log.Shards.Position(i, from[i])}
		err := log.Read(ctx, o, func(m eventlog.Message) error {
			ev, err := events.Decode(m.Data)
			if err != nil {
				return nil // not the chain's to say: replay verify and the projections report it
			}
			part, seq := log.Shards.Split(m.Pos)
			kind, detail := rule.Check(part, seq, ev, m.Data)
			if kind == "" {
				return nil
			}
			if bad++; bad == 1 {
				first = replay.Violation{Seq: m.Pos, TaskID: ev.TaskID, Kind: kind, Detail: detail}
			}
			if bad <= maxChainReports {
				n.cfg.Logger.Error().Uint64("seq", uint64(m.Pos)).Str("task", ev.TaskID).Str("kind", kind).Msg(detail)
			}
			return nil
		})
		if err != nil {
			n.cfg.Logger.Warn().Err(err).Msg("keyed chain not checked")
			return ""
		}
	}
	if bad == 0 {
		return ""
	}
	warning := fmt.Sprintf("%d events of the log are not vouched for by its chain key (the first at sequence %d, task %s: %s): forged or changed; run taskledger replay verify", bad, first.Seq, first.TaskID, first.Kind)
	n.cfg.Logger.Error().Int("events", bad).Uint64("seq", uint64(first.Seq)).Msg(warning)
	return warning
}
