package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// RunDelta is what one save changed in a task's Run, the object its
// revision Base held becoming the next revision's: transcript items
// appended (after the first Keep of the base's), top-level fields set or
// removed, and members of top-level objects (contexts, effects,
// children) set or removed. Every JSON value in it is canonical
// (Canonical). The JSON names are the wire's (docs/API.md, "Run
// history").
type RunDelta struct {
	// Transcript, when set, replaces the base's transcript by its first
	// Keep items followed by Append.
	Transcript *TranscriptDelta `json:"transcript,omitempty"`
	// Set replaces (or adds) top-level fields, Unset removes them.
	Set   map[string]json.RawMessage `json:"set,omitempty"`
	Unset []string                   `json:"unset,omitempty"`
	// Members changes top-level objects member by member.
	Members map[string]MemberDelta `json:"members,omitempty"`
}

// TranscriptDelta keeps the first Keep transcript items of the base and
// appends Append after them.
type TranscriptDelta struct {
	Keep   int               `json:"keep"`
	Append []json.RawMessage `json:"append,omitempty"`
}

// MemberDelta sets and removes members of one top-level object.
type MemberDelta struct {
	Set   map[string]json.RawMessage `json:"set,omitempty"`
	Unset []string                   `json:"unset,omitempty"`
}

// Canonical returns the canonical bytes of the JSON object doc, the
// bytes a Run revision's digest is taken of: compact, object keys
// sorted at every level, numbers as written, strings as encoding/json
// writes them. It fails on anything but one JSON object.
func Canonical(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("run: data after the object")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf("run: not a JSON object")
	}
	return json.Marshal(v)
}

// RunDigest is the digest a RunSaved records for canonical bytes:
// SHA-256, lowercase hex.
func RunDigest(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// runFields splits canonical object bytes into its top-level fields.
func runFields(doc []byte) (map[string]json.RawMessage, error) {
	m := map[string]json.RawMessage{}
	if len(doc) == 0 {
		return m, nil
	}
	err := json.Unmarshal(doc, &m)
	return m, err
}

// diffRun returns the change from base to next, both canonical objects.
func diffRun(base, next []byte) (RunDelta, error) {
	bf, err := runFields(base)
	if err != nil {
		return RunDelta{}, err
	}
	nf, err := runFields(next)
	if err != nil {
		return RunDelta{}, err
	}
	var d RunDelta
	for _, k := range slices.Sorted(maps.Keys(bf)) {
		if _, ok := nf[k]; !ok {
			d.Unset = append(d.Unset, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(nf)) {
		nv := nf[k]
		bv, had := bf[k]
		if had && bytes.Equal(bv, nv) {
			continue
		}
		if k == "transcript" {
			// An array after none or an array: kept items and new ones.
			bi, ni := []json.RawMessage{}, []json.RawMessage(nil)
			if (!had || json.Unmarshal(bv, &bi) == nil && bi != nil) && json.Unmarshal(nv, &ni) == nil && ni != nil {
				keep := 0
				for keep < len(bi) && keep < len(ni) && bytes.Equal(bi[keep], ni[keep]) {
					keep++
				}
				d.Transcript = &TranscriptDelta{Keep: keep, Append: ni[keep:]}
				continue
			}
		}
		if had && bv[0] == '{' && nv[0] == '{' {
			md, err := diffMembers(bv, nv)
			if err != nil {
				return RunDelta{}, err
			}
			if d.Members == nil {
				d.Members = map[string]MemberDelta{}
			}
			d.Members[k] = md
			continue
		}
		if d.Set == nil {
			d.Set = map[string]json.RawMessage{}
		}
		d.Set[k] = nv
	}
	return d, nil
}

// diffMembers returns the change from object base to object next.
func diffMembers(base, next json.RawMessage) (MemberDelta, error) {
	var bm, nm map[string]json.RawMessage
	if err := json.Unmarshal(base, &bm); err != nil {
		return MemberDelta{}, err
	}
	if err := json.Unmarshal(next, &nm); err != nil {
		return MemberDelta{}, err
	}
	var md MemberDelta
	for _, k := range slices.Sorted(maps.Keys(bm)) {
		if _, ok := nm[k]; !ok {
			md.Unset = append(md.Unset, k)
		}
	}
	for k, v := range nm {
		if b, ok := bm[k]; !ok || !bytes.Equal(b, v) {
			if md.Set == nil {
				md.Set = map[string]json.RawMessage{}
			}
			md.Set[k] = v
		}
	}
	return md, nil
}

// applyRun returns the canonical object base (canonical, or empty for
// none) changed by d.
func applyRun(base []byte, d RunDelta) ([]byte, error) {
	f, err := runFields(base)
	if err != nil {
		return nil, err
	}
	for _, k := range d.Unset {
		delete(f, k)
	}
	maps.Copy(f, d.Set)
	if t := d.Transcript; t != nil {
		var items []json.RawMessage
		if b, ok := f["transcript"]; ok {
			if err := json.Unmarshal(b, &items); err != nil {
				return nil, fmt.Errorf("run transcript: %w", err)
			}
		}
		if t.Keep < 0 || t.Keep > len(items) {
			return nil, fmt.Errorf("run transcript: keeps %d of %d items", t.Keep, len(items))
		}
		items = append(items[:t.Keep:t.Keep], t.Append...)
		if f["transcript"], err = json.Marshal(items); err != nil {
			return nil, err
		}
	}
	for k, md := range d.Members {
		m := map[string]json.RawMessage{}
		if b, ok := f[k]; ok {
			if err := json.Unmarshal(b, &m); err != nil {
				return nil, fmt.Errorf("run %s: %w", k, err)
			}
		}
		for _, u := range md.Unset {
			delete(m, u)
		}
		maps.Copy(m, md.Set)
		if f[k], err = json.Marshal(m); err != nil {
			return nil, err
		}
	}
	return json.Marshal(f)
}
