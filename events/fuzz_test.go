package events

import (
	"errors"
	"reflect"
	"regexp"
	"testing"
)

func FuzzDecode(f *testing.F) {
	for _, p := range samplePayloads() {
		b, err := Encode(sampleEvent(p))
		if err != nil {
			f.Fatalf("Encode(%s): %v", p.EventType(), err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	keys, err := NewKeyring(ChainKey{ID: 3, Secret: make([]byte, MinChainKeyBytes)})
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range samplePayloads()[:3] { // keyed: kid and a trailing mac
		b, err := keys.AppendEncode(nil, sampleEvent(p))
		if err != nil {
			f.Fatalf("AppendEncode(%s): %v", p.EventType(), err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add(rawEnvelope(f, validWire(f)))
	for _, b := range [][]byte{nil, {}, []byte("garbage"), {0xc1}, {0xc0}, {0x80}, {0x90}, {0xff, 0xff, 0xff}, {0xdf, 0xff, 0xff, 0xff, 0xff}, []byte("\x88\xa2at\xc0")} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnknownType) && !errors.Is(err, ErrUnknownVersion) {
				t.Fatalf("Decode error %v wraps none of the documented sentinels", err)
			}
			return
		}
		b2, err := Encode(ev)
		if err != nil {
			t.Fatalf("Encode of a decoded event %+v: %v", ev, err)
		}
		ev2, err := Decode(b2)
		if err != nil {
			t.Fatalf("Decode of a re-encoded event %+v: %v", ev, err)
		}
		// Encode writes the type's current version: a v1 event comes back
		// as v2 (TaskScheduled as v3).
		if ev.ID != ev2.ID || wireVersion(ev2.Version) != versionOf(ev.Type()) || ev.Prev != ev2.Prev || ev.TaskID != ev2.TaskID ||
			ev.CustomerID != ev2.CustomerID || ev.Actor != ev2.Actor || ev.Seq != ev2.Seq || !ev.At.Equal(ev2.At) {
			t.Fatalf("envelope changed on re-encode\nfirst:  %+v\nsecond: %+v", ev, ev2)
		}
		if ev.Type() != ev2.Type() {
			t.Fatalf("type changed on re-encode: %s then %s", ev.Type(), ev2.Type())
		}
		if p1, p2 := utc(ev).Data, utc(ev2).Data; !reflect.DeepEqual(p1, p2) {
			t.Fatalf("payload changed on re-encode\nfirst:  %#v\nsecond: %#v", p1, p2)
		}
	})
}

var validIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func FuzzValidID(f *testing.F) {
	for _, s := range []string{"", "a", "a.b", "*", ">", "a b", "tâche", "_-", "\xff", "a\n",
		"0123456789012345678901234567890123456789012345678901234567890123",
		"01234567890123456789012345678901234567890123456789012345678901234"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidID(s)
		if want := validIDPattern.MatchString(s); (err == nil) != want {
			t.Fatalf("ValidID(%q) = %v, pattern match = %v", s, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidID) {
			t.Fatalf("ValidID(%q) = %v, want ErrInvalidID", s, err)
		}
	})
}
