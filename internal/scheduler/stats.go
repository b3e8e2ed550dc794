package scheduler

import (
	"github.com/taskledger/taskledger/internal/service"
)

// Stats are the statistics of GET /v1/stats that the projections give
// (service.Stats).
type Stats = service.Stats

// ScheduleStats is a live schedule's row of Stats
// (service.ScheduleStats).
type ScheduleStats = service.ScheduleStats

// Stats returns the statistics p may see (an operator: every
// customer's), from the projections: every queue, and up to maxRows
// concurrency keys and schedules. It costs the queues, keys and
// schedules, not the tasks.
func (s *feed) Stats(p Principal, maxRows int) Stats {
	customer := p.Scope()
	out := Stats{At: s.now()}
	for _, q := range s.views.Stats(customer, out.At) {
		out.Queues = append(out.Queues, service.QueueStats(q))
	}
	keys, more := s.views.KeyStats(customer, maxRows)
	for _, k := range keys {
		out.Keys = append(out.Keys, service.KeyStats(k))
	}
	out.KeysTruncated = more
	scheds := s.schedules.Schedules(customer, "", maxRows+1, false)
	if out.SchedulesTruncated = len(scheds) > maxRows; out.SchedulesTruncated {
		scheds = scheds[:maxRows]
	}
	for _, sc := range scheds {
		st := sc.State
		row := ScheduleStats{CustomerID: st.CustomerID, ID: st.ID, Paused: st.Paused, Next: st.Next(), Runs: st.Runs}
		if st.LastRun.TaskID != "" {
			run := ScheduleRun{ScheduleFired: st.LastRun}
			if t, ok := s.applied.Task(st.LastRun.TaskID); ok {
				run.Status = t.Status
			}
			row.LastRun = &run
		}
		out.Schedules = append(out.Schedules, row)
	}
	return out
}
