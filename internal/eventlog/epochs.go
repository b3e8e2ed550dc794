package eventlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// Epochs (the package doc, "Epochs"): with S epoch slots > 0 the
// log's tasks live in S slots of K streams each, one epoch to a slot. New
// lineages start in the current epoch's slot and stay in it for life. An
// epoch whose period is over and whose tasks are all terminal is sealed;
// once archived, an operator removes it (RemoveEpoch), and its slot takes
// a later epoch.

// The states of an epoch slot.
const (
	SlotOpen   = "open"   // takes new lineages (if current) and their events
	SlotSealed = "sealed" // its streams are sealed: read-only
	SlotFree   = "free"   // holds no epoch: none yet, or its epoch was removed
)

// epochsKey is the metadata entry of the epoch slots.
const epochsKey = "epochs"

// Slot is one epoch slot.
type Slot struct {
	// Epoch is the number of the period the slot's epoch began in:
	// Unix time ÷ the epoch period.
	Epoch  int64     `json:"epoch"`
	State  string    `json:"state"`
	Opened time.Time `json:"opened,omitzero"`
	Sealed time.Time `json:"sealed,omitzero"`
	// NextSeqs are, for a free slot whose epoch was removed, the first
	// stream sequence of each shard's new stream: positions never repeat.
	NextSeqs []uint64 `json:"nextSeqs,omitempty"`
	// Heads are, for a sealed slot being removed, the chain head at each
	// shard's last event (the zero Head for a shard without one),
	// recorded with NextSeqs before any stream is deleted: what a removal
	// finished later checks an archive's content against once a stream
	// is gone.
	Heads []Head `json:"heads,omitempty"`
}

// Epochs is the state of the epoch slots, kept in the log's metadata.
type Epochs struct {
	Period  time.Duration `json:"period"`  // the log's epoch period
	Current int           `json:"current"` // the slot new lineages start in
	Slots   []Slot        `json:"slots"`
	// Removed lists the epochs removed from the cluster, oldest first.
	Removed []int64 `json:"removed,omitempty"`
}

// EpochOf returns the number of the epoch period t falls in.
func EpochOf(t time.Time, period time.Duration) int64 { return t.UnixNano() / int64(period) }

// SlotOfEpoch returns the slot that holds epoch n; false if none does.
func (e Epochs) SlotOfEpoch(n int64) (int, bool) {
	for i, s := range e.Slots {
		if s.State != SlotFree && s.Epoch == n {
			return i, true
		}
	}
	return 0, false
}

// SlotsToRead returns every slot, the current one first: the ones a task
// may be looked for in. A slot this process's copy of the epochs calls
// free may have been opened by another process since it last read them
// (RefreshEpochs), so none is skipped; a free slot's streams are empty,
// and a direct get on them is answered at once.
func (e Epochs) SlotsToRead() []int {
	out := make([]int, 0, len(e.Slots))
	out = append(out, e.Current)
	for i := range e.Slots {
		if i != e.Current {
			out = append(out, i)
		}
	}
	return out
}

