package replay

import (
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/events"
)

// Kinds of violation of the keyed chain (Chain).
const (
	Unkeyed    = "unkeyed"     // an event without a chain key where every event must have one: forged, or a downgrade
	BadMAC     = "bad_mac"     // an event whose MAC is not the HMAC of its bytes under the key it names: forged or changed
	UnknownKey = "unknown_key" // an event names a chain key the verifier was not given (a key lost, or made up)
)

// Chain is the keyed chain's rule (events/doc.go, "Keyed chain"), the
// one both replay verify and the start-up check apply: from the first
// sequence a part's stream took after its log's chain was keyed, every
// event must be keyed, and every keyed event's MAC must verify under the
// key it names. Before it, an unkeyed event is accepted (its hash link is
// checked as before). Not safe for concurrent use.
type Chain struct {
	keys      *events.Keyring
	keyedFrom map[int]uint64      // part → first stream sequence that must be keyed; absent: every sequence
	unknown   map[uint32]struct{} // key ids reported unknown
}

// NewChain returns the rule for a log whose chain keys are keys (nil: none
// was given) and whose parts' streams held unkeyed events before keyedFrom
// (by part, the first sequence written with a key; a part not in it was
// keyed from its first event). Without keys, unkeyed events are accepted
// everywhere and the first keyed event is reported: it cannot be checked.
func NewChain(keys *events.Keyring, keyedFrom map[int]uint64) *Chain {
	return &Chain{keys: keys, keyedFrom: keyedFrom, unknown: map[uint32]struct{}{}}
}

// Check returns the kind and detail of the violation, if any, of event ev
// decoded from data, stored at stream sequence seq of part; kind "" when
// there is none. A key it does not hold is reported once per key id.
func (c *Chain) Check(part int, seq uint64, ev events.Event, data []byte) (kind, detail string) {
	if ev.Key == 0 {
		from, legacy := c.keyedFrom[part]
		if c.keys == nil || legacy && seq < from {
			return "", ""
		}
		if !legacy {
			from = 1
		}
		return Unkeyed, fmt.Sprintf("event %d of %s has no chain key, and every event of this stream from sequence %d on must have one: written by someone without the key (a forgery, or a downgrade to an unkeyed link)", ev.Number, ev.TaskID, from)
	}
	if c.keys == nil {
		if _, seen := c.unknown[0]; seen {
			return "", ""
		}
		c.unknown[0] = struct{}{}
		return UnknownKey, fmt.Sprintf("event %d of %s is keyed (chain key %d) and no chain key was given: pass the log's key file (--chain-key-file); no keyed event is checked", ev.Number, ev.TaskID, ev.Key)
	}
	err := c.keys.Verify(ev, data)
	switch {
	case err == nil:
		return "", ""
	case errors.Is(err, events.ErrUnknownKey):
		if _, seen := c.unknown[ev.Key]; seen {
			return "", ""
		}
		c.unknown[ev.Key] = struct{}{}
		return UnknownKey, fmt.Sprintf("event %d of %s names chain key %d, which the key file does not hold: a lost key, or a forgery; later events naming it are not reported again", ev.Number, ev.TaskID, ev.Key)
	default:
		return BadMAC, fmt.Sprintf("event %d of %s: %v: forged or changed", ev.Number, ev.TaskID, err)
	}
}
