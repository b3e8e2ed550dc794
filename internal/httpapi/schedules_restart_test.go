package httpapi_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// verifyClean runs replay verify over the whole log of n.
func verifyClean(t *testing.T, n *testnode.Node) replay.Report {
	t.Helper()
	v := replay.NewVerifier(n.NS.Subjects)
	err := n.Store.Log().Read(context.Background(), eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r := v.Report()
	if !r.Clean() {
		t.Fatalf("replay verify: %+v", r.Violations)
	}
	return r
}

// TestScheduleTwoNodes runs two scheduler processes on one stream: each
// instant fires once and makes one task.
func TestScheduleTwoNodes(t *testing.T) {
	t.Parallel()
	n1 := testnode.Start(t, func(c *node.Config) { c.Name = "node-1" })
	n2 := testnode.Start(t, testnode.On(nil, n1.NS), func(c *node.Config) { c.Name = "node-2" })
	ctx := context.Background()
	if _, _, err := n1.Client.CreateSchedule(ctx, everySecond("both")); err != nil {
		t.Fatal(err)
	}
	waitRuns(t, n2.Client, "both", "three runs seen by the second node", func(s api.Schedule) bool { return s.RunCount >= 3 })
	if _, err := n2.Client.PauseSchedule(ctx, "both", api.ScheduleOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := n1.Client.ScheduleHistory(ctx, "both", api.ScheduleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	instants, actors := map[string]int{}, map[string]bool{}
	for _, e := range h.Events {
		if e.Type == string(events.TypeScheduleFired) {
			at := e.Data.(map[string]any)["at"].(string)
			instants[at]++
			actors[e.Actor] = true
			if instants[at] > 1 {
				t.Fatalf("instant %s fired twice: %+v", at, h.Events)
			}
		}
	}
	s, _ := n1.Client.GetSchedule(ctx, "both", api.ScheduleOptions{})
	checkRunTasks(t, n1.Client, s)
	r := verifyClean(t, n1)
	if r.Schedules != 1 {
		t.Fatalf("verify saw %d schedules", r.Schedules)
	}
	t.Logf("fired %d instants, by %v", len(instants), actors)
}

// clock is a settable clock for nodes that see downtime.
type clock struct{ now atomic.Pointer[time.Time] }

func newClock(t time.Time) *clock { c := &clock{}; c.set(t); return c }
func (c *clock) set(t time.Time)  { c.now.Store(&t) }
func (c *clock) Now() time.Time   { return *c.now.Load() }

// TestScheduleRestartCatchup stops the only node, lets six instants of an
// every-10m schedule pass, the latest five minutes late, and starts a node
// again: catchup one runs once, none passes them over, all runs each.
func TestScheduleRestartCatchup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		catchup       string
		runs, skipped int
	}{
		{events.CatchupOne, 1, 0},
		{events.CatchupNone, 0, 1},
		{events.CatchupAll, 6, 0},
	} {
		t.Run(tc.catchup, func(t *testing.T) {
			t.Parallel()
			t0 := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
			clk := newClock(t0)
			withClock := func(c *node.Config) { c.Now = clk.Now }
			n1 := testnode.Start(t, withClock)
			req := everySecond("ten")
			req.Every, req.Catchup = "10m", tc.catchup
			if _, _, err := n1.Client.CreateSchedule(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			n1.Stop()
			clk.set(t0.Add(time.Hour + 5*time.Minute))
			n2 := testnode.Start(t, testnode.On(nil, n1.NS), withClock)
			s := waitRuns(t, n2.Client, "ten", "the catch-up", func(s api.Schedule) bool {
				for _, r := range s.Runs {
					if r.TaskID != "" && r.Status == "" {
						return false // its task is not scheduled yet
					}
				}
				return len(s.Next) > 0 && s.Next[0].After(clk.Now())
			})
			skipped := 0
			for _, r := range s.Runs {
				if r.Skipped == "missed" {
					skipped++
				}
			}
			if s.RunCount != tc.runs || skipped != tc.skipped {
				t.Fatalf("%d runs and %d skipped, want %d and %d: %+v", s.RunCount, skipped, tc.runs, tc.skipped, s.Runs)
			}
			if tc.catchup != events.CatchupAll && (!s.Runs[0].At.Equal(t0.Add(time.Hour)) || s.Runs[0].Missed != 5) {
				t.Fatalf("catch-up fire %+v, want the latest instant with 5 missed", s.Runs[0])
			}
			checkRunTasks(t, n2.Client, s)
			verifyClean(t, n2)
		})
	}
}

// TestScheduleFiredWithoutTask is a crash between a fire and its task: the
// log holds a ScheduleFired whose task was never scheduled. The next node
// schedules that task, once, and fires nothing else.
func TestScheduleFiredWithoutTask(t *testing.T) {
	t.Parallel()
	t0 := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	clk := newClock(t0)
	withClock := func(c *node.Config) { c.Now = clk.Now }
	n1 := testnode.Start(t, withClock)
	req := everySecond("crash")
	req.Every = "1h"
	if _, _, err := n1.Client.CreateSchedule(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	n1.Stop()
	clk.set(t0.Add(time.Hour + time.Second))
	// The process that crashed: it appended the fire and died.
	st, err := store.Open(context.Background(), n1.NC, store.Config{Stream: n1.NS.Stream, Subjects: n1.NS.Subjects, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	_, evs, err := st.ExecuteSchedule(context.Background(), events.DefaultCustomer, "crash", "crashed", aggregate.FireSchedule{})
	st.Close()
	if err != nil || len(evs) != 1 {
		t.Fatalf("fire: %v %v", evs, err)
	}
	fired := evs[0].Data.(events.ScheduleFired)
	n2 := testnode.Start(t, testnode.On(nil, n1.NS), withClock)
	task := waitTask(t, n2.Client, fired.TaskID)
	if task.RequestID != fired.RequestID {
		t.Fatalf("task %+v for fire %+v", task, fired)
	}
	s, err := n2.Client.GetSchedule(context.Background(), "crash", api.ScheduleOptions{})
	if err != nil || s.RunCount != 1 || len(s.Runs) != 1 || s.Runs[0].TaskID != task.ID {
		t.Fatalf("after recovery: %+v %v", s, err)
	}
	h, _ := n2.Client.ScheduleHistory(context.Background(), "crash", api.ScheduleOptions{})
	if len(h.Events) != 2 {
		t.Fatalf("recovery appended to the schedule: %+v", h.Events)
	}
	verifyClean(t, n2)
}

// waitTask polls until the task exists.
func waitTask(t *testing.T, c *api.Client, id string) api.Task {
	t.Helper()
	var task api.Task
	testnode.Eventually(t, "task "+id, func() bool {
		var err error
		task, err = c.Get(context.Background(), id)
		return err == nil
	})
	return task
}
