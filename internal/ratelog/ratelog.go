// Package ratelog logs repeated identical errors once, then as one
// summary line per interval with a count, instead of one line each.
package ratelog

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultInterval is the summary interval of New with interval ≤ 0.
const DefaultInterval = 10 * time.Second

// Limiter logs the first event of a key in full, counts the ones that
// follow, and logs "N more like this" once per interval while they keep
// coming. A key quiet for a whole interval is forgotten, so its next event
// is logged in full again. It is safe for concurrent use. Close it when
// its logger goes away.
type Limiter struct {
	log      zerolog.Logger
	interval time.Duration
	mu       sync.Mutex
	keys     map[string]*repeats
	closed   bool
}

// repeats counts the events of one key since its last line.
type repeats struct {
	level zerolog.Level
	msg   string
	count int
	timer *time.Timer // summarizes the key at the end of its interval
}

// New returns a Limiter writing to log; interval ≤ 0 means
// DefaultInterval.
func New(log zerolog.Logger, interval time.Duration) *Limiter {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Limiter{log: log, interval: interval, keys: map[string]*repeats{}}
}

// Log logs msg at level with the fields fill adds, unless an event of key
// was logged less than an interval ago: then it only counts it. Keys must
// come from a small set (a route and an error code, not a task id): each
// one is kept until it is quiet for an interval. After Close every event
// is logged in full.
func (l *Limiter) Log(level zerolog.Level, key, msg string, fill func(*zerolog.Event)) {
	l.mu.Lock()
	if r, ok := l.keys[key]; ok {
		r.count++
		l.mu.Unlock()
		return
	}
	if !l.closed {
		l.keys[key] = &repeats{level: level, msg: msg, timer: time.AfterFunc(l.interval, func() { l.summarize(key) })}
	}
	l.mu.Unlock()
	ev := l.log.WithLevel(level)
	if fill != nil {
		fill(ev)
	}
	ev.Str("repeatKey", key).Msg(msg)
}

// Close logs the counts not yet summarized and stops the timers. It is
// idempotent.
func (l *Limiter) Close() {
	l.mu.Lock()
	pending := l.keys
	l.keys, l.closed = map[string]*repeats{}, true
	l.mu.Unlock()
	for key, r := range pending {
		r.timer.Stop()
		l.write(key, r.level, r.msg, r.count)
	}
}

// summarize logs the count of key's events since its last line, or
// forgets the key if there were none.
func (l *Limiter) summarize(key string) {
	l.mu.Lock()
	r, ok := l.keys[key]
	if !ok { // closed meanwhile
		l.mu.Unlock()
		return
	}
	n := r.count
	r.count = 0
	if n == 0 {
		delete(l.keys, key)
	} else {
		r.timer.Reset(l.interval)
	}
	l.mu.Unlock()
	l.write(key, r.level, r.msg, n)
}

// write logs the summary of n repeats of key, if any.
func (l *Limiter) write(key string, level zerolog.Level, msg string, n int) {
	if n == 0 {
		return
	}
	l.log.WithLevel(level).Str("repeatKey", key).Int("repeats", n).Dur("interval", l.interval).
		Msgf("%s: %d more like this", msg, n)
}
