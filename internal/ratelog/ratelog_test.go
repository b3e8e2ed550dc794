package ratelog

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/taskledger/taskledger/internal/testlog"
)

// entries returns the JSON lines written to sink so far.
func entries(t *testing.T, sink *testlog.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range sink.Lines() {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// waitFor polls until cond holds, failing after 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func setup(t *testing.T, interval time.Duration) (*Limiter, *testlog.Buffer) {
	t.Helper()
	var sink testlog.Buffer
	return New(zerolog.New(&sink), interval), &sink
}

func (l *Limiter) known(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.keys[key]
	return ok
}

func TestFirstInFullThenOneCount(t *testing.T) {
	t.Parallel()
	l, sink := setup(t, 100*time.Millisecond)
	for i := range 100 {
		l.Log(zerolog.ErrorLevel, "503 POST /v1/tasks", "request failed", func(e *zerolog.Event) { e.Int("n", i) })
	}
	got := entries(t, sink)
	if len(got) == 0 || got[0]["n"] != 0.0 || got[0]["level"] != "error" || got[0]["message"] != "request failed" {
		t.Fatalf("first line %v, want the first event in full", got)
	}
	// The 99 others come as counts, and nothing is lost: all of them
	// are in the summaries once the key is forgotten.
	waitFor(t, "the key to be forgotten", func() bool { return !l.known("503 POST /v1/tasks") })
	got = entries(t, sink)
	repeats := 0
	for _, e := range got[1:] {
		if _, full := e["n"]; full {
			t.Fatalf("a repeat logged in full: %v", e)
		}
		if e["level"] != "error" || !strings.Contains(e["message"].(string), "more like this") {
			t.Fatalf("summary line %v", e)
		}
		repeats += int(e["repeats"].(float64))
	}
	if repeats != 99 {
		t.Fatalf("summaries count %d repeats, want 99 (lines %v)", repeats, got)
	}
	// Quiet for an interval: the next event is logged in full again.
	l.Log(zerolog.ErrorLevel, "503 POST /v1/tasks", "request failed", func(e *zerolog.Event) { e.Int("n", 100) })
	if got := entries(t, sink); got[len(got)-1]["n"] != 100.0 {
		t.Fatalf("after a quiet interval the event was not logged in full: %v", got[len(got)-1])
	}
}

func TestKeysApart(t *testing.T) {
	t.Parallel()
	l, sink := setup(t, time.Hour)
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Go(func() {
			key := []string{"a", "b"}[i%2]
			l.Log(zerolog.WarnLevel, key, "refused "+key, nil)
		})
	}
	wg.Wait()
	got := entries(t, sink)
	if len(got) != 2 || got[0]["repeatKey"] == got[1]["repeatKey"] {
		t.Fatalf("1,000 events of two keys logged %d lines, want one per key: %v", len(got), got)
	}
}

func TestCloseFlushes(t *testing.T) {
	t.Parallel()
	l, sink := setup(t, time.Hour)
	for range 10 {
		l.Log(zerolog.ErrorLevel, "k", "failed", nil)
	}
	l.Close()
	got := entries(t, sink)
	if len(got) != 2 || got[1]["repeats"] != 9.0 {
		t.Fatalf("after Close: %v, want the first line and a count of 9", got)
	}
	l.Log(zerolog.ErrorLevel, "k", "failed", nil)
	l.Log(zerolog.ErrorLevel, "k", "failed", nil)
	l.Close()
	if got := entries(t, sink); len(got) != 4 {
		t.Fatalf("after Close every event is logged: %v", got)
	}
}
