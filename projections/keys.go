package projections

import (
	"cmp"
	"slices"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// keys is the concurrency-key view: each key's state, folded with the
// aggregate's ApplyKey, the live tasks of each key, and the holders
// waiting in the Free queue for their slot to be released: terminal ones,
// and retried ones holding the slot of an attempt they have left.
type keys struct {
	byKey map[string]*aggregate.KeyState // by key id (events.KeyID)
	// live holds each key's non-terminal tasks: its holders and waiters.
	live map[string]map[string]struct{}
	// freeing holds the tasks in the Free queue as the alarm needs them
	// (id, customer, key, status, a retried one's attempts): a finished
	// lineage's task may be evicted from tasks before its slot is
	// released.
	freeing map[string]aggregate.State
}

func newKeys() keys {
	return keys{byKey: make(map[string]*aggregate.KeyState), live: make(map[string]map[string]struct{}),
		freeing: make(map[string]aggregate.State)}
}

// keyOf returns the key id of a task's concurrency key; ok is false for a
// task without one.
func keyOf(customerID string, c *events.Concurrency) (string, bool) {
	if c == nil {
		return "", false
	}
	return events.KeyID(customerID, c.Key), true
}

// applyKey folds a key's event and reports whether the alarm must wake: a
// slot was released (a waiter may now take it) or a terminal task, or one
// past the attempt the slot is for, acquired one (it must be released).
func (v *views) applyKey(ev events.Event) bool {
	k := v.byKey[ev.TaskID]
	if k == nil {
		k = &aggregate.KeyState{}
		v.byKey[ev.TaskID] = k
	}
	before := *k
	*k = aggregate.ApplyKey(before, ev)
	switch p := ev.Data.(type) {
	case events.SlotAcquired:
		if t := v.tasks[p.TaskID]; !before.Holds(p.TaskID) && (t == nil || t.terminal() || t.attemptNo() > max(p.Attempt, 1)) {
			v.free(k, p.TaskID)
			return true
		}
	case events.SlotReleased:
		if before.Holds(p.TaskID) {
			v.timers[Free].remove(p.TaskID)
			delete(v.freeing, p.TaskID)
			return true
		}
	}
	return false
}

// rekey keeps a keyed task in its key's live set and, when it finishes
// holding a slot (it ended, or was retried: RetryScheduled), puts it in
// the Free queue.
func (v *views) rekey(before, after *aggregate.State) bool {
	kid, ok := keyOf(after.CustomerID, after.Spec.Concurrency)
	if !ok {
		return false
	}
	wasLive, isLive := before.Exists() && !before.Status.Terminal(), !after.Status.Terminal()
	switch {
	case wasLive && isLive && after.Attempt() > before.Attempt():
		if k := v.byKey[kid]; k != nil && k.Holds(after.TaskID) && k.HeldFor(after.TaskID) < after.Attempt() {
			v.free(k, after.TaskID)
			return true
		}
	case wasLive && isLive && before.Delivery.ID == "" && after.Delivery.ID != "":
		// Released holding its last attempt's slot (by a scheduler from
		// before retries gave slots back): the slot is in use again.
		if _, ok := v.freeing[after.TaskID]; ok {
			v.timers[Free].remove(after.TaskID)
			delete(v.freeing, after.TaskID)
		}
	case isLive && !wasLive:
		set := v.keys.live[kid]
		if set == nil {
			set = make(map[string]struct{})
			v.keys.live[kid] = set
		}
		set[after.TaskID] = struct{}{}
	case wasLive && !isLive:
		if set := v.keys.live[kid]; set != nil {
			if delete(set, after.TaskID); len(set) == 0 {
				delete(v.keys.live, kid)
			}
		}
		if k := v.byKey[kid]; k != nil && k.Holds(after.TaskID) {
			v.free(k, after.TaskID)
			return true
		}
		// A waiter that ended before its release (canceled) may have been
		// counted against its key's room (releasable: the alarm's in
		// flight, another process's, parked): the next may run now.
		return before.Status == aggregate.StatusScheduled && before.Delivery.ID == ""
	}
	return false
}

// free puts taskID, a holder of k that is terminal (or evicted, so
// terminal) or retried past the attempt its slot is for, in the Free
// queue.
func (v *views) free(k *aggregate.KeyState, taskID string) {
	s := aggregate.State{TaskID: taskID, CustomerID: k.CustomerID, Spec: events.TaskSpec{Concurrency: &events.Concurrency{Key: k.Key}}}
	if t := v.tasks[taskID]; t != nil {
		s.Status, s.CompletedAt = statuses[t.status], unnanos(t.completed)
		if t.conc != nil {
			s.Spec.Concurrency.Limit = t.conc.Limit
		}
		s.Retries = t.retries()
	}
	v.freeing[taskID] = s
	v.timers[Free].set(taskID, k.CustomerID, FreeAt(s))
}

// FreeAt is when a task of the Free queue, s, began to wait for its
// slot's release: when it ended or, live, when its last attempt ended
// (RetryScheduled).
func FreeAt(s aggregate.State) time.Time {
	if n := len(s.Retries); n > 0 && !s.Status.Terminal() {
		return s.Retries[n-1].EndedAt
	}
	return s.CompletedAt
}

// restoreKeys rebuilds the key view from a snapshot's key states and Free
// queue, once the tasks are restored.
func (v *views) restoreKeys(ks []aggregate.KeyState, freeing []aggregate.State) {
	var zero aggregate.State
	for _, t := range v.tasks {
		if s := t.state(); !t.terminal() {
			v.rekey(&zero, &s) // a live task: into its key's live set
		}
	}
	for i := range ks {
		k := ks[i]
		v.byKey[k.KeyID] = &k
	}
	for _, s := range freeing {
		v.freeing[s.TaskID] = s
		v.timers[Free].set(s.TaskID, s.CustomerID, FreeAt(s))
	}
}

// freeingStates copies the Free queue's tasks, for a snapshot.
func (v *views) freeingStates() []aggregate.State {
	out := make([]aggregate.State, 0, len(v.freeing))
	for _, s := range v.freeing {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b aggregate.State) int { return cmp.Compare(a.TaskID, b.TaskID) })
	return out
}

