package aggregate

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/taskledger/taskledger/events"
)

// ValidateKind checks a task's kind: empty (none) or events.ValidKind.
// It fails with ErrInvalid.
func ValidateKind(kind string) error {
	if kind != "" && !events.ValidKind(kind) {
		return fmt.Errorf("%w: kind %q must be 1 to %d bytes of [a-z0-9._-], starting with a letter or digit",
			ErrInvalid, events.Truncate(kind, events.MaxKindBytes+1), events.MaxKindBytes)
	}
	return nil
}

// CompactJSON returns raw, a task's payload or a result's output (name
// says which), as compact JSON: nil for none (empty, or JSON null). It
// fails with ErrInvalid when raw is not one JSON value, and with
// ErrTooLarge when its compact form has more than limit bytes. The
// aggregate stores what it returns, so equal values store equal bytes.
func CompactJSON(name string, raw json.RawMessage, limit int) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, fmt.Errorf("%w: %s is not JSON: %v", ErrInvalid, name, err)
	}
	switch {
	case b.String() == "null":
		return nil, nil
	case b.Len() > limit:
		return nil, fmt.Errorf("%w: %s is %d bytes of compact JSON, more than %d", ErrTooLarge, name, b.Len(), limit)
	}
	return b.Bytes(), nil
}

// compactSpec returns spec with its payload compact (CompactJSON).
func compactSpec(spec events.TaskSpec) (events.TaskSpec, error) {
	p, err := CompactJSON("payload", spec.Payload, events.MaxPayloadBytes)
	spec.Payload = p
	return spec, err
}

// compactResult returns r with its output compact (CompactJSON).
func compactResult(r events.Result) (events.Result, error) {
	o, err := CompactJSON("output", r.Output, events.MaxOutputBytes)
	r.Output = o
	return r, err
}
