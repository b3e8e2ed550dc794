package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/reactors"
)

// newRegistry returns a registry with the Go runtime and process metrics
// (heap, GC pauses, RSS), the projections' gauges and the store's OCC
// conflicts.
func newRegistry(eng *projections.Engine, st *store.Store) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "taskledger_projection_applied_sequence",
			Help: "Stream sequence of the last event the projections applied.",
		}, func() float64 { return float64(eng.Applied()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskledger_projection_undecodable_events_total",
			Help: "Events the projections skipped because they did not decode.",
		}, func() float64 { return float64(eng.Undecodable()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskledger_projection_evicted_tasks_total",
			Help: "Tasks of finished lineages this process evicted from the projections (--retain); the log keeps them.",
		}, func() float64 { return float64(eng.Evicted()) }),
		conflictCounts{st},
		taskGauges{eng},
	)
	for t := range projections.NumTimers {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "taskledger_timer_queue_length",
			Help:        "Tasks waiting in a timer queue (release, deliver, expire, report, republish, free).",
			ConstLabels: prometheus.Labels{"timer": t.String()},
		}, func() float64 { return float64(eng.TimerLen(t)) }))
	}
	return reg
}

// registerServerMetrics reports the claimers waiting and the API
// server's open and refused connections.
func registerServerMetrics(reg prometheus.Registerer, s *httpapi.Server, svc *scheduler.Service) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "taskledger_claimers_waiting",
			Help: "Claimers (long polls and batch claims) waiting for a task in this process, on every queue.",
		}, func() float64 { return float64(svc.Waiting("")) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "taskledger_http_open_connections",
			Help: "HTTP connections open now (at most --max-conns).",
		}, func() float64 { return float64(s.OpenConns()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskledger_http_refused_connections_total",
			Help: "HTTP connections answered 503 and closed because --max-conns were open.",
		}, func() float64 { return float64(s.RefusedConns()) }),
	)
}

// registerCommitMetrics reports the group commit's work: its rounds
// (fsync passes), the answers that waited for one, and the time spent.
func registerCommitMetrics(reg prometheus.Registerer, c Committer) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskledger_fsync_rounds_total",
			Help: "Group commit rounds: fsync passes over the embedded server's written files (--durability fsync).",
		}, func() float64 { return float64(c.CommitStats().Rounds) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskledger_fsync_waits_total",
			Help: "API answers that waited for a group commit round; waits ÷ rounds is the answers one fsync pass covered.",
		}, func() float64 { return float64(c.CommitStats().Callers) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "taskledger_fsync_seconds_total",
			Help: "Time spent in group commit rounds.",
		}, func() float64 { return c.CommitStats().Time.Seconds() }),
	)
}

var conflictsDesc = prometheus.NewDesc("taskledger_occ_conflicts_total",
	"Appends the log refused because another writer had appended to the task, key or schedule first, by the type of the event refused (each is decided again on the fresh state).",
	[]string{"event"}, nil)

// conflictCounts reports the store's OCC conflicts by event type.
type conflictCounts struct{ st *store.Store }

func (c conflictCounts) Describe(ch chan<- *prometheus.Desc) { ch <- conflictsDesc }

func (c conflictCounts) Collect(ch chan<- prometheus.Metric) {
	for typ, n := range c.st.Conflicts() {
		ch <- prometheus.MustNewConstMetric(conflictsDesc, prometheus.CounterValue, float64(n), string(typ))
	}
}

var tasksDesc = prometheus.NewDesc("taskledger_tasks", "Tasks by queue and status, from the projections (finished ones as far as --retain keeps them).", []string{"queue", "status"}, nil)

// taskGauges reports the projections' task counts per queue and status.
type taskGauges struct{ eng *projections.Engine }

func (g taskGauges) Describe(ch chan<- *prometheus.Desc) { ch <- tasksDesc }

func (g taskGauges) Collect(ch chan<- prometheus.Metric) {
	for queue, byStatus := range g.eng.QueueCounts() {
		for status, n := range byStatus {
			ch <- prometheus.MustNewConstMetric(tasksDesc, prometheus.GaugeValue, float64(n), queue, string(status))
		}
	}
}

// observeAlarm returns an AlarmConfig.Observe that records each action's
// lateness against its due time and its outcome.
func observeAlarm(reg prometheus.Registerer) func(projections.Timer, time.Duration, error) {
	lateness := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "taskledger_alarm_lateness_seconds",
		Help:    "How late after its due time the alarm acted on a release, delivery, timeout or child report.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5},
	}, []string{"timer"})
	actions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "taskledger_alarm_actions_total",
		Help: "Alarm actions by timer and outcome (ok, settled: no longer needed, error: retried, failed: cannot succeed, not retried).",
	}, []string{"timer", "outcome"})
	reg.MustRegister(lateness, actions)
	return func(t projections.Timer, late time.Duration, err error) {
		lateness.WithLabelValues(t.String()).Observe(late.Seconds())
		outcome := "ok"
		switch {
		case err == nil:
		case reactors.IsSettled(err):
			outcome = "settled"
		case reactors.IsPermanent(err):
			outcome = "failed"
		default:
			outcome = "error"
		}
		actions.WithLabelValues(t.String(), outcome).Inc()
	}
}

// countExhausted returns an AlarmConfig.Exhausted that counts the
// deliveries the alarm gave up on.
func countExhausted(reg prometheus.Registerer) func(aggregate.State) {
	exhausted := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "taskledger_deliveries_exhausted_total",
		Help: "Ready notifications the alarm gave up publishing (the delivery budget spent); each task failed.",
	})
	reg.MustRegister(exhausted)
	return func(aggregate.State) { exhausted.Inc() }
}

// alarmStats renders the alarm's recent lateness (w) as the alarm section
// of GET /v1/stats: the lateness over every timer queue, and that of each
// queue with samples, by the queue's name. It is safe for concurrent use.
func alarmStats(w *reactors.LatenessWindow) api.AlarmStats {
	render := func(l reactors.Lateness) api.Lateness {
		return api.Lateness{Samples: l.Samples, P50Seconds: l.P50.Seconds(), P99Seconds: l.P99.Seconds(), MaxSeconds: l.Max.Seconds()}
	}
	out := api.AlarmStats{Timers: map[string]api.Lateness{}}
	all, byTimer := w.Summary()
	out.Lateness = render(all)
	for t, l := range byTimer {
		if l.Samples > 0 {
			out.Timers[projections.Timer(t).String()] = render(l)
		}
	}
	return out
}
