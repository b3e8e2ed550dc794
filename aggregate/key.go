package aggregate

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/taskledger/taskledger/events"
)

// ErrKeyFull is returned by DecideKey for an AcquireSlot on a key that
// already has as many holders as the task's limit. The alarm leaves the
// task waiting until a holder's slot is released.
var ErrKeyFull = errors.New("aggregate: concurrency key is full")

// KeyState is a concurrency key as its events (SlotAcquired, SlotReleased)
// describe it: which tasks hold its slots. The zero KeyState is a key
// with no events. Like State, it is a value.
type KeyState struct {
	KeyID      string // events.KeyID(CustomerID, Key), the TaskID of its events
	CustomerID string
	Key        string
	// Holders are the tasks holding a slot, in the order they acquired it.
	Holders []string `msgpack:",omitempty"`
	// Attempts holds, for each holder whose slot is for a later attempt
	// than its first, that attempt (SlotAcquired's Attempt). Nil when
	// every holder's slot is for its first attempt.
	Attempts map[string]int `msgpack:",omitempty"`

	Version  int             // number of events applied
	LastSeq  events.Position // log position of the last event applied
	LastHash events.Hash
}

// Exists reports whether any event has been applied.
func (k KeyState) Exists() bool { return k.Version > 0 }

// Holds reports whether task taskID holds a slot of the key.
func (k KeyState) Holds(taskID string) bool { return slices.Contains(k.Holders, taskID) }

// HeldFor returns the attempt (from 1) of task taskID that its slot of the
// key is for, 0 when it holds none.
func (k KeyState) HeldFor(taskID string) int {
	if !k.Holds(taskID) {
		return 0
	}
	return max(k.Attempts[taskID], 1)
}

// ApplyKey returns k with ev applied. Like Apply it accepts any event: a
// SlotAcquired for a holder or a SlotReleased for a task that holds
// nothing changes nothing but Version and LastSeq (the verifier reports
// both, and one that exceeds its limit).
func ApplyKey(k KeyState, ev events.Event) KeyState {
	k.Version++
	k.LastSeq, k.LastHash = ev.Seq, ev.Hash
	switch p := ev.Data.(type) {
	case events.SlotAcquired:
		if k.Version == 1 {
			k.KeyID, k.CustomerID, k.Key = ev.TaskID, ev.CustomerID, p.Key
		}
		if !k.Holds(p.TaskID) {
			k.Holders = append(slices.Clip(k.Holders), p.TaskID)
			if p.Attempt > 1 {
				k.Attempts = maps.Clone(k.Attempts)
				if k.Attempts == nil {
					k.Attempts = make(map[string]int)
				}
				k.Attempts[p.TaskID] = p.Attempt
			}
		}
	case events.SlotReleased:
		if i := slices.Index(k.Holders, p.TaskID); i >= 0 {
			k.Holders = slices.Delete(slices.Clone(k.Holders), i, i+1)
			if _, ok := k.Attempts[p.TaskID]; ok {
				k.Attempts = maps.Clone(k.Attempts)
				if delete(k.Attempts, p.TaskID); len(k.Attempts) == 0 {
					k.Attempts = nil
				}
			}
		}
	}
	return k
}

// KeyCommand is a request to change one concurrency key: AcquireSlot or
// ReleaseSlot. Each names the key by its customer and name.
type KeyCommand interface {
	keyCommand()
	// Target returns the customer and the key the command changes.
	Target() (customerID, key string)
}

// AcquireSlot takes a slot of Key for attempt Attempt (from 1; 0 means
// 1) of TaskID, whose limit is Limit.
type AcquireSlot struct {
	CustomerID, Key, TaskID string
	Limit                   int
	Attempt                 int
}

// ReleaseSlot gives TaskID's slot of Key back; Status is the task's
// status, for the record. Before, when not 0, gives back only a slot taken
// for an attempt before it: a retried task at attempt Before frees the
// slot of its last attempt, never one it took for attempt Before itself
// (another process may have released it with that slot already).
type ReleaseSlot struct {
	CustomerID, Key, TaskID string
	Status                  Status
	Before                  int
}