// keyStates copies every key's state, for a snapshot.
func (v *views) keyStates() []aggregate.KeyState {
	out := make([]aggregate.KeyState, 0, len(v.byKey))
	for _, k := range v.byKey {
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b aggregate.KeyState) int { return cmp.Compare(a.KeyID, b.KeyID) })
	return out
}

// ConcurrencyKey returns a customer's concurrency key as the projections
// have it: its state, its holders (in the order they acquired a slot;
// a task evicted from the views has only its id, customer and key) and
// the tasks waiting for a slot at now (due, not released, not holding
// one), first due first. It is safe for concurrent use.
func (vw *Views) ConcurrencyKey(customerID, key string, now time.Time) (k aggregate.KeyState, holders, waiters []aggregate.State) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	kid := events.KeyID(customerID, key)
	if ks := vw.v.byKey[kid]; ks != nil {
		k = *ks
	}
	for _, id := range k.Holders {
		s, ok := vw.v.freeing[id]
		if t := vw.v.tasks[id]; t != nil {
			s, ok = vw.v.state(t), true
		}
		if !ok {
			s = aggregate.State{TaskID: id, CustomerID: customerID}
		}
		holders = append(holders, s)
	}
	for id := range vw.v.keys.live[kid] {
		s := vw.v.state(vw.v.tasks[id])
		if Waiting(s, now) && !k.Holds(id) {
			waiters = append(waiters, s)
		}
	}
	slices.SortFunc(waiters, func(a, b aggregate.State) int {
		return cmp.Or(a.DueAt().Compare(b.DueAt()), cmp.Compare(a.TaskID, b.TaskID))
	})
	return k, holders, waiters
}

// Waiters returns up to limit tasks of a customer's concurrency key due
// at now that wait for a slot (not released, holding none), first due
// first. It is safe for concurrent use.
func (vw *Views) Waiters(customerID, key string, now time.Time, limit int) []aggregate.State {
	_, _, waiters := vw.ConcurrencyKey(customerID, key, now)
	return waiters[:min(limit, len(waiters))]
}

// Waiting reports whether s waits for a slot of its concurrency key at
// now (aggregate.State.WaitsForSlot).
func Waiting(s aggregate.State, now time.Time) bool { return s.WaitsForSlot(now) }

// KeyStats are one concurrency key's counts (GET /v1/stats).
type KeyStats struct {
	CustomerID, Key string
	// Limit is the concurrency limit of the first holder, else of one of
	// the key's unfinished tasks.
	Limit int
	// Holders counts the tasks holding a slot; Waiting the unfinished
	// tasks holding none (due or not).
	Holders, Waiting int
}

// KeyStats returns the concurrency keys of customerID ("": every
// customer's) with a task holding a slot or waiting, ordered by customer
// then key, at most limit of them; more reports that there were others.
// It costs the keys and their holders, not their waiting tasks. It is
// safe for concurrent use.
func (vw *Views) KeyStats(customerID string, limit int) (out []KeyStats, more bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	v := &vw.v.keys
	row := func(kid string) (KeyStats, bool) {
		var ks KeyStats
		live := v.live[kid]
		if k := v.byKey[kid]; k != nil {
			ks.CustomerID, ks.Key, ks.Holders = k.CustomerID, k.Key, len(k.Holders)
			for _, id := range k.Holders {
				if _, ok := live[id]; ok {
					ks.Waiting--
				}
				if ks.Limit == 0 {
					if t := vw.v.tasks[id]; t != nil && t.conc != nil {
						ks.Limit = t.conc.Limit
					} else if s, ok := v.freeing[id]; ok {
						ks.Limit = s.Spec.Concurrency.Limit
					}
				}
			}
		}
		ks.Waiting += len(live)
		for id := range live { // one is enough: any unfinished task names the key
			if t := vw.v.tasks[id]; t != nil && t.conc != nil {
				ks.CustomerID, ks.Key = t.customer, t.conc.Key
				if ks.Limit == 0 {
					ks.Limit = t.conc.Limit
				}
			}
			break
		}
		return ks, (ks.Holders > 0 || ks.Waiting > 0) && (customerID == "" || ks.CustomerID == customerID)
	}
	for kid, k := range v.byKey {
		if len(k.Holders) > 0 {
			if ks, ok := row(kid); ok {
				out = append(out, ks)
			}
		}
	}
	for kid := range v.live {
		if k := v.byKey[kid]; k == nil || len(k.Holders) == 0 {
			if ks, ok := row(kid); ok {
				out = append(out, ks)
			}
		}
	}
	slices.SortFunc(out, func(a, b KeyStats) int {
		return cmp.Or(cmp.Compare(a.CustomerID, b.CustomerID), cmp.Compare(a.Key, b.Key))
	})
	if len(out) > limit {
		return out[:limit], true
	}
	return out, false
}
