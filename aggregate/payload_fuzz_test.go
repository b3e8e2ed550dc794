package aggregate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
)

// FuzzCompactJSON: whatever a client sends as a payload, CompactJSON
// answers compact JSON within the limit (nil for none), ErrInvalid for
// what is not one JSON value, or ErrTooLarge; its answer is a fixed point.
func FuzzCompactJSON(f *testing.F) {
	for _, s := range []string{`{"w": 640}`, " null ", "", "{", `"ü"`, `[1, 2, {"a": [true, false, null]}]`, `1 2`, `"` + "\xff" + `"`} {
		f.Add([]byte(s))
	}
	const limit = 64
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := aggregate.CompactJSON("payload", raw, limit)
		switch {
		case errors.Is(err, aggregate.ErrInvalid):
			if json.Valid(raw) {
				t.Fatalf("%q is JSON but refused: %v", raw, err)
			}
			return
		case errors.Is(err, aggregate.ErrTooLarge):
			return
		case err != nil:
			t.Fatalf("%q: unexpected error %v", raw, err)
		}
		if got == nil {
			if trimmed := bytes.TrimSpace(raw); len(trimmed) != 0 && string(trimmed) != "null" {
				t.Fatalf("%q answered none", raw)
			}
			return
		}
		if len(got) > limit || !json.Valid(got) {
			t.Fatalf("%q answered %q: not JSON within %d bytes", raw, got, limit)
		}
		if again, err := aggregate.CompactJSON("payload", got, limit); err != nil || !bytes.Equal(again, got) {
			t.Fatalf("compacting %q again answered %q, %v", got, again, err)
		}
	})
}
