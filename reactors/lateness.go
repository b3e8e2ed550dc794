package reactors

import (
	"slices"
	"sync"
	"time"

	"github.com/taskledger/taskledger/projections"
)

// The bounds of a LatenessWindow: it keeps the last LatenessSamples
// actions of each timer queue, of which Summary counts those of the last
// LatenessAge.
const (
	LatenessSamples = 256
	LatenessAge     = 5 * time.Minute
)

// LatenessWindow keeps how late the alarm acted on its recent timers, as
// AlarmConfig.Observe reports them, for GET /v1/stats: constant memory,
// whatever the load. It is safe for concurrent use.
type LatenessWindow struct {
	now   func() time.Time
	mu    sync.Mutex
	rings [projections.NumTimers]latenessRing
}

// latenessRing holds one timer queue's last LatenessSamples actions.
type latenessRing struct {
	at   [LatenessSamples]int64 // Unix ns when observed; 0 for an empty slot
	late [LatenessSamples]time.Duration
	next int
}

// NewLatenessWindow returns an empty window on the clock now (nil:
// time.Now).
func NewLatenessWindow(now func() time.Time) *LatenessWindow {
	if now == nil {
		now = time.Now
	}
	return &LatenessWindow{now: now}
}

// Observe records one action of timer queue t, late after its due time;
// its signature is AlarmConfig.Observe's. A negative lateness (acted
// early, on a clock step) counts as 0.
func (w *LatenessWindow) Observe(t projections.Timer, late time.Duration, _ error) {
	if t < 0 || t >= projections.NumTimers {
		return
	}
	at := w.now().UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	r := &w.rings[t]
	r.at[r.next], r.late[r.next] = at, max(late, 0)
	r.next = (r.next + 1) % LatenessSamples
}

// Lateness summarises the lateness of some of the alarm's actions.
type Lateness struct {
	Samples       int
	P50, P99, Max time.Duration
}

// Summary returns the lateness of the actions of the last LatenessAge
// kept, over every timer queue (all) and per queue (indexed by
// projections.Timer).
func (w *LatenessWindow) Summary() (all Lateness, byTimer [projections.NumTimers]Lateness) {
	since := w.now().Add(-LatenessAge).UnixNano()
	var every []time.Duration
	w.mu.Lock()
	defer w.mu.Unlock()
	for t := range w.rings {
		r := &w.rings[t]
		var lates []time.Duration
		for i, at := range r.at {
			if at != 0 && at >= since {
				lates = append(lates, r.late[i])
			}
		}
		byTimer[t] = summarise(lates)
		every = append(every, lates...)
	}
	return summarise(every), byTimer
}

// summarise sorts lates and reads its nearest-rank percentiles.
func summarise(lates []time.Duration) Lateness {
	if len(lates) == 0 {
		return Lateness{}
	}
	slices.Sort(lates)
	rank := func(p int) time.Duration { return lates[(len(lates)*p+99)/100-1] }
	return Lateness{Samples: len(lates), P50: rank(50), P99: rank(99), Max: lates[len(lates)-1]}
}
