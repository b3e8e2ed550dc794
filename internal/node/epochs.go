package node

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
)

// epochCheck returns how often the node advances and seals epochs: the
// configured interval, or a tenth of the period within 100 ms and 1 min.
func (c Config) epochCheck() time.Duration {
	if c.EpochCheck > 0 {
		return c.EpochCheck
	}
	return min(max(c.EpochPeriod/10, 100*time.Millisecond), time.Minute)
}

// runEpochs keeps the log's epochs moving until ctx ends (docs/DESIGN.md,
// "Epochs"): every check it reads the slots again, opens the epoch of now
// in the next slot once the current epoch's period is over and that slot
// is free, seals an epoch whose period ended more than EpochRetain
// periods ago and whose lineages have all ended, and finishes a removal
// that stopped half way. Every process does it;
// the slots' entry is changed only by compare and set, and sealing twice
// is harmless.
func (n *Node) runEpochs(ctx context.Context) {
	tick := time.NewTicker(n.cfg.epochCheck())
	defer tick.Stop()
	for {
		if err := n.stepEpochs(ctx); err != nil && ctx.Err() == nil {
			n.errorLog.Log(zerolog.WarnLevel, "epochs", "epochs not advanced or sealed", func(ev *zerolog.Event) { ev.Err(err) })
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stepEpochs is one check of runEpochs.
func (n *Node) stepEpochs(ctx context.Context) error {
	st, period := n.Store, n.cfg.EpochPeriod
	now := eventlog.EpochOf(n.cfg.Now(), period)
	e, err := eventlog.UpdateEpochs(ctx, st.JetStream(), n.cfg.Stream, func(e *eventlog.Epochs) bool {
		next := (e.Current + 1) % len(e.Slots)
		if e.Slots[e.Current].Epoch >= now || e.Slots[next].State != eventlog.SlotFree {
			return false
		}
		e.Slots[next] = eventlog.Slot{Epoch: now, State: eventlog.SlotOpen, Opened: n.cfg.Now().UTC()}
		e.Current = next
		return true
	})
	if err != nil {
		return err
	}
	if err := st.RefreshEpochs(ctx); err != nil {
		return err
	}
	for slot, s := range e.Slots {
		if s.State == eventlog.SlotSealed && s.NextSeqs != nil {
			// A removal that stopped once it recorded the next sequences
			// (eventlog.RemoveEpoch: its caller's checks were done): finish
			// it, or the slot is never free again.
			if err := eventlog.RemoveEpoch(ctx, st.Log(), s.Epoch); err != nil {
				return err
			}
			n.cfg.Logger.Info().Int64("epoch", s.Epoch).Int("slot", slot).Msg("epoch removal finished")
			continue
		}
		if slot == e.Current || s.State != eventlog.SlotOpen || s.Epoch+int64(n.cfg.EpochRetain) >= now {
			continue
		}
		if done, err := n.epochDone(ctx, slot); err != nil || !done {
			return err
		}
		if err := eventlog.SealSlot(ctx, st.JetStream(), n.cfg.Stream, st.Shards(), slot, s.Epoch); err != nil {
			return err
		}
		n.cfg.Logger.Info().Int64("epoch", s.Epoch).Int("slot", slot).Msg("epoch sealed")
		// An epoch no lineage started in has nothing to archive: its slot
		// is freed at once, so the next epoch need not wait for an
		// operator.
		if empty, err := n.slotEmpty(ctx, slot); err != nil || !empty {
			return err
		}
		if err := eventlog.RemoveEpoch(ctx, st.Log(), s.Epoch); err != nil {
			return err
		}
		n.cfg.Logger.Info().Int64("epoch", s.Epoch).Int("slot", slot).Msg("empty epoch removed")
	}
	return nil
}

// slotEmpty reports whether slot's streams hold no event.
func (n *Node) slotEmpty(ctx context.Context, slot int) (bool, error) {
	for _, part := range n.Store.Shards().SlotParts(slot) {
		name := n.Store.Shards().Stream(n.cfg.Stream, part)
		s, err := n.Store.JetStream().Stream(ctx, name)
		if err != nil {
			return false, fmt.Errorf("stream %s: %w", name, err)
		}
		if s.CachedInfo().State.Msgs > 0 {
			return false, nil
		}
	}
	return true, nil
}

// epochDone reports whether the projections hold every event of slot's
// streams and every lineage in them has ended.
func (n *Node) epochDone(ctx context.Context, slot int) (bool, error) {
	parts := n.Store.Shards().SlotParts(slot)
	last, err := n.Store.Log().LastPositions(ctx)
	if err != nil {
		return false, err
	}
	for i, pos := range last {
		if slices.Contains(parts, i) && !n.Engine.Covers(pos) {
			return false, nil
		}
	}
	return n.Engine.OpenIn(parts) == 0, nil
}

// epochStats returns what GET /v1/stats shows of st's epochs; nil for a
// log without.
func epochStats(st *store.Store, period time.Duration) func() *api.EpochStats {
	if st.Shards().Slots == 0 {
		return nil
	}
	return func() *api.EpochStats {
		e := st.Epochs()
		out := &api.EpochStats{PeriodSeconds: period.Seconds(), Current: e.Current, Removed: append([]int64{}, e.Removed...)}
		for i, s := range e.Slots {
			row := api.EpochSlot{Slot: i, State: s.State}
			if s.State != eventlog.SlotFree {
				epoch, start := s.Epoch, time.Unix(0, s.Epoch*int64(period)).UTC()
				end := start.Add(period)
				row.Epoch, row.Start, row.End, row.Opened = &epoch, &start, &end, &s.Opened
			}
			if !s.Sealed.IsZero() {
				row.Sealed = &s.Sealed
			}
			out.Slots = append(out.Slots, row)
		}
		return out
	}
}
