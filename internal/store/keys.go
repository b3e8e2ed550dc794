package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// LoadKey returns a concurrency key's current state as its subject in the
// log has it now (on a replicated stream, as the leader has it): the
// cached state, caught up with the events appended after it, or, for a
// key not cached, replayed from its first event. A key with no events is
// the zero KeyState.
func (s *Store) LoadKey(ctx context.Context, customerID, key string) (aggregate.KeyState, error) {
	keyID := events.KeyID(customerID, key)
	s.mu.Lock()
	k := s.keys[keyID]
	s.mu.Unlock()
	_, last := s.shards.Split(k.LastSeq)
	err := s.keyEvents(ctx, customerID, key, last+1, func(ev events.Event) { k = aggregate.ApplyKey(k, ev) })
	if err == nil {
		s.rememberKey(k)
	}
	return k, err
}

// rememberKey caches k unless the cache holds a newer state of it.
func (s *Store) rememberKey(k aggregate.KeyState) {
	if !k.Exists() || s.cfg.CacheSize <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k.LastSeq > s.keys[k.KeyID].LastSeq {
		putBounded(s.keys, s.cfg.CacheSize, k.KeyID, k)
	}
}

// KeyHistory returns every event of a concurrency key in log order, each
// with its stream sequence; none for a key the log never saw.
func (s *Store) KeyHistory(ctx context.Context, customerID, key string) ([]events.Event, error) {
	var evs []events.Event
	err := s.keyEvents(ctx, customerID, key, 0, func(ev events.Event) { evs = append(evs, ev) })
	return evs, err
}

// keyEvents calls fn for each event of the key stored at or after
// stream sequence from of its shard.
func (s *Store) keyEvents(ctx context.Context, customerID, key string, from uint64, fn func(events.Event)) error {
	keyID := events.KeyID(customerID, key)
	i := s.shards.Of(customerID, keyID)
	return s.readSubject(ctx, i, s.parts[i].Subjects.Key(customerID, keyID), from, fn)
}

// ExecuteKey decides cmd against the key's state, loaded from the log
// (LoadKey: the cached state caught up, so a decision is never on a state
// older than the call), and appends the resulting event with the key
// subject's last sequence as the expected one: of two processes racing for a key's last slot, one
// appends and the other decides again on the new state (ErrKeyFull). It
// returns the key's state after the append and the appended events (none
// when the command was already satisfied). Decide's errors come back
// wrapped; ErrConflict only when every retry lost. It is safe for
// concurrent use; commands of this process on one key take turns.
func (s *Store) ExecuteKey(ctx context.Context, cmd aggregate.KeyCommand) (aggregate.KeyState, []events.Event, error) {
	customerID, key := cmd.Target()
	keyID := events.KeyID(customerID, key)
	defer s.take(keyID)()
	for attempt := 0; ; attempt++ {
		k, err := s.LoadKey(ctx, customerID, key)
		if err != nil {
			return k, nil, fmt.Errorf("%w: load key %s: %w", ErrUnavailable, keyID, err)
		}
		evs, err := aggregate.DecideKey(k, cmd, s.cfg.Now())
		if err != nil || len(evs) == 0 {
			return k, nil, err
		}
		ev := &evs[0]
		ev.ID, ev.Actor, ev.Prev = events.NewID(), s.cfg.Actor, k.LastHash
		err = s.publish(ctx, ev, s.shards.OfEvent(*ev, ""), k.LastSeq)
		if errors.Is(err, aggregate.ErrConflict) && attempt < s.cfg.MaxRetries {
			continue
		}
		if err != nil {
			return k, nil, fmt.Errorf("store: %T on key %s: %w", cmd, keyID, err)
		}
		k = aggregate.ApplyKey(k, *ev)
		s.rememberKey(k)
		return k, evs, nil
	}
}
