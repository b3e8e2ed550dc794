package scheduler

import (
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/projections"
)

// feed is the part of the service that reads the log and the views for
// the edge: a task's history and tree (GET /v1/tasks/{id}/history and
// /tree), the task list and its request filter (GET /v1/tasks), the
// event stream and its cursors (GET /v1/events/stream), a customer's
// events (GET /v1/events), statistics (GET /v1/stats) and concurrency
// keys (GET /v1/concurrency). It writes nothing. It is safe for
// concurrent use.
type feed struct {
	*core
	views     FeedViews
	schedules ScheduleViews // the statistics' schedule rows
	// skipped counts the quarantined messages reads of the log passed
	// over with a marker (Metrics.QuarantineSkips); repeats logs them,
	// each message once an interval.
	skipped interface{ Inc() }
	repeats *ratelog.Limiter
}

// FeedViews is what the reads of the log and the listings (histories,
// trees, task lists, statistics, concurrency keys) read from the
// projections, besides Applied. Its methods are safe for concurrent use.
type FeedViews interface {
	// Children returns the ids of a task's children, in creation order.
	Children(id string) []string
	// List returns up to limit tasks matching f after the cursor after.
	List(f projections.Filter, after string, limit int) []aggregate.State
	// Stats returns the statistics of customerID's queues ("": all) at
	// now, by customer then queue.
	Stats(customerID string, now time.Time) []projections.QueueStats
	// KeyStats returns up to limit of customerID's ("": all) concurrency
	// keys with a task holding or waiting for a slot, by customer then
	// key, and whether there were more.
	KeyStats(customerID string, limit int) ([]projections.KeyStats, bool)
	// ConcurrencyKey returns a concurrency key's state, holders and the
	// tasks waiting for a slot at now.
	ConcurrencyKey(customerID, key string, now time.Time) (aggregate.KeyState, []aggregate.State, []aggregate.State)
}
