package httpapi

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/service"
)

// sealedPrefix starts a sealed resume token; no plain one (digits and
// "-") does.
const sealedPrefix = "c1."

// maxSealedToken bounds the sealed tokens opened: a nonce, a tag and a
// plain token of up to 64 shards of 20 digits and a dash each.
const maxSealedToken = len(sealedPrefix) + (12+16+64*21)*4/3 + 4

// cursorSeal turns the event stream's resume tokens (the service's
// CursorToken: log sequences, which tell how many events every tenant
// stored) into opaque ones for a customer token, and back: AES-256-GCM
// under ServerConfig.CursorKey, the customer's id as additional data, so
// a token is neither readable, nor forgeable, nor valid for another
// customer. The operator's stay plain. It is safe for concurrent use.
type cursorSeal struct{ aead cipher.AEAD }

// newCursorSeal returns the seal of key (32 bytes); a nil key is a
// random one, whose tokens this handler alone opens.
func newCursorSeal(key []byte) (*cursorSeal, error) {
	if key == nil {
		key = make([]byte, 32)
		rand.Read(key)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("httpapi: CursorKey has %d bytes, want 32", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("httpapi: CursorKey: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("httpapi: CursorKey: %w", err)
	}
	return &cursorSeal{aead: aead}, nil
}

// seal returns the resume token p is given for the plain token: plain
// for the operator, sealed for a customer.
func (s *cursorSeal) seal(p service.Principal, plain string) string {
	if p.IsOperator() {
		return plain
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	rand.Read(nonce)
	return sealedPrefix + base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, []byte(plain), []byte(p.CustomerID)))
}

// open returns the plain token of token, which p sent: a sealed token
// sealed for p, or from the operator also a plain one. A customer may
// send the plain "0" (every event from the log's start), never another
// plain token: resuming from sequences of its choosing would tell it
// where its events lie in the log. ok is false otherwise.
func (s *cursorSeal) open(p service.Principal, token string) (plain string, ok bool) {
	rest, sealed := strings.CutPrefix(token, sealedPrefix)
	if !sealed {
		return token, p.IsOperator() || token == "0"
	}
	if len(token) > maxSealedToken {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(b) < s.aead.NonceSize() {
		return "", false
	}
	out, err := s.aead.Open(nil, b[:s.aead.NonceSize()], b[s.aead.NonceSize():], []byte(p.CustomerID))
	if err != nil {
		return "", false
	}
	return string(out), true
}

// forCaller returns evs as p sees them: a customer token is not shown
// their log sequences (Seq, left out of the JSON), which tell how many
// events other tenants stored in between; the order of evs is the log's.
// It changes evs in place.
func forCaller(p service.Principal, evs []api.Event) []api.Event {
	if !p.IsOperator() {
		for i := range evs {
			evs[i].Seq = 0
		}
	}
	return evs
}
