package events_test

import (
	"testing"

	"github.com/taskledger/taskledger/events"
)

func TestTruncate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 3, "abc"},
		{"abc", 2, "ab"},
		{"abc", 0, ""},
		{"abc", -1, ""},
		{"aé", 2, "a"}, // é is two bytes: not split
		{"aé", 3, "aé"},
		{"日本", 5, "日"},
		{"日本", 2, ""},
	} {
		if got := events.Truncate(tt.s, tt.n); got != tt.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

func TestValidKind(t *testing.T) {
	t.Parallel()
	long := "a"
	for len(long) < events.MaxKindBytes {
		long += "b"
	}
	for k, want := range map[string]bool{
		"resize": true, "image.resize-v2_x": true, "0": true, long: true,
		"": false, long + "c": false, "Resize": false, ".resize": false, "-x": false, "a/b": false, "a b": false, "ré": false,
	} {
		if got := events.ValidKind(k); got != want {
			t.Errorf("ValidKind(%q) = %v, want %v", k, got, want)
		}
	}
}
