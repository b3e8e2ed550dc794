package httpapi

import (
	"strings"
	"testing"

	"github.com/taskledger/taskledger/internal/service"
)

// TestCursorSeal: a customer's token is sealed and opens for it alone;
// the operator's stays plain; a customer may send the plain "0" and no
// other plain token.
func TestCursorSeal(t *testing.T) {
	t.Parallel()
	s, err := newCursorSeal(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	a, b := service.Principal{CustomerID: "A"}, service.Principal{CustomerID: "B"}
	plain := "18446744073709551-17-30"
	sealed := s.seal(a, plain)
	if !strings.HasPrefix(sealed, sealedPrefix) || strings.Contains(sealed, plain) {
		t.Fatalf("sealed %q", sealed)
	}
	if again := s.seal(a, plain); again == sealed {
		t.Fatal("two seals of one token are equal: the nonce repeats")
	}
	if got, ok := s.open(a, sealed); !ok || got != plain {
		t.Fatalf("open: %q %v", got, ok)
	}
	for name, tc := range map[string]struct {
		p     service.Principal
		token string
	}{
		"OtherCustomer": {b, sealed}, "Operator": {service.Operator, sealed}, "Plain": {a, "17"},
		"Cut": {a, sealed[:len(sealed)-1]}, "Empty": {a, sealedPrefix}, "Long": {a, sealedPrefix + strings.Repeat("A", maxSealedToken)},
	} {
		if got, ok := s.open(tc.p, tc.token); ok {
			t.Errorf("%s: opened as %q", name, got)
		}
	}
	if got, ok := s.open(a, "0"); !ok || got != "0" {
		t.Errorf("a customer's 0: %q %v", got, ok)
	}
	if got := s.seal(service.Operator, plain); got != plain {
		t.Errorf("the operator's token sealed: %q", got)
	}
	if _, err := newCursorSeal(make([]byte, 16)); err == nil {
		t.Error("a 16-byte key was taken")
	}
	// The longest token of the longest log (64 shards) opens.
	long := strings.TrimSuffix(strings.Repeat("18446744073709551615-", 64), "-")
	if got, ok := s.open(a, s.seal(a, long)); !ok || got != long {
		t.Errorf("a 64-shard token: %v", ok)
	}
}

// BenchmarkCursorSeal is the cost a customer's stream adds per event
// (seal) and per resume (open).
func BenchmarkCursorSeal(b *testing.B) {
	s, _ := newCursorSeal(nil)
	p := service.Principal{CustomerID: "acme"}
	for b.Loop() {
		if _, ok := s.open(p, s.seal(p, "123456789")); !ok {
			b.Fatal("not opened")
		}
	}
}
