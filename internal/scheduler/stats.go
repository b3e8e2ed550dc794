package scheduler

import (
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/reactors"
)

// Stats are the statistics of GET /v1/stats that the projections give,
// as of At.
type Stats struct {
	At     time.Time
	Queues []projections.QueueStats // by customer then queue
	// Keys are the concurrency keys with a task holding or waiting for a
	// slot, by customer then key; KeysTruncated says more were left out.
	Keys          []projections.KeyStats
	KeysTruncated bool
	// Schedules are the live schedules, by customer then id;
	// SchedulesTruncated says more were left out.
	Schedules          []ScheduleStats
	SchedulesTruncated bool
}

// ScheduleStats is a live schedule's next instant (zero while paused)
// and its last run with its task's status (nil before the first).
type ScheduleStats struct {
	CustomerID, ID string
	Paused         bool
	Next           time.Time
	LastRun        *ScheduleRun
	Runs           int
}

// Stats returns the statistics p may see (an operator: every
// customer's), from the projections: every queue, and up to maxRows
// concurrency keys and schedules. It costs the queues, keys and
// schedules, not the tasks.
func (s *Service) Stats(p Principal, maxRows int) Stats {
	customer := p.customerFilter()
	out := Stats{At: s.cfg.Store.Now()}
	out.Queues = s.cfg.Views.Stats(customer, out.At)
	out.Keys, out.KeysTruncated = s.cfg.Views.KeyStats(customer, maxRows)
	scheds := s.cfg.Schedules.Schedules(customer, "", maxRows+1, false)
	if out.SchedulesTruncated = len(scheds) > maxRows; out.SchedulesTruncated {
		scheds = scheds[:maxRows]
	}
	for _, sc := range scheds {
		st := sc.State
		row := ScheduleStats{CustomerID: st.CustomerID, ID: st.ID, Paused: st.Paused, Next: st.Next(), Runs: st.Runs}
		if st.LastRun.TaskID != "" {
			run := ScheduleRun{ScheduleFired: st.LastRun}
			if t, ok := s.cfg.Views.Task(st.LastRun.TaskID); ok {
				run.Status = t.Status
			}
			row.LastRun = &run
		}
		out.Schedules = append(out.Schedules, row)
	}
	return out
}

// LatenessSummary is the alarm's recent lateness as the statistics read
// it (reactors.LatenessWindow).
type LatenessSummary interface {
	Summary() (all reactors.Lateness, byTimer [projections.NumTimers]reactors.Lateness)
}

var _ LatenessSummary = (*reactors.LatenessWindow)(nil)

// AlarmStats renders l's summary as the alarm section of GET /v1/stats:
// the lateness over every timer queue, and that of each queue with
// samples, by the queue's name. It is safe for concurrent use if l is.
func AlarmStats(l LatenessSummary) api.AlarmStats {
	render := func(l reactors.Lateness) api.Lateness {
		return api.Lateness{Samples: l.Samples, P50Seconds: l.P50.Seconds(), P99Seconds: l.P99.Seconds(), MaxSeconds: l.Max.Seconds()}
	}
	out := api.AlarmStats{Timers: map[string]api.Lateness{}}
	all, byTimer := l.Summary()
	out.Lateness = render(all)
	for t, l := range byTimer {
		if l.Samples > 0 {
			out.Timers[projections.Timer(t).String()] = render(l)
		}
	}
	return out
}
