package service

import (
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// CreateScheduleRequest is a request for a schedule (POST /v1/schedules).
// Task is the body of each run: its queue, message, repo, signal,
// timeoutSeconds, labels, retry policy and concurrency; ids, runAt and
// delaySeconds are refused.
type CreateScheduleRequest struct {
	CustomerID, ID        string
	Cron, Every, Timezone string
	Task                  ScheduleRequest
	Overlap, Catchup      string
	Paused                bool
}

// ScheduleView is a schedule with its next instants and its last runs,
// newest first, each with its task's status.
type ScheduleView struct {
	State aggregate.ScheduleState
	Next  []time.Time
	Runs  []ScheduleRun
}

// ScheduleRun is one fire of a schedule and the status of its task (""
// for a skip, or a task the log does not hold yet).
type ScheduleRun struct {
	events.ScheduleFired
	Status aggregate.Status
}
