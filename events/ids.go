package events

// The identifiers taskledger hands out: time-ordered random ids (ULIDs)
// and ids derived deterministically from other ids.

import (
	"crypto/sha256"
	"math/rand/v2"
	"time"
)

// crockford is the base32 alphabet of ULIDs: no I, L, O or U.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// NewID returns a 26-character ULID: 48 bits of milliseconds since the Unix
// epoch and 80 random bits, so ids sort by creation time. It is safe for
// concurrent use.
func NewID() string { return newIDAt(time.Now()) }

func newIDAt(t time.Time) string {
	var b [26]byte
	ms := uint64(t.UnixMilli())
	for i := 9; i >= 0; i-- {
		b[i] = crockford[ms&31]
		ms >>= 5
	}
	hi, lo := rand.Uint64()&(1<<40-1), rand.Uint64()&(1<<40-1)
	for i := 25; i >= 18; i-- {
		b[i] = crockford[lo&31]
		lo >>= 5
	}
	for i := 17; i >= 10; i-- {
		b[i] = crockford[hi&31]
		hi >>= 5
	}
	return string(b[:])
}

// DeriveID returns a 26-character id fixed by parts: the same parts always
// give the same id, so a retried request (same customer and request id,
// same parent and delegation key) names the same task. prefix is kept in
// front so derived ids are recognisable; it must be a valid id itself.
func DeriveID(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	sum := h.Sum(nil)
	b := make([]byte, 0, len(prefix)+26)
	b = append(b, prefix...)
	var acc uint64
	bits := 0
	for _, c := range sum {
		acc = acc<<8 | uint64(c)
		bits += 8
		for bits >= 5 && len(b) < len(prefix)+26 {
			bits -= 5
			b = append(b, crockford[(acc>>uint(bits))&31])
		}
	}
	return string(b)
}

// KeyID is the id of a customer's concurrency key: the last token of its
// subject (Subjects.Key), and the TaskID of its events.
func KeyID(customerID, key string) string { return DeriveID("k", customerID, key) }
