package scheduler

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the service's counters.
type Metrics struct {
	CheckFailures   prometheus.Counter
	Repairs         prometheus.Counter
	Rejections      prometheus.Counter
	CheckerFailures prometheus.Counter
	Handoffs        prometheus.Counter
	// WrongTenantClaims counts ready notifications dropped because the
	// task they name is not the claimer's or not on its queue.
	WrongTenantClaims prometheus.Counter
	// QuarantineSkips counts the times a read over many tasks (GET
	// /v1/events, the event stream) passed over a message of the log that
	// does not decode with a Quarantined marker: one per message per read,
	// so a message read again is counted again.
	QuarantineSkips prometheus.Counter
}

// NewMetrics creates the counters and registers them with reg, if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		CheckFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskledger_check_failures_total",
			Help: "Stop checks that failed and answered continue (fail-open).",
		}),
		Repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskledger_timer_repairs_total",
			Help: "Releases or deliveries missing from the timer queues and put back from the log.",
		}),
		Rejections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskledger_admission_rejections_total",
			Help: "New root tasks refused by admission (persisted as canceled).",
		}),
		CheckerFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskledger_usage_checker_failures_total",
			Help: "Calls to the external usage checker that failed; the task was admitted (fail-open).",
		}),
		Handoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskledger_handoffs_total",
			Help: "Released tasks handed straight to a claimer waiting in this process, with no ready notification.",
		}),
		WrongTenantClaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskledger_claims_wrong_tenant_total",
			Help: "Ready notifications dropped unclaimed: the task they name belongs to another customer than the claimer's, or to another queue (a forged notification).",
		}),
		QuarantineSkips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskledger_quarantine_skips_total",
			Help: "Times GET /v1/events or the event stream passed over a message of the log that does not decode with a Quarantined marker: one per message per read (taskledger_projection_undecodable_events_total counts the messages).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.CheckFailures, m.Repairs, m.Rejections, m.CheckerFailures, m.Handoffs, m.WrongTenantClaims, m.QuarantineSkips)
	}
	return m
}
