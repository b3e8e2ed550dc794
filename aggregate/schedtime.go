package aggregate

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/taskledger/taskledger/events"
)

// cronParser reads 5 fields (minute first) or 6 (seconds first), and the
// descriptors (@daily, @hourly, …) but @every, which is the spec's Every.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Timing is when a schedule's instants are. It is a value safe for
// concurrent use.
type Timing struct {
	every time.Duration      // > 0: instants at whole multiples of every since the Unix epoch
	spec  *cron.SpecSchedule // else: the cron expression, matched on the wall clock of loc
	loc   *time.Location
}

// ParseTiming checks a spec's timing fields: exactly one of cron and
// every, every within events.MinEvery..MaxEvery, a cron expression of 5
// or 6 fields (no TZ= prefix: the zone is timezone), a known IANA zone
// (empty: UTC). Errors wrap ErrInvalid.
func ParseTiming(cronExpr, every, timezone string) (Timing, error) {
	if err := maxBytes(field{"cron", cronExpr, events.MaxCronBytes}, field{"timezone", timezone, events.MaxTimezoneBytes},
		field{"every", every, events.MaxNameBytes}); err != nil {
		return Timing{}, err
	}
	if (cronExpr == "") == (every == "") {
		return Timing{}, fmt.Errorf("%w: give exactly one of cron and every", ErrInvalid)
	}
	if every != "" {
		d, err := time.ParseDuration(every)
		if err != nil || d < events.MinEvery || d > events.MaxEvery {
			return Timing{}, fmt.Errorf("%w: every must be a duration from %s to %s (like \"30s\")", ErrInvalid, events.MinEvery, events.MaxEvery)
		}
		if timezone != "" && timezone != "UTC" {
			return Timing{}, fmt.Errorf("%w: timezone applies to cron only", ErrInvalid)
		}
		return Timing{every: d, loc: time.UTC}, nil
	}
	loc := time.UTC
	if timezone != "" {
		// LoadLocation also reads a file path: only zone names pass.
		if strings.HasPrefix(timezone, "/") || strings.Contains(timezone, "..") || timezone == "Local" {
			return Timing{}, fmt.Errorf("%w: unknown timezone %q", ErrInvalid, timezone)
		}
		l, err := time.LoadLocation(timezone)
		if err != nil {
			return Timing{}, fmt.Errorf("%w: unknown timezone %q", ErrInvalid, timezone)
		}
		loc = l
	}
	if strings.HasPrefix(cronExpr, "TZ=") || strings.HasPrefix(cronExpr, "CRON_TZ=") {
		return Timing{}, fmt.Errorf("%w: cron: give the zone as timezone", ErrInvalid)
	}
	s, err := cronParser.Parse(cronExpr)
	if err != nil {
		return Timing{}, fmt.Errorf("%w: cron: %v", ErrInvalid, err)
	}
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return Timing{}, fmt.Errorf("%w: cron: @every is not a cron expression; use every", ErrInvalid)
	}
	spec.Location = time.UTC // matched on wall clocks written as UTC (below)
	return Timing{spec: spec, loc: loc}, nil
}

// Next returns the first instant after t, or the zero time when there is
// none within five years (a cron expression like "0 0 30 2 *").
//
// A cron expression is matched on the wall clock of the zone: every wall
// time it names fires once. A wall time that a daylight-saving change
// repeats (the fall-back hour) fires at its first occurrence only; one that
// the change skips (the spring-forward gap, 02:30 in Europe/Berlin on the
// last Sunday of March) fires at the change itself (03:00 local), once,
// however many instants of the gap the expression names.
func (tm Timing) Next(t time.Time) time.Time {
	if tm.every > 0 {
		n := t.UnixNano()
		d := int64(tm.every)
		next := n - n%d + d
		if n < 0 && n%d != 0 {
			next -= d
		}
		return time.Unix(0, next).UTC()
	}
	if tm.spec == nil {
		return time.Time{}
	}
	w := wallOf(t.In(tm.loc))
	// Each round passes over one wall time of a gap or of a repeated hour
	// (a seconds field can name 7,200 of them).
	for range 8192 {
		if w = tm.spec.Next(w); w.IsZero() {
			return time.Time{}
		}
		at, ok, after := tm.instant(w, t)
		if ok {
			return at.UTC()
		}
		if !after.IsZero() {
			w = after
		}
	}
	return time.Time{}
}

// wallOf writes t's wall clock as a UTC time.
func wallOf(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

// instant is the first instant after t whose wall clock in the zone is w,
// or, for a w the zone skips, the instant the zone jumped over it. When
// that jump is not after t, the gap is over: resume is the wall clock
// after it to match from.
func (tm Timing) instant(w, t time.Time) (at time.Time, ok bool, resume time.Time) {
	at = time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), tm.loc)
	if !wallOf(at).Equal(w) { // in a gap: fire when the zone changed
		start, _ := at.ZoneBounds()
		if start.After(t) {
			return start, true, time.Time{}
		}
		return time.Time{}, false, wallOf(start.In(tm.loc))
	}
	// A repeated wall time: the earliest occurrence after t.
	best := time.Time{}
	for _, d := range []time.Duration{-2 * time.Hour, -time.Hour, -30 * time.Minute, 0, 30 * time.Minute, time.Hour, 2 * time.Hour} {
		c := at.Add(d)
		if wallOf(c).Equal(w) && c.After(t) && (best.IsZero() || c.Before(best)) {
			best = c
		}
	}
	if best.IsZero() {
		return time.Time{}, false, time.Time{}
	}
	// Only the first occurrence of a repeated wall time fires.
	for _, d := range []time.Duration{30 * time.Minute, time.Hour, 2 * time.Hour} {
		if wallOf(best.Add(-d)).Equal(w) {
			return time.Time{}, false, time.Time{}
		}
	}
	return best, true, time.Time{}
}
