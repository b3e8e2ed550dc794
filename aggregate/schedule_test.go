package aggregate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

const schedID = "nightly"

func schedSpec(mod func(*events.ScheduleSpec)) events.ScheduleSpec {
	s := events.ScheduleSpec{Every: "10s", Timezone: "UTC", Overlap: events.OverlapSkip, Catchup: events.CatchupOne,
		Task: events.TaskSpec{Queue: "default", TimeoutSeconds: 60, Message: events.Message{Content: []events.ContentPart{{Type: "text", Text: "triage"}}}}}
	if mod != nil {
		mod(&s)
	}
	return s
}

// decideAll applies each decision's events to s, as the store would.
func decideSched(t *testing.T, s aggregate.ScheduleState, cmd aggregate.Command, now time.Time) (aggregate.ScheduleState, []events.Event, error) {
	t.Helper()
	evs, err := aggregate.DecideSchedule(s, cmd, now)
	for _, ev := range evs {
		if ev.Number != s.Version+1 {
			t.Fatalf("event number %d after version %d", ev.Number, s.Version)
		}
		s = aggregate.ApplySchedule(s, ev)
	}
	return s, evs, err
}

func fired(t *testing.T, evs []events.Event) events.ScheduleFired {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("%d events, want one ScheduleFired", len(evs))
	}
	f, ok := evs[0].Data.(events.ScheduleFired)
	if !ok {
		t.Fatalf("%T, want ScheduleFired", evs[0].Data)
	}
	return f
}