func (AcquireSlot) keyCommand()                      {}
func (ReleaseSlot) keyCommand()                      {}
func (c AcquireSlot) Target() (customer, key string) { return c.CustomerID, c.Key }
func (c ReleaseSlot) Target() (customer, key string) { return c.CustomerID, c.Key }

// DecideKey returns the events cmd appends to key k at time now, or an
// error wrapping ErrKeyFull or ErrInvalid. An empty slice and a nil error
// mean the command is already satisfied: the task holds a slot for the
// attempt or a later one already (AcquireSlot), or holds none, or only
// one for an attempt not before Before (ReleaseSlot). A task holding the
// slot of an earlier attempt is ErrKeyFull until that slot is released.
// Event IDs are left empty for the store to fill in.
func DecideKey(k KeyState, cmd KeyCommand, now time.Time) ([]events.Event, error) {
	customerID, key := cmd.Target()
	if err := ValidConcurrency(events.Concurrency{Key: key, Limit: events.MinConcurrencyLimit}); err != nil {
		return nil, err
	}
	for _, id := range []string{customerID, taskOf(cmd)} {
		if err := events.ValidID(id); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if k.Exists() && (k.CustomerID != customerID || k.Key != key) {
		return nil, fmt.Errorf("%w: key state of %s/%q is not the command's %s/%q", ErrInvalid, k.CustomerID, k.Key, customerID, key)
	}
	var p events.Payload
	switch c := cmd.(type) {
	case AcquireSlot:
		if err := ValidConcurrency(events.Concurrency{Key: key, Limit: c.Limit}); err != nil {
			return nil, err
		}
		attempt := max(c.Attempt, 1)
		switch held := k.HeldFor(c.TaskID); {
		case held >= attempt:
			return nil, nil
		case held > 0:
			return nil, fmt.Errorf("%w: task %s holds the slot of its attempt %d, not yet released", ErrKeyFull, c.TaskID, held)
		case len(k.Holders) >= c.Limit:
			return nil, fmt.Errorf("%w: %d of %d slots held", ErrKeyFull, len(k.Holders), c.Limit)
		}
		p = events.SlotAcquired{Key: key, TaskID: c.TaskID, Limit: c.Limit, Attempt: firstAsZero(attempt)}
	case ReleaseSlot:
		held := k.HeldFor(c.TaskID)
		if held == 0 || c.Before > 0 && held >= c.Before {
			return nil, nil
		}
		p = events.SlotReleased{Key: key, TaskID: c.TaskID, Status: string(c.Status), Attempt: firstAsZero(held)}
	default:
		return nil, fmt.Errorf("%w: unknown key command %T", ErrInvalid, cmd)
	}
	return []events.Event{{TaskID: events.KeyID(customerID, key), CustomerID: customerID, Number: k.Version + 1, At: now, Data: p}}, nil
}

// firstAsZero returns attempt as slot events store it: 0 for the first,
// so they are stored as before retries released slots.
func firstAsZero(attempt int) int {
	if attempt == 1 {
		return 0
	}
	return attempt
}

func taskOf(cmd KeyCommand) string {
	switch c := cmd.(type) {
	case AcquireSlot:
		return c.TaskID
	case ReleaseSlot:
		return c.TaskID
	}
	return ""
}

// ValidConcurrency checks a task's concurrency limit: a key of 1 to
// events.MaxNameBytes bytes and a limit of events.MinConcurrencyLimit to
// events.MaxConcurrencyLimit.
func ValidConcurrency(c events.Concurrency) error {
	switch {
	case c.Key == "" || len(c.Key) > events.MaxNameBytes:
		return fmt.Errorf("%w: concurrency.key must have 1 to %d bytes", ErrInvalid, events.MaxNameBytes)
	case c.Limit < events.MinConcurrencyLimit || c.Limit > events.MaxConcurrencyLimit:
		return fmt.Errorf("%w: concurrency.limit must be %d..%d", ErrInvalid, events.MinConcurrencyLimit, events.MaxConcurrencyLimit)
	}
	return nil
}
