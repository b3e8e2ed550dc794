package service

import (
	"time"

	"github.com/taskledger/taskledger/aggregate"
)

// Stats are the statistics of GET /v1/stats that the projections give,
// as of At.
type Stats struct {
	At     time.Time
	Queues []QueueStats // by customer then queue
	// Keys are the concurrency keys with a task holding or waiting for a
	// slot, by customer then key; KeysTruncated says more were left out.
	Keys          []KeyStats
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

// QueueStats are the statistics of one customer's tasks on one queue,
// from counters the views keep as events apply.
type QueueStats struct {
	CustomerID, Queue string
	Counts            map[aggregate.Status]int // tasks per status, none left out as 0
	// OldestQueued is how long ago the delivery of the queued task
	// published longest ago was due; 0 with none queued.
	OldestQueued time.Duration
	// Claims and Results are Claimed and ResultRecorded events per second
	// over the last minute and five minutes of event time.
	Claims1m, Claims5m, Results1m, Results5m float64
	NearTimeout                              int // running tasks past 80 % of their timeout
	Retries                                  int // delivery attempts past the first of the live tasks' current deliveries
	Rejections                               int // tasks admission refused
}

// KeyStats are one concurrency key's counts.
type KeyStats struct {
	CustomerID, Key string
	// Limit is the concurrency limit of the first holder, else of one of
	// the key's unfinished tasks.
	Limit int
	// Holders counts the tasks holding a slot; Waiting the unfinished
	// tasks holding none (due or not).
	Holders, Waiting int
}