// ReadEpochs returns the epoch slots of the log named stream; false when
// the log has none (it was created without epochs, or not yet).
func ReadEpochs(ctx context.Context, js jetstream.JetStream, stream string) (Epochs, bool, error) {
	kv, err := js.KeyValue(ctx, MetaBucket(stream))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return Epochs{}, false, nil
	}
	if err != nil {
		return Epochs{}, false, fmt.Errorf("eventlog: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	e, _, ok, err := readEpochs(ctx, kv)
	return e, ok, err
}

func readEpochs(ctx context.Context, kv jetstream.KeyValue) (Epochs, uint64, bool, error) {
	entry, err := kv.Get(ctx, epochsKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Epochs{}, 0, false, nil
	}
	if err != nil {
		return Epochs{}, 0, false, fmt.Errorf("eventlog: read epochs: %w", err)
	}
	var e Epochs
	if err := json.Unmarshal(entry.Value(), &e); err != nil || len(e.Slots) == 0 || e.Current < 0 || e.Current >= len(e.Slots) || e.Period < MinEpochPeriod {
		return Epochs{}, 0, false, fmt.Errorf("eventlog: bad epochs entry %q", entry.Value())
	}
	return e, entry.Revision(), true, nil
}

// UpdateEpochs changes the epoch slots of the log named stream with fn
// and stores the result if no other process changed them meanwhile (else
// fn runs again on theirs, at most 10 times). fn returning false stores
// nothing. It returns the slots as stored.
func UpdateEpochs(ctx context.Context, js jetstream.JetStream, stream string, fn func(*Epochs) bool) (Epochs, error) {
	kv, err := js.KeyValue(ctx, MetaBucket(stream))
	if err != nil {
		return Epochs{}, fmt.Errorf("eventlog: metadata bucket %s: %w", MetaBucket(stream), err)
	}
	for range 10 {
		e, rev, ok, err := readEpochs(ctx, kv)
		if err != nil {
			return e, err
		}
		if !ok {
			return e, errors.New("eventlog: the log has no epochs")
		}
		if !fn(&e) {
			return e, nil
		}
		data, _ := json.Marshal(e)
		if _, err = kv.Update(ctx, epochsKey, data, rev); err == nil {
			return e, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return e, fmt.Errorf("eventlog: write epochs: %w", err)
		}
	}
	return Epochs{}, errors.New("eventlog: the epochs entry kept changing")
}

// initEpochs records slots 0..n-1, the first holding the epoch of now,
// unless the log has them already.
func initEpochs(ctx context.Context, kv jetstream.KeyValue, n int, period time.Duration, now time.Time) error {
	e := Epochs{Period: period, Slots: make([]Slot, n)}
	for i := range e.Slots {
		e.Slots[i].State = SlotFree
	}
	e.Slots[0] = Slot{Epoch: EpochOf(now, period), State: SlotOpen, Opened: now.UTC()}
	data, _ := json.Marshal(e)
	if _, err := kv.Create(ctx, epochsKey, data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("eventlog: record epochs: %w", err)
	}
	return nil
}

// ErrEpochNotSealed is returned (wrapped) by RemoveEpoch for an epoch
// whose slot is not sealed.
var ErrEpochNotSealed = errors.New("eventlog: the epoch is not sealed")

// SealSlot seals the streams of epoch slot slot, holding epoch n, and
// records it sealed. The caller checked that every task of its epoch is
// terminal and its period over: a sealed stream takes no write. It reads
// the epochs first and does nothing unless the slot still holds epoch n,
// open and not current: the caller's copy may be stale, and another
// process may have sealed and removed n since and the slot taken the
// current epoch, whose streams must not be sealed. (Between that read and
// the seals there is no such guard.)
func SealSlot(ctx context.Context, js jetstream.JetStream, stream string, shards events.Shards, slot int, n int64) error {
	e, ok, err := ReadEpochs(ctx, js, stream)
	if err != nil {
		return err
	}
	if !ok || slot < 0 || slot >= len(e.Slots) || slot == e.Current || e.Slots[slot].State != SlotOpen || e.Slots[slot].Epoch != n {
		return nil
	}
	for _, part := range shards.SlotParts(slot) {
		name := shards.Stream(stream, part)
		st, err := js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("eventlog: stream %s: %w", name, err)
		}
		cfg := st.CachedInfo().Config
		if cfg.Sealed {
			continue
		}
		cfg.Sealed = true
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("eventlog: seal %s: %w", name, err)
		}
	}
	_, err = UpdateEpochs(ctx, js, stream, func(e *Epochs) bool {
		if e.Slots[slot].State != SlotOpen || e.Slots[slot].Epoch != n {
			return false
		}
		e.Slots[slot].State, e.Slots[slot].Sealed = SlotSealed, time.Now().UTC()
		return true
	})
	return err
}

