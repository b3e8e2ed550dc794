// Package ratelog logs repeated identical errors once, then as one
// summary line per interval with a count, instead of one line each.
package ratelog

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultInterval is the summary interval of a zero Config.Interval.
const DefaultInterval = 10 * time.Second

// Limiter logs the first event of a key in full, counts the ones that
// follow, and logs "N more like this" once per interval while they keep
// coming. A key quiet for a whole interval is forgotten, so its next event
// is logged in full again. It is safe for concurrent use; its timers need
// no Stop.
type Limiter struct {
	log      zerolog.Logger
	interval time.Duration
	mu       sync.Mutex
	keys     map[string]*repeats
}

// repeats counts the events of one key since its last line.
type repeats struct {
	level zerolog.Level
	msg   string
	count int
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
// one is kept until it is quiet for an interval.
func (l *Limiter) Log(level zerolog.Level, key, msg string, fill func(*zerolog.Event)) {
	l.mu.Lock()
	if r, ok := l.keys[key]; ok {
		r.count++
		l.mu.Unlock()
		return
	}
	l.keys[key] = &repeats{level: level, msg: msg}
	l.mu.Unlock()
	ev := l.log.WithLevel(level)
	if fill != nil {
		fill(ev)
	}
	ev.Str("repeatKey", key).Msg(msg)
	l.arm(key)
}

func (l *Limiter) arm(key string) {
	time.AfterFunc(l.interval, func() { l.summarize(key) })
}

// summarize logs the count of key's events since its last line, or
// forgets the key if there were none.
func (l *Limiter) summarize(key string) {
	l.mu.Lock()
	r := l.keys[key]
	n := r.count
	r.count = 0
	if n == 0 {
		delete(l.keys, key)
	}
	l.mu.Unlock()
	if n == 0 {
		return
	}
	l.log.WithLevel(r.level).Str("repeatKey", key).Int("repeats", n).Dur("interval", l.interval).
		Msgf("%s: %d more like this", r.msg, n)
	l.arm(key)
}