func TestScheduleLifecycle(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC)
	s, evs, err := decideSched(t, aggregate.ScheduleState{}, aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: schedSpec(nil)}, created)
	if err != nil || len(evs) != 1 || evs[0].Type() != events.TypeScheduleCreated {
		t.Fatalf("create: %v %v", evs, err)
	}
	if got, want := s.Next(), created.Add(7*time.Second); !got.Equal(want) {
		t.Fatalf("next %v, want %v", got, want)
	}
	// The same spec again is satisfied; another one updates.
	if _, evs, err = decideSched(t, s, aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: schedSpec(nil)}, created); err != nil || len(evs) != 0 {
		t.Fatalf("repeat: %v %v", evs, err)
	}
	// Not due yet: stale.
	if _, _, err = decideSched(t, s, aggregate.FireSchedule{}, created.Add(time.Second)); !errors.Is(err, aggregate.ErrStale) {
		t.Fatalf("early fire: %v", err)
	}
	at := created.Add(7 * time.Second)
	s, evs, err = decideSched(t, s, aggregate.FireSchedule{}, at.Add(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	f := fired(t, evs)
	if !f.At.Equal(at) || f.RequestID != events.ScheduleRequestID(schedID, at) || f.TaskID != events.DeriveID("r", custID, f.RequestID) || f.Missed != 0 {
		t.Fatalf("fired %+v", f)
	}
	// The same instant again (a second process) is stale.
	if _, _, err = decideSched(t, s, aggregate.FireSchedule{}, at.Add(5*time.Millisecond)); !errors.Is(err, aggregate.ErrStale) {
		t.Fatalf("second fire of one instant: %v", err)
	}
	// Overlap skip: the previous run is live.
	s, evs, err = decideSched(t, s, aggregate.FireSchedule{PrevLive: true}, at.Add(10*time.Second))
	if f := fired(t, evs); err != nil || f.Skipped != "overlap" || f.TaskID != "" {
		t.Fatalf("overlap: %+v %v", f, err)
	}
	// Paused: fires are stale, a trigger still runs and does not move Last.
	s, _, _ = decideSched(t, s, aggregate.PauseSchedule{}, at.Add(11*time.Second))
	if _, _, err = decideSched(t, s, aggregate.FireSchedule{}, at.Add(time.Hour)); !errors.Is(err, aggregate.ErrStale) {
		t.Fatalf("paused fire: %v", err)
	}
	last := s.Last
	s, evs, err = decideSched(t, s, aggregate.TriggerSchedule{}, at.Add(12*time.Second))
	if f := fired(t, evs); err != nil || !f.Manual || f.TaskID == "" || !s.Last.Equal(last) {
		t.Fatalf("trigger: %+v %v", f, err)
	}
	// Resumed: instants missed while paused are not due.
	resumed := at.Add(time.Hour)
	s, _, _ = decideSched(t, s, aggregate.ResumeSchedule{}, resumed)
	if got := s.Next(); got.Before(resumed) {
		t.Fatalf("next %v before the resume %v", got, resumed)
	}
	s, evs, err = decideSched(t, s, aggregate.DeleteSchedule{}, resumed)
	if err != nil || len(evs) != 1 || !s.Exists() || s.Live() || !s.Next().IsZero() {
		t.Fatalf("delete: %v %v %+v", evs, err, s)
	}
	for _, cmd := range []aggregate.Command{aggregate.PauseSchedule{}, aggregate.TriggerSchedule{}, aggregate.DeleteSchedule{}} {
		if _, _, err := decideSched(t, s, cmd, resumed); !errors.Is(err, aggregate.ErrNotFound) {
			t.Fatalf("%T on a deleted schedule: %v", cmd, err)
		}
	}
	if _, _, err := decideSched(t, s, aggregate.FireSchedule{}, resumed.Add(time.Hour)); !errors.Is(err, aggregate.ErrStale) {
		t.Fatalf("fire on a deleted schedule: %v", err)
	}
}

func TestScheduleCatchup(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	downtime := created.Add(10*time.Minute + 5*time.Second) // 60 instants of every 10s missed
	for _, tc := range []struct {
		catchup string
		want    []events.ScheduleFired // the fires until nothing is due
	}{
		{events.CatchupOne, []events.ScheduleFired{{At: created.Add(10 * time.Minute), Missed: 59}}},
		{events.CatchupNone, []events.ScheduleFired{{At: created.Add(10 * time.Minute), Missed: 59}}},
		{events.CatchupAll, nil}, // 60 fires, checked below
	} {
		t.Run(tc.catchup, func(t *testing.T) {
			t.Parallel()
			s, _, err := decideSched(t, aggregate.ScheduleState{}, aggregate.CreateSchedule{ID: schedID, CustomerID: custID,
				Spec: schedSpec(func(s *events.ScheduleSpec) { s.Catchup = tc.catchup })}, created)
			if err != nil {
				t.Fatal(err)
			}
			var got []events.ScheduleFired
			for range 200 {
				var evs []events.Event
				if s, evs, err = decideSched(t, s, aggregate.FireSchedule{}, downtime); errors.Is(err, aggregate.ErrStale) {
					break
				}
				got = append(got, fired(t, evs))
			}
			if tc.catchup == events.CatchupAll {
				if len(got) != 60 || !got[0].At.Equal(created.Add(10*time.Second)) || got[0].TaskID == "" {
					t.Fatalf("all: %d fires, first %+v", len(got), got[0])
				}
				return
			}
			if len(got) != 1 || !got[0].At.Equal(tc.want[0].At) || got[0].Missed != tc.want[0].Missed {
				t.Fatalf("fires %+v, want %+v", got, tc.want)
			}
			// Within CatchupGrace of the latest instant "none" still runs it.
			if skipped := got[0].Skipped != ""; skipped {
				t.Fatalf("none within the grace skipped: %+v", got[0])
			}
		})
	}
	// Past the grace, none passes the instants over; all fires at most
	// MaxCatchup of them.
	for _, catchup := range []string{events.CatchupNone, events.CatchupAll} {
		s, _, _ := decideSched(t, aggregate.ScheduleState{}, aggregate.CreateSchedule{ID: schedID, CustomerID: custID,
			Spec: schedSpec(func(s *events.ScheduleSpec) { s.Catchup = catchup; s.Every = "1h" })}, created)
		now := created.Add(500*time.Hour + 30*time.Minute)
		runs := 0
		for range 1000 {
			var evs []events.Event
			var err error
			if s, evs, err = decideSched(t, s, aggregate.FireSchedule{}, now); err != nil {
				break
			}
			if fired(t, evs).TaskID != "" {
				runs++
			}
		}
		if want := map[string]int{events.CatchupNone: 0, events.CatchupAll: events.MaxCatchup}[catchup]; runs != want {
			t.Fatalf("%s: %d runs, want %d", catchup, runs, want)
		}
	}
}

// TestScheduleDST: a 02:30 daily in Europe/Berlin fires once on both change
// days: on the spring-forward day (02:30 does not exist) at 03:00 CEST,
// when the clock jumped; on the fall-back day (02:30 happens twice) at
// the first 02:30, CEST.
func TestScheduleDST(t *testing.T) {
	t.Parallel()
	tm, err := aggregate.ParseTiming("30 2 * * *", "", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		from string
		want []string
	}{
		{"2026-03-28T00:00:00Z", []string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		{"2026-10-24T00:00:00Z", []string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
	} {
		at := utc(tc.from)
		for _, w := range tc.want {
			if at = tm.Next(at); !at.Equal(utc(w)) {
				t.Fatalf("from %s: %v, want %s", tc.from, at, w)
			}
		}
	}
	// Every five minutes: the repeated hour fires once, the skipped one at
	// the change.
	tm5, _ := aggregate.ParseTiming("*/5 * * * *", "", "Europe/Berlin")
	count := func(from, to time.Time) int {
		n := 0
		for at := tm5.Next(from); at.Before(to); at = tm5.Next(at) {
			n++
		}
		return n
	}
	if n := count(utc("2026-10-24T23:59:00Z"), utc("2026-10-25T02:59:00Z")); n != 12*2 {
		t.Fatalf("fall-back night: %d fires between 01:00 and 03:55 local, want 24 (the repeated hour once)", n)
	}
	if n := count(utc("2026-03-28T23:59:00Z"), utc("2026-03-29T01:59:00Z")); n != 12+1+11 {
		t.Fatalf("spring-forward night: %d fires, want 24 (01:xx, the gap at 03:00, 03:05..03:55)", n)
	}
}

func TestScheduleInvalid(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(*events.ScheduleSpec){
		"both":         func(s *events.ScheduleSpec) { s.Cron = "* * * * *" },
		"neither":      func(s *events.ScheduleSpec) { s.Every = "" },
		"short every":  func(s *events.ScheduleSpec) { s.Every = "999ms" },
		"bad every":    func(s *events.ScheduleSpec) { s.Every = "soon" },
		"bad cron":     func(s *events.ScheduleSpec) { s.Every, s.Cron = "", "* * *" },
		"at every":     func(s *events.ScheduleSpec) { s.Every, s.Cron = "", "@every 5s" },
		"tz prefix":    func(s *events.ScheduleSpec) { s.Every, s.Cron = "", "TZ=UTC * * * * *" },
		"unknown zone": func(s *events.ScheduleSpec) { s.Every, s.Cron, s.Timezone = "", "* * * * *", "Mars/Olympus" },
		"zone path":    func(s *events.ScheduleSpec) { s.Every, s.Cron, s.Timezone = "", "* * * * *", "/etc/localtime" },
		"huge cron":    func(s *events.ScheduleSpec) { s.Every, s.Cron = "", strings.Repeat("1,", 200)+"1 * * * *" },
		"overlap":      func(s *events.ScheduleSpec) { s.Overlap = "sometimes" },
		"catchup":      func(s *events.ScheduleSpec) { s.Catchup = "" },
		"queue":        func(s *events.ScheduleSpec) { s.Task.Queue = "a.b" },
		"timeout":      func(s *events.ScheduleSpec) { s.Task.TimeoutSeconds = 0 },
		"parent":       func(s *events.ScheduleSpec) { s.Task.ParentID = "p" },
		"huge message": func(s *events.ScheduleSpec) {
			s.Task.Message.Content[0].Text = strings.Repeat("x", events.MaxMessageBytes+1)
		},
		"every in zone": func(s *events.ScheduleSpec) { s.Timezone = "Europe/Berlin" },
		"retry of":      func(s *events.ScheduleSpec) { s.Task.RetryOf, s.Task.RelatedTaskID = "old", "old" },
		"label key":     func(s *events.ScheduleSpec) { s.Task.Labels = map[string]string{"-x": ""} },
		"retry policy": func(s *events.ScheduleSpec) {
			s.Task.Retry = &events.RetryPolicy{MaxAttempts: 0, On: []string{events.RetryOnFailed}}
		},
		"concurrency": func(s *events.ScheduleSpec) { s.Task.Concurrency = &events.Concurrency{Key: "k", Limit: 1001} },
	} {
		_, err := aggregate.DecideSchedule(aggregate.ScheduleState{}, aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: schedSpec(mod)}, t0)
		if !errors.Is(err, aggregate.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := aggregate.DecideSchedule(aggregate.ScheduleState{}, aggregate.CreateSchedule{ID: "a.b", CustomerID: custID, Spec: schedSpec(nil)}, t0); !errors.Is(err, aggregate.ErrInvalid) {
		t.Errorf("bad id: %v", err)
	}
	full := schedSpec(func(s *events.ScheduleSpec) {
		s.Task.Labels = map[string]string{"kind": "nightly"}
		s.Task.Retry = &events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: 10, MaxBackoffSeconds: 60, On: []string{events.RetryOnFailed}}
		s.Task.Concurrency = &events.Concurrency{Key: "repo:x", Limit: 1}
	})
	if _, err := aggregate.DecideSchedule(aggregate.ScheduleState{}, aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: full}, t0); err != nil {
		t.Errorf("a task with labels, a policy and a key: %v", err)
	}
}

// TestScheduleModel drives random commands against a schedule and checks
// what a reference says of each: which commands append, that a fire is for
// an instant after every earlier one, never while paused or deleted, and
// that each run's request id is derived from the instant.
func TestScheduleModel(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		var s aggregate.ScheduleState
		now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		live, paused := false, false
		var last time.Time
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			now = now.Add(time.Duration(rapid.IntRange(0, 7200).Draw(rt, "advance")) * time.Second)
			cmds := []aggregate.Command{
				aggregate.CreateSchedule{ID: schedID, CustomerID: custID, Spec: schedSpec(func(s *events.ScheduleSpec) {
					s.Every = rapid.SampledFrom([]string{"1s", "1m", "1h"}).Draw(rt, "every")
					s.Catchup = rapid.SampledFrom([]string{events.CatchupOne, events.CatchupNone, events.CatchupAll}).Draw(rt, "catchup")
				})},
				aggregate.PauseSchedule{}, aggregate.ResumeSchedule{}, aggregate.DeleteSchedule{}, aggregate.TriggerSchedule{},
				aggregate.FireSchedule{PrevLive: rapid.Bool().Draw(rt, "prevLive")},
			}
			cmd := rapid.SampledFrom(cmds).Draw(rt, "cmd")
			before := s
			evs, err := aggregate.DecideSchedule(s, cmd, now)
			for _, ev := range evs {
				s = aggregate.ApplySchedule(s, ev)
			}
			switch c := cmd.(type) {
			case aggregate.CreateSchedule:
				if err != nil || live && len(evs) > 1 {
					rt.Fatalf("create: %v %v", evs, err)
				}
				if !live {
					live, paused = true, false
				}
			case aggregate.FireSchedule:
				if !live || paused {
					if !errors.Is(err, aggregate.ErrStale) {
						rt.Fatalf("fire while live=%v paused=%v: %v", live, paused, err)
					}
					continue
				}
				if err != nil {
					if !errors.Is(err, aggregate.ErrStale) || !before.Next().After(now) {
						rt.Fatalf("fire refused with %v, next %v, now %v", err, before.Next(), now)
					}
					continue
				}
				f := evs[0].Data.(events.ScheduleFired)
				if !f.At.After(last) || f.At.After(now) || f.Manual {
					rt.Fatalf("fired %v after %v at %v", f.At, last, now)
				}
				last = f.At
				if f.Skipped == "" && f.RequestID != events.ScheduleRequestID(schedID, f.At) {
					rt.Fatalf("request id %s", f.RequestID)
				}
				if f.Skipped == "overlap" && (!c.PrevLive || s.Spec.Overlap == events.OverlapAllow) {
					rt.Fatalf("skipped for overlap without one")
				}
			default:
				if !live {
					if !errors.Is(err, aggregate.ErrNotFound) {
						rt.Fatalf("%T on no schedule: %v", cmd, err)
					}
					continue
				}
				if err != nil {
					rt.Fatalf("%T: %v", cmd, err)
				}
				switch cmd.(type) {
				case aggregate.PauseSchedule:
					if (len(evs) == 1) == paused {
						rt.Fatalf("pause appended %d while paused=%v", len(evs), paused)
					}
					paused = true
				case aggregate.ResumeSchedule:
					if (len(evs) == 1) != paused {
						rt.Fatalf("resume appended %d while paused=%v", len(evs), paused)
					}
					paused = false
				case aggregate.DeleteSchedule:
					live = false
				}
			}
			if s.Live() != live || s.Live() && s.Paused != paused {
				rt.Fatalf("state live=%v paused=%v, model live=%v paused=%v", s.Live(), s.Paused, live, paused)
			}
		}
	})
}
