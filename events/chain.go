package events

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"sync"
)

// Keyed chain errors, returned (wrapped, with the key id) by
// Keyring.Verify; test with errors.Is.
var (
	// ErrUnkeyed: the event carries no chain key id and no MAC: it was
	// written before the log's chain was keyed, or by someone without the
	// key.
	ErrUnkeyed = errors.New("events: event is not keyed")
	// ErrUnknownKey: the event names a chain key id the keyring does not
	// hold (a key lost, not yet copied to this process, or made up).
	ErrUnknownKey = errors.New("events: unknown chain key")
	// ErrBadMAC: the event's MAC is not the HMAC of its bytes under the
	// key it names: it was forged or changed.
	ErrBadMAC = errors.New("events: chain MAC does not verify")
)

// MACSize is the size of a keyed event's MAC: HMAC-SHA256.
const MACSize = sha256.Size

// MinChainKeyBytes is the shortest secret NewKeyring takes.
const MinChainKeyBytes = 32

// ChainKey is one key of the keyed chain: an id (1 or more; 0 means "not
// keyed" in an envelope) and its secret.
type ChainKey struct {
	ID     uint32
	Secret []byte
}

// Keyring holds the chain keys of a log: the newest (highest id) signs
// every event encoded with it, and any of them verifies the events it
// signed. It is immutable and safe for concurrent use; its HMAC states
// are pooled, so signing and verifying allocate nothing.
type Keyring struct {
	keys   map[uint32]*macKey
	signer *macKey
}

// macKey is one key's pool of HMAC states.
type macKey struct {
	id   uint32
	pool sync.Pool // of *macState
}

// macState is a reusable HMAC with room for its sum.
type macState struct {
	h   hash.Hash
	sum [MACSize]byte
}

// NewKeyring returns the keyring of keys: ids unique and above 0, secrets
// at least MinChainKeyBytes long. The highest id signs.
func NewKeyring(keys ...ChainKey) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("events: a keyring needs a key")
	}
	r := &Keyring{keys: make(map[uint32]*macKey, len(keys))}
	for _, k := range keys {
		if k.ID == 0 {
			return nil, errors.New("events: chain key id 0 is reserved for unkeyed events")
		}
		if len(k.Secret) < MinChainKeyBytes {
			return nil, fmt.Errorf("events: chain key %d has %d bytes, at least %d are needed", k.ID, len(k.Secret), MinChainKeyBytes)
		}
		if _, dup := r.keys[k.ID]; dup {
			return nil, fmt.Errorf("events: chain key %d given twice", k.ID)
		}
		secret := append([]byte(nil), k.Secret...)
		mk := &macKey{id: k.ID}
		mk.pool.New = func() any { return &macState{h: hmac.New(sha256.New, secret)} }
		r.keys[k.ID] = mk
		if r.signer == nil || k.ID > r.signer.id {
			r.signer = mk
		}
	}
	return r, nil
}

// Signer returns the id of the key that signs: the highest.
func (r *Keyring) Signer() uint32 { return r.signer.id }

// Fingerprints returns, by key id, a fingerprint of each key: the hex of
// the first 16 bytes of the HMAC, under the key, of a fixed text. It
// names a key (two processes can tell whether they hold the same one)
// without revealing it.
func (r *Keyring) Fingerprints() map[uint32]string {
	fps := make(map[uint32]string, len(r.keys))
	for id, k := range r.keys {
		var sum [MACSize]byte
		k.sign([]byte("taskledger chain key fingerprint"), sum[:])
		fps[id] = hex.EncodeToString(sum[:16])
	}
	return fps
}

// Has reports whether the keyring holds key id.
func (r *Keyring) Has(id uint32) bool {
	_, ok := r.keys[id]
	return ok
}

// AppendEncode is events.AppendEncode of a keyed event: the envelope
// names the signing key (kid) and ends with the HMAC-SHA256, under that
// key, of every byte of the event before the MAC (mac). Errors are
// AppendEncode's.
func (r *Keyring) AppendEncode(dst []byte, ev Event) ([]byte, error) {
	return appendEncode(dst, ev, r.signer)
}

// Verify checks that b, the stored bytes of ev (ev = Decode(b)), are a
// keyed event whose MAC verifies under a key of r. It returns nil, or an
// error wrapping ErrUnkeyed, ErrUnknownKey or ErrBadMAC. Decode has
// already checked that a keyed event's MAC is its last MACSize bytes.
func (r *Keyring) Verify(ev Event, b []byte) error {
	if ev.Key == 0 {
		return ErrUnkeyed
	}
	k := r.keys[ev.Key]
	if k == nil {
		return fmt.Errorf("%w: key id %d", ErrUnknownKey, ev.Key)
	}
	if len(b) < MACSize || !k.verify(b[:len(b)-MACSize], b[len(b)-MACSize:]) {
		return fmt.Errorf("%w: key id %d", ErrBadMAC, ev.Key)
	}
	return nil
}

// sign writes the MAC of msg into out.
func (k *macKey) sign(msg, out []byte) {
	s := k.pool.Get().(*macState)
	s.h.Reset()
	s.h.Write(msg)
	copy(out, s.h.Sum(s.sum[:0]))
	k.pool.Put(s)
}

// verify reports whether mac is the MAC of msg, in constant time.
func (k *macKey) verify(msg, mac []byte) bool {
	s := k.pool.Get().(*macState)
	defer k.pool.Put(s)
	s.h.Reset()
	s.h.Write(msg)
	return hmac.Equal(s.h.Sum(s.sum[:0]), mac)
}
