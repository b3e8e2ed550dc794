package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/reactors"
	"github.com/taskledger/taskledger/ready"
)

// limitFlags are serve's flags for the delivery of ready notifications,
// the per-customer bounds on polls and queues and the lineage bounds.
type limitFlags struct {
	budget, retryMax, republishAfter, queueIdle            time.Duration
	maxAttempts, maxPolls, maxQueues, lineTasks, lineDepth int
	readyJSON                                              bool
	maxSchedules                                           int
}

func (f *limitFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.budget, "delivery-budget", reactors.DefaultDeliveryBudget, "how long a ready notification may keep failing to publish before its task fails")
	fs.DurationVar(&f.retryMax, "delivery-retry-max", reactors.DefaultRetryMax, "longest wait between two publish attempts of a ready notification (backoff from 100ms)")
	fs.IntVar(&f.maxAttempts, "delivery-max-attempts", 0, "also fail a task after this many failed publish attempts (0 = the budget alone decides)")
	fs.BoolVar(&f.readyJSON, "ready-json", false, "publish ready notifications as JSON (Content-Type: application/json) for NATS consumers that read only JSON; default msgpack")
	fs.DurationVar(&f.republishAfter, "republish-after", reactors.DefaultRepublishAfter, "how long a queued task's notification waits before the server checks it is still in the ready stream, and publishes it again if not")
	fs.IntVar(&f.maxPolls, "max-polls-per-customer", scheduler.DefaultMaxPollsPerCustomer, "long polls (claims/next, batch claims) one customer may hold at once; more answer 429 (-1: no limit)")
	fs.IntVar(&f.maxQueues, "max-queues-per-customer", scheduler.DefaultMaxQueuesPerCustomer, "queues one customer may have live tasks on; a task on another answers 400 (-1: no limit)")
	fs.IntVar(&f.lineTasks, "max-lineage-tasks", scheduler.DefaultMaxLineageTasks, "tasks in one lineage (a root and its descendants); past it scheduling a child answers 409 lineage_limit (-1: no limit)")
	fs.IntVar(&f.lineDepth, "max-lineage-depth", scheduler.DefaultMaxLineageDepth, "levels of children below a root; past it scheduling a child answers 409 lineage_limit (-1: no limit)")
	fs.IntVar(&f.maxSchedules, "max-schedules", events.MaxSchedules, "live schedules one customer may have; past it creating one answers 409 schedule_limit (-1: no limit)")
	fs.DurationVar(&f.queueIdle, "queue-idle", ready.ConsumerIdle, "how long a queue's ready consumer is kept without a claimer; the next claim creates it again")
}

// check refuses values that mean nothing, and returns the configuration.
func (f *limitFlags) check() (reactors.AlarmConfig, scheduler.Limits, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"delivery-budget", f.budget}, {"delivery-retry-max", f.retryMax}, {"republish-after", f.republishAfter}, {"queue-idle", f.queueIdle}} {
		if d.v <= 0 {
			return reactors.AlarmConfig{}, scheduler.Limits{}, fmt.Errorf("%w: --%s %s: want a positive duration", errUsage, d.name, d.v)
		}
	}
	for _, n := range []struct {
		name     string
		v, least int
	}{{"delivery-max-attempts", f.maxAttempts, 0}, {"max-polls-per-customer", f.maxPolls, -1}, {"max-queues-per-customer", f.maxQueues, -1},
		{"max-lineage-tasks", f.lineTasks, -1}, {"max-lineage-depth", f.lineDepth, -1}, {"max-schedules", f.maxSchedules, -1}} {
		if n.v < n.least || n.v == 0 && n.least < 0 {
			return reactors.AlarmConfig{}, scheduler.Limits{}, fmt.Errorf("%w: --%s %d: want a positive number, or %d", errUsage, n.name, n.v, n.least)
		}
	}
	alarm := reactors.AlarmConfig{DeliveryBudget: f.budget, RetryMax: f.retryMax, MaxDeliveryAttempts: f.maxAttempts, RepublishAfter: f.republishAfter}
	limits := scheduler.Limits{MaxPollsPerCustomer: f.maxPolls, MaxQueuesPerCustomer: f.maxQueues, QueueIdle: f.queueIdle,
		MaxLineageTasks: f.lineTasks, MaxLineageDepth: f.lineDepth, MaxSchedules: f.maxSchedules}
	return alarm, limits, nil
}
