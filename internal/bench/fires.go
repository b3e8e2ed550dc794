package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// The figures of the fire lateness section.
const (
	FigFireP50 = "fire lateness p50"
	FigFireP99 = "fire lateness p99"
	FigFireMax = "fire lateness max"
)

// fireSeconds is how long the schedules of the fire section run.
const fireSeconds = 3

// fires measures how late the alarm fires periodic schedules: schedules
// firing every second for fireSeconds, each fire's ScheduleFired time −
// its instant. They are deleted afterwards; their runs' tasks stay queued.
func (r *run) fires(ctx context.Context, nd *node.Node) error {
	n := r.scaled(100, 5)
	ids := make([]string, n)
	if err := forEach(ctx, n, func(ctx context.Context, i int) error {
		ids[i] = fmt.Sprintf("bench-%d", i)
		_, _, err := nd.Service.CreateSchedule(ctx, scheduler.Operator, scheduler.CreateScheduleRequest{
			ID: ids[i], Every: "1s", Overlap: events.OverlapAllow, Task: scheduler.ScheduleRequest{Queue: "fires"},
		})
		return err
	}); err != nil {
		return err
	}
	if err := sleep(ctx, fireSeconds*time.Second+500*time.Millisecond); err != nil {
		return err
	}
	late := make([][]time.Duration, n)
	if err := forEach(ctx, n, func(ctx context.Context, i int) error {
		if _, err := nd.Service.ScheduleAction(ctx, scheduler.Operator, "", ids[i], aggregate.DeleteSchedule{}); err != nil {
			return err
		}
		evs, err := nd.Store.ScheduleHistory(ctx, events.DefaultCustomer, ids[i])
		for _, ev := range evs {
			if f, ok := ev.Data.(events.ScheduleFired); ok {
				late[i] = append(late[i], ev.At.Sub(f.At))
			}
		}
		return err
	}); err != nil {
		return err
	}
	all := slices.Concat(late...)
	if len(all) == 0 {
		return fmt.Errorf("bench: %d schedules fired nothing in %ds", n, fireSeconds)
	}
	slices.Sort(all)
	r.say("  %d schedules fired %d times in %ds", n, len(all), fireSeconds)
	p99, mx := millis(percentile(all, .99)), millis(all[len(all)-1])
	r.add(r.rttRatio(Figure{Section: "timers", Name: FigFireP50, Value: millis(percentile(all, .5)), Unit: "ms"}))
	r.add(atMost(r.rttRatio(Figure{Section: "timers", Name: FigFireP99, Value: p99, Unit: "ms"}), p99, 5, "≤ 5 ms"))
	r.add(r.rttRatio(Figure{Section: "timers", Name: FigFireMax, Value: mx, Unit: "ms"}))
	return nil
}
