package events

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func testKeyring(t *testing.T, ids ...uint32) *Keyring {
	t.Helper()
	keys := make([]ChainKey, len(ids))
	for i, id := range ids {
		keys[i] = ChainKey{ID: id, Secret: bytes.Repeat([]byte{byte(id)}, MinChainKeyBytes)}
	}
	kr, err := NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func chainEvent() Event {
	return Event{ID: NewID(), TaskID: "task-1", CustomerID: "cust-1", Number: 2,
		At: time.Date(2026, 12, 4, 18, 0, 0, 0, time.UTC), Actor: "scheduler",
		Prev: HashOf([]byte("previous")), Data: Canceled{Reason: "test"}}
}

func TestKeyedEventRoundTrip(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, 1, 2)
	if kr.Signer() != 2 {
		t.Fatalf("signer %d, want the highest id 2", kr.Signer())
	}
	ev := chainEvent()
	prefix := []byte("earlier bytes")
	b, err := kr.AppendEncode(append([]byte(nil), prefix...), ev)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, prefix) {
		t.Fatal("AppendEncode lost dst")
	}
	b = b[len(prefix):]
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != 2 || got.Prev != ev.Prev || got.Data != ev.Data {
		t.Fatalf("decoded key %d prev %x data %v", got.Key, got.Prev, got.Data)
	}
	if err := kr.Verify(got, b); err != nil {
		t.Fatalf("a keyed event does not verify: %v", err)
	}
	// An older keyring that holds key 2 too verifies it; one without it
	// names the key.
	if err := testKeyring(t, 2).Verify(got, b); err != nil {
		t.Fatal(err)
	}
	if err := testKeyring(t, 1).Verify(got, b); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("verify without the signing key: %v, want ErrUnknownKey", err)
	}
}

func TestKeyedEventForgeries(t *testing.T) {
	t.Parallel()
	kr := testKeyring(t, 1)
	ev := chainEvent()
	// Unkeyed: an event with the right unkeyed link, as anyone can write.
	plain, err := Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(plain)
	if err != nil {
		t.Fatal(err)
	}
	if err := kr.Verify(got, plain); !errors.Is(err, ErrUnkeyed) {
		t.Fatalf("unkeyed: %v, want ErrUnkeyed", err)
	}
	// Signed with another secret under the same id.
	other, err := NewKeyring(ChainKey{ID: 1, Secret: bytes.Repeat([]byte{9}, MinChainKeyBytes)})
	if err != nil {
		t.Fatal(err)
	}
	forged, err := other.AppendEncode(nil, ev)
	if err != nil {
		t.Fatal(err)
	}
	if got, err = Decode(forged); err != nil {
		t.Fatal(err)
	}
	if err := kr.Verify(got, forged); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("wrong secret: %v, want ErrBadMAC", err)
	}
	// A signed event with one byte changed before its MAC.
	good, err := kr.AppendEncode(nil, ev)
	if err != nil {
		t.Fatal(err)
	}
	changed := bytes.Replace(good, []byte("test"), []byte("tesT"), 1)
	if got, err = Decode(changed); err != nil {
		t.Fatal(err)
	}
	if err := kr.Verify(got, changed); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("changed payload: %v, want ErrBadMAC", err)
	}
}

func TestKeyedEventMalformed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		edit func(*wire)
	}{
		{"KeyWithoutMAC", func(w *wire) { w.Key = 1 }},
		{"ShortMAC", func(w *wire) { w.Key, w.MAC = 1, make([]byte, 31) }},
		{"MACWithoutKey", func(w *wire) { w.MAC = make([]byte, MACSize) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := validWire(t)
			c.edit(&w)
			b := rawEnvelope(t, w)
			if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("decode: %v, want ErrMalformed", err)
			}
		})
	}
}

func TestNewKeyringRefuses(t *testing.T) {
	t.Parallel()
	long := make([]byte, MinChainKeyBytes)
	for name, keys := range map[string][]ChainKey{
		"None":      nil,
		"IDZero":    {{ID: 0, Secret: long}},
		"Short":     {{ID: 1, Secret: long[:16]}},
		"Duplicate": {{ID: 1, Secret: long}, {ID: 1, Secret: long}},
	} {
		if _, err := NewKeyring(keys...); err == nil {
			t.Errorf("%s: NewKeyring took %v", name, keys)
		}
	}
}

// TestKeyedEncodeAllocates checks that signing costs no allocation beyond
// an unkeyed encode into a reused buffer.
func TestKeyedEncodeAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	kr := testKeyring(t, 1)
	ev := chainEvent()
	buf := make([]byte, 0, 1024)
	plain := testing.AllocsPerRun(100, func() { _, _ = AppendEncode(buf[:0], ev) })
	keyed := testing.AllocsPerRun(100, func() { _, _ = kr.AppendEncode(buf[:0], ev) })
	if keyed > plain {
		t.Fatalf("a keyed encode allocates %.0f times, an unkeyed one %.0f", keyed, plain)
	}
}