// RemoveEpoch deletes the sealed streams of epoch n of log from the
// cluster and frees its slot. Each shard's stream is created again,
// empty, starting at the sequence after its last, so no position is ever
// used twice; those sequences are recorded first, so RemoveEpoch (or
// OpenPart) run again after a crash in between finishes the same way. The
// caller checked that an archive of the epoch is complete
// (archive.CheckLive).
func RemoveEpoch(ctx context.Context, log Log, n int64) error {
	log = log.withDefaults()
	e, ok, err := ReadEpochs(ctx, log.JS, log.Stream)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("eventlog: the log has no epochs")
	}
	slot, ok := e.SlotOfEpoch(n)
	if !ok {
		return fmt.Errorf("eventlog: no live epoch %d", n)
	}
	if e.Slots[slot].State != SlotSealed {
		return fmt.Errorf("%w: epoch %d is %s", ErrEpochNotSealed, n, e.Slots[slot].State)
	}
	parts := log.Shards.SlotParts(slot)
	next := e.Slots[slot].NextSeqs
	if next == nil {
		next = make([]uint64, len(parts))
		heads := make([]Head, len(parts))
		for i, part := range parts {
			last, err := log.lastOf(ctx, part)
			if err != nil {
				return err
			}
			if last != 0 {
				if heads[i], err = log.HeadAt(ctx, last); err != nil {
					return err
				}
			}
			// An empty stream has no last event (lastOf is 0) but may
			// start past 1, its slot's earlier epoch having been removed:
			// its next sequence is then its first.
			first, err := log.FirstSeq(ctx, part)
			if err != nil {
				return err
			}
			_, seq := log.Shards.Split(last)
			next[i] = max(seq+1, first)
		}
		// Recorded only on the slot still holding epoch n, sealed: another
		// removal may have finished meanwhile and the slot taken a new
		// epoch, which these sequences must not follow into (once sealed,
		// a slot with sequences recorded is one being removed).
		changed := false
		if _, err := UpdateEpochs(ctx, log.JS, log.Stream, func(e *Epochs) bool {
			switch s := &e.Slots[slot]; {
			case s.State != SlotSealed || s.Epoch != n:
				changed = true
				return false
			case s.NextSeqs != nil: // another removal recorded them first
				next = s.NextSeqs
				return false
			default:
				s.NextSeqs, s.Heads = next, heads
				return true
			}
		}); err != nil {
			return err
		}
		if changed {
			return fmt.Errorf("eventlog: epoch %d was removed meanwhile", n)
		}
	}
	for i, part := range parts {
		if err := replaceStream(ctx, log, part, next[i]); err != nil {
			return err
		}
	}
	_, err = UpdateEpochs(ctx, log.JS, log.Stream, func(e *Epochs) bool {
		if e.Slots[slot].State != SlotSealed || e.Slots[slot].Epoch != n {
			return false
		}
		e.Slots[slot] = Slot{State: SlotFree, NextSeqs: next}
		e.Removed = append(e.Removed, n)
		return true
	})
	return err
}

// replaceStream makes part's stream an empty, unsealed one whose first
// sequence is first: it deletes a sealed one, and creates it with the
// configuration of the log's first stream.
func replaceStream(ctx context.Context, log Log, part int, first uint64) error {
	name := log.Shards.Stream(log.Stream, part)
	st, err := log.JS.Stream(ctx, name)
	switch {
	case err == nil && !st.CachedInfo().Config.Sealed:
		return nil // replaced already
	case err == nil:
		if err := log.JS.DeleteStream(ctx, name); err != nil {
			return fmt.Errorf("eventlog: remove %s: %w", name, err)
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("eventlog: stream %s: %w", name, err)
	}
	model, err := log.JS.Stream(ctx, log.Shards.Stream(log.Stream, 0))
	if err != nil {
		return fmt.Errorf("eventlog: stream %s: %w", log.Shards.Stream(log.Stream, 0), err)
	}
	cfg := model.CachedInfo().Config
	cfg.Name, cfg.Subjects, cfg.FirstSeq = name, log.Shards.Subjects(log.Subjects, part).Log(), first
	if _, err := log.JS.CreateStream(ctx, cfg); err != nil {
		return fmt.Errorf("eventlog: create %s: %w", name, err)
	}
	return nil
}
