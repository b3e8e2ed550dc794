package scheduler_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
)

// yearSeconds is how far ahead the service lets a task be scheduled: 52
// of the longest timeouts.
const yearSeconds = events.MaxTimeoutSeconds * 52

// wouldBeCustomer is the customer the service schedules req for as p.
func wouldBeCustomer(p scheduler.Principal, req scheduler.ScheduleRequest) string {
	switch {
	case !p.IsOperator():
		return p.CustomerID
	case req.CustomerID == "":
		return "default"
	}
	return req.CustomerID
}

func TestScheduleValidation(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	now := time.Now()
	// The "text" part type counts too: this message is 4 bytes over.
	tooBig := text("", strings.Repeat("x", events.MaxMessageBytes))
	longID := strings.Repeat("a", events.MaxIDLen+1)

	cases := []struct {
		name string
		p    scheduler.Principal
		req  scheduler.ScheduleRequest
		want error
	}{
		{"CustomerIDInvalid", operator, scheduler.ScheduleRequest{CustomerID: "acme corp"}, aggregate.ErrInvalid},
		{"CustomerIDTooLong", operator, scheduler.ScheduleRequest{CustomerID: longID}, aggregate.ErrInvalid},
		{"CustomerIDWildcard", operator, scheduler.ScheduleRequest{CustomerID: "*"}, aggregate.ErrInvalid},
		{"PrincipalCustomerInvalid", scheduler.Principal{CustomerID: "acme.corp"}, scheduler.ScheduleRequest{}, aggregate.ErrInvalid},
		{"CustomerNamesAnother", acme, scheduler.ScheduleRequest{CustomerID: "globex"}, aggregate.ErrInvalid},
		{"RequestIDInvalid", operator, scheduler.ScheduleRequest{RequestID: "req 1"}, aggregate.ErrInvalid},
		{"RequestIDTooLong", operator, scheduler.ScheduleRequest{RequestID: longID}, aggregate.ErrInvalid},
		{"ParentIDWildcard", operator, scheduler.ScheduleRequest{ParentID: "*"}, aggregate.ErrInvalid},
		{"ParentIDTail", operator, scheduler.ScheduleRequest{ParentID: ">"}, aggregate.ErrInvalid},
		{"ParentIDTooLong", operator, scheduler.ScheduleRequest{ParentID: longID}, aggregate.ErrInvalid},
		{"RelatedTaskIDInvalid", operator, scheduler.ScheduleRequest{RelatedTaskID: "a.b"}, aggregate.ErrInvalid},
		{"QueueInvalid", operator, scheduler.ScheduleRequest{Queue: "q.>"}, aggregate.ErrInvalid},
		{"QueueTooLong", operator, scheduler.ScheduleRequest{Queue: longID}, aggregate.ErrInvalid},
		{"MessageIDInvalid", operator, scheduler.ScheduleRequest{Message: text("m 1", "hi")}, aggregate.ErrInvalid},
		{"MessageTooLarge", operator, scheduler.ScheduleRequest{Message: tooBig}, aggregate.ErrInvalid},
		{"TimeoutZero", operator, scheduler.ScheduleRequest{TimeoutSeconds: new(0)}, aggregate.ErrInvalid},
		{"TimeoutNegative", operator, scheduler.ScheduleRequest{TimeoutSeconds: new(-1)}, aggregate.ErrInvalid},
		{"TimeoutTooLong", operator, scheduler.ScheduleRequest{TimeoutSeconds: new(events.MaxTimeoutSeconds + 1)}, aggregate.ErrInvalid},
		{"RunAtBefore1970", operator, scheduler.ScheduleRequest{RunAt: new(time.Unix(-1, 0))}, aggregate.ErrInvalid},
		{"RunAtOverAYearAhead", operator, scheduler.ScheduleRequest{RunAt: new(now.Add((yearSeconds + 3600) * time.Second))}, aggregate.ErrInvalid},
		{"DelayNegative", operator, scheduler.ScheduleRequest{DelaySeconds: new(-0.5)}, aggregate.ErrInvalid},
		{"DelayOverAYear", operator, scheduler.ScheduleRequest{DelaySeconds: new(float64(yearSeconds) + 1)}, aggregate.ErrInvalid},
		{"DelayInfinite", operator, scheduler.ScheduleRequest{DelaySeconds: new(math.Inf(1))}, aggregate.ErrInvalid},
		{"DelayNaN", operator, scheduler.ScheduleRequest{DelaySeconds: new(math.NaN())}, aggregate.ErrInvalid},
		{"RunAtAndDelay", operator, scheduler.ScheduleRequest{RunAt: new(now), DelaySeconds: new(0.0)}, aggregate.ErrInvalid},
		{"ParentNotFound", operator, scheduler.ScheduleRequest{ParentID: "no-such-task"}, aggregate.ErrNotFound},
		{"CustomerParentNotFound", acme, scheduler.ScheduleRequest{ParentID: "no-such-task"}, aggregate.ErrNotFound},
		{"RelatedTaskNotFound", operator, scheduler.ScheduleRequest{RelatedTaskID: strings.Repeat("t", events.MaxIDLen)}, aggregate.ErrNotFound},
		{"CustomerRelatedTaskNotFound", acme, scheduler.ScheduleRequest{RelatedTaskID: "no-such-task"}, aggregate.ErrNotFound},
		{"SignalURITooLong", operator, scheduler.ScheduleRequest{Signal: events.Signal{URI: strings.Repeat("u", events.MaxURLBytes+1)}}, aggregate.ErrInvalid},
		{"RepoTooLong", operator, scheduler.ScheduleRequest{Repo: strings.Repeat("r", events.MaxURLBytes+1)}, aggregate.ErrInvalid},
		{"EmptyContentPart", operator, scheduler.ScheduleRequest{Message: text("", "")}, aggregate.ErrInvalid},
	}
	t.Run("Rejected", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				req := c.req
				if req.RequestID == "" {
					req.RequestID = "req-" + c.name
				}
				st, created, err := n.Service.Schedule(ctx, c.p, req)
				requireIs(t, err, c.want)
				if created || st.Exists() {
					t.Fatalf("a refused schedule answered created %v, task %+v", created, st)
				}
				wouldBe := events.DeriveID("r", wouldBeCustomer(c.p, req), req.RequestID)
				_, err = n.Service.Get(ctx, operator, wouldBe)
				requireIs(t, err, aggregate.ErrNotFound)
			})
		}
	})
	if got := streamMsgs(t, n); got != 0 {
		t.Fatalf("refused schedules wrote %d events", got)
	}
	if page, _, err := n.Service.List(ctx, operator, scheduler.TaskFilter{}, "", 10); err != nil || len(page) != 0 {
		t.Fatalf("list after refused schedules: %d tasks, %v; want none", len(page), err)
	}

	// Each limit is inclusive: its edge is accepted.
	t.Run("EdgesAccepted", func(t *testing.T) {
		edges := []struct {
			name  string
			p     scheduler.Principal
			req   scheduler.ScheduleRequest
			check func(t *testing.T, st aggregate.State)
		}{
			{"LongestIDs", operator, scheduler.ScheduleRequest{
				CustomerID: strings.Repeat("c", events.MaxIDLen), RequestID: strings.Repeat("r", events.MaxIDLen),
				Queue: strings.Repeat("q", events.MaxIDLen),
			}, func(t *testing.T, st aggregate.State) {
				if st.CustomerID != strings.Repeat("c", events.MaxIDLen) || st.Spec.Queue != strings.Repeat("q", events.MaxIDLen) {
					t.Fatalf("task %+v", st)
				}
			}},
			{"CustomerNamesItself", acme, scheduler.ScheduleRequest{CustomerID: "acme"}, func(t *testing.T, st aggregate.State) {
				if st.CustomerID != "acme" {
					t.Fatalf("customer %q, want acme", st.CustomerID)
				}
			}},
			{"LargestMessage", operator, scheduler.ScheduleRequest{
				Message: text("m-1", strings.Repeat("x", events.MaxMessageBytes-len("text"))),
			}, func(t *testing.T, st aggregate.State) {
				if aggregate.MessageSize(st.Spec.Message) != events.MaxMessageBytes {
					t.Fatalf("stored message is %d bytes", aggregate.MessageSize(st.Spec.Message))
				}
			}},
			{"ShortestTimeout", operator, scheduler.ScheduleRequest{TimeoutSeconds: new(events.MinTimeoutSeconds)}, func(t *testing.T, st aggregate.State) {
				if st.Spec.TimeoutSeconds != events.MinTimeoutSeconds {
					t.Fatalf("timeout %d", st.Spec.TimeoutSeconds)
				}
			}},
			{"LongestTimeout", operator, scheduler.ScheduleRequest{TimeoutSeconds: new(events.MaxTimeoutSeconds)}, func(t *testing.T, st aggregate.State) {
				if st.Spec.TimeoutSeconds != events.MaxTimeoutSeconds {
					t.Fatalf("timeout %d", st.Spec.TimeoutSeconds)
				}
			}},
			{"RunAt1970", operator, scheduler.ScheduleRequest{RunAt: new(time.Unix(0, 0))}, func(t *testing.T, st aggregate.State) {
				if !st.Spec.RunAt.Equal(time.Unix(0, 0)) {
					t.Fatalf("runAt %v", st.Spec.RunAt)
				}
			}},
			{"RunAtAlmostAYearAhead", operator, scheduler.ScheduleRequest{RunAt: new(now.Add((yearSeconds - 60) * time.Second))}, func(t *testing.T, st aggregate.State) {
				if !st.Spec.RunAt.Equal(now.Add((yearSeconds - 60) * time.Second)) {
					t.Fatalf("runAt %v", st.Spec.RunAt)
				}
			}},
			{"DelayZero", operator, scheduler.ScheduleRequest{DelaySeconds: new(0.0)}, func(t *testing.T, st aggregate.State) {
				if st.Spec.RunAt.Before(now) || st.Spec.RunAt.After(time.Now()) {
					t.Fatalf("runAt %v, want about now", st.Spec.RunAt)
				}
			}},
			{"DelayAYear", operator, scheduler.ScheduleRequest{DelaySeconds: new(float64(yearSeconds))}, func(t *testing.T, st aggregate.State) {
				if d := st.Spec.RunAt.Sub(st.CreatedAt); d < (yearSeconds-60)*time.Second || d > yearSeconds*time.Second {
					t.Fatalf("runAt %v is %v after creation, want a year", st.Spec.RunAt, d)
				}
			}},
			{"Defaults", operator, scheduler.ScheduleRequest{}, func(t *testing.T, st aggregate.State) {
				if st.CustomerID != "default" || st.Spec.Queue != "default" || st.Spec.TimeoutSeconds != events.DefaultTimeoutSeconds ||
					st.Spec.RootID != st.TaskID || st.Spec.ParentID != "" || st.Spec.Message.CreatedAt.IsZero() {
					t.Fatalf("defaults: %+v", st)
				}
			}},
		}
		for _, c := range edges {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				st := mustSchedule(t, n, c.p, c.req)
				c.check(t, st)
				if got := get(t, n, st.TaskID); !got.Spec.RunAt.Equal(st.Spec.RunAt) || got.CustomerID != st.CustomerID ||
					got.Spec.TimeoutSeconds != st.Spec.TimeoutSeconds || got.Spec.Queue != st.Spec.Queue {
					t.Fatalf("stored task %s (customer %q, runAt %v) differs from the answer (customer %q, runAt %v)",
						got.TaskID, got.CustomerID, got.Spec.RunAt, st.CustomerID, st.Spec.RunAt)
				}
			})
		}
	})
}

func TestScheduleIdempotent(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()

	t.Run("SameRequestSameTask", func(t *testing.T) {
		t.Parallel()
		first := idle(t, n, acme, scheduler.ScheduleRequest{RequestID: "once", Queue: "first", Message: text("", "first")})
		again, created, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{RequestID: "once", Queue: "second", Message: text("", "second")})
		if err != nil {
			t.Fatal(err)
		}
		if created || again.TaskID != first.TaskID || again.Version != first.Version || again.Spec.Queue != "first" {
			t.Fatalf("repeat answered created %v, task %s v%d queue %q; want the first task %s v%d unchanged",
				created, again.TaskID, again.Version, again.Spec.Queue, first.TaskID, first.Version)
		}
		if h := types(history(t, n, first.TaskID)); len(h) != 1 {
			t.Fatalf("history after the repeat: %v", h)
		}
	})

	t.Run("InvalidRepeatRefused", func(t *testing.T) {
		t.Parallel()
		idle(t, n, acme, scheduler.ScheduleRequest{RequestID: "valid-once"})
		zero := 0
		_, _, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{RequestID: "valid-once", TimeoutSeconds: &zero})
		if !errors.Is(err, aggregate.ErrInvalid) {
			t.Fatalf("repeat with timeoutSeconds 0: %v, want ErrInvalid", err)
		}
	})

	t.Run("RequestIDPerCustomer", func(t *testing.T) {
		t.Parallel()
		a := idle(t, n, acme, scheduler.ScheduleRequest{RequestID: "shared"})
		g := idle(t, n, globex, scheduler.ScheduleRequest{RequestID: "shared"})
		if a.TaskID == g.TaskID {
			t.Fatalf("two customers' request ids named one task %s", a.TaskID)
		}
	})

	t.Run("NoRequestIDNewTasks", func(t *testing.T) {
		t.Parallel()
		a := idle(t, n, acme, scheduler.ScheduleRequest{})
		b := idle(t, n, acme, scheduler.ScheduleRequest{})
		if a.TaskID == b.TaskID {
			t.Fatal("two requests without request id made one task")
		}
	})

	t.Run("RacingRetriesOneTask", func(t *testing.T) {
		t.Parallel()
		const racers = 16
		var created atomic.Int32
		taskIDs := make([]string, racers)
		var g errgroup.Group
		for i := range racers {
			g.Go(func() error {
				st, c, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{RequestID: "race", DelaySeconds: new(later)})
				if c {
					created.Add(1)
				}
				taskIDs[i] = st.TaskID
				return err
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		if got := created.Load(); got != 1 {
			t.Fatalf("%d racers created the task, want 1", got)
		}
		for _, id := range taskIDs {
			if id != taskIDs[0] || id == "" {
				t.Fatalf("racers answered tasks %v, want one", taskIDs)
			}
		}
		if h := types(history(t, n, taskIDs[0])); len(h) != 1 || h[0] != events.TypeTaskScheduled {
			t.Fatalf("history of the raced task: %v, want one TaskScheduled", h)
		}
	})
}

func TestScheduleChild(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()

	t.Run("LineageIDs", func(t *testing.T) {
		t.Parallel()
		root := idle(t, n, acme, scheduler.ScheduleRequest{})
		child := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: root.TaskID})
		grandchild := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: child.TaskID})
		if child.Spec.ParentID != root.TaskID || child.Spec.RootID != root.TaskID ||
			grandchild.Spec.ParentID != child.TaskID || grandchild.Spec.RootID != root.TaskID {
			t.Fatalf("child %+v, grandchild %+v of root %s", child.Spec, grandchild.Spec, root.TaskID)
		}
	})

	t.Run("ParentOfAnotherCustomer", func(t *testing.T) {
		t.Parallel()
		root := idle(t, n, acme, scheduler.ScheduleRequest{})
		for _, c := range []struct {
			name string
			p    scheduler.Principal
			req  scheduler.ScheduleRequest
		}{
			{"Customer", globex, scheduler.ScheduleRequest{ParentID: root.TaskID, RequestID: "foreign"}},
			{"OperatorForAnother", operator, scheduler.ScheduleRequest{CustomerID: "globex", ParentID: root.TaskID, RequestID: "foreign"}},
		} {
			_, _, err := n.Service.Schedule(ctx, c.p, c.req)
			requireIs(t, err, aggregate.ErrNotFound)
			if _, err := n.Service.Get(ctx, operator, events.DeriveID("r", "globex", "foreign")); err == nil {
				t.Fatalf("%s: a refused child was written", c.name)
			}
		}
		if kids := n.Engine.Children(root.TaskID); len(kids) != 0 {
			t.Fatalf("root has children %v", kids)
		}
	})

	t.Run("TerminalParent", func(t *testing.T) {
		t.Parallel()
		root := idle(t, n, acme, scheduler.ScheduleRequest{})
		before := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: root.TaskID, RequestID: "child-before"})
		if _, err := n.Service.Cancel(ctx, acme, root.TaskID, "done"); err != nil {
			t.Fatal(err)
		}
		for _, reqID := range []string{"child-after", ""} {
			st, created, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{ParentID: root.TaskID, RequestID: reqID})
			requireIs(t, err, scheduler.ErrParentTerminal)
			if created || st.Exists() {
				t.Fatalf("refused child: created %v, task %+v", created, st)
			}
		}
		if _, err := n.Service.Get(ctx, operator, events.DeriveID("r", "acme", "child-after")); err == nil {
			t.Fatal("a child of a terminal parent was written")
		}
		if kids := n.Engine.Children(root.TaskID); len(kids) != 1 || kids[0] != before.TaskID {
			t.Fatalf("children of the terminal parent: %v, want only %s", kids, before.TaskID)
		}

		// A retry of a child created before the parent ended answers it.
		again, created, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{ParentID: root.TaskID, RequestID: "child-before"})
		if err != nil || created || again.TaskID != before.TaskID {
			t.Fatalf("retry of the earlier child: task %s created %v err %v, want %s", again.TaskID, created, err, before.TaskID)
		}
	})
}

// TestListLimit refuses page sizes outside 1..MaxListLimit (they would
// cut the page at a negative index) and pages through every task.
func TestListLimit(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	for _, limit := range []int{0, -1, api.MaxListLimit + 1} {
		if _, _, err := n.Service.List(ctx, operator, scheduler.TaskFilter{}, "", limit); !errors.Is(err, aggregate.ErrInvalid) {
			t.Fatalf("List with limit %d = %v, want ErrInvalid", limit, err)
		}
	}
	for range 3 {
		if _, _, err := n.Service.Schedule(ctx, operator, scheduler.ScheduleRequest{DelaySeconds: new(3600.0)}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	for after := ""; ; {
		page, next, err := n.Service.List(ctx, operator, scheduler.TaskFilter{}, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range page {
			seen = append(seen, st.TaskID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if len(seen) != 3 || !slices.IsSorted(seen) {
		t.Fatalf("paged through %v, want 3 tasks in id order", seen)
	}
}

// TestGetScheduleBeforeProjections reads a schedule through a service
// whose projections have not applied the log yet (a node catching up
// after a restart): it is answered from the log, without runs, instead
// of a false not_found; one the log does not hold either is not_found;
// the listings are unavailable until the views catch up.
func TestGetScheduleBeforeProjections(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	if _, _, err := n.Service.CreateSchedule(ctx, acme, scheduler.CreateScheduleRequest{ID: "early", Every: "1h", Paused: true}); err != nil {
		t.Fatal(err)
	}
	fresh, err := projections.New(projections.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := scheduler.New(scheduler.Config{Store: n.Store, Views: fresh, JS: n.Store.JetStream(), Subjects: n.NS.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	v, err := svc.GetSchedule(ctx, acme, "", "early")
	if err != nil {
		t.Fatal(err)
	}
	if v.State.ID != "early" || v.State.CustomerID != "acme" || !v.State.Paused || len(v.Runs) != 0 {
		t.Fatalf("schedule from the log: %+v", v)
	}
	if _, err := svc.GetSchedule(ctx, acme, "", "never"); !errors.Is(err, aggregate.ErrNotFound) {
		t.Fatalf("unknown schedule: %v, want ErrNotFound", err)
	}
	if _, err := svc.GetSchedule(ctx, scheduler.Principal{CustomerID: "globex"}, "", "early"); !errors.Is(err, aggregate.ErrNotFound) {
		t.Fatalf("another customer's schedule: %v, want ErrNotFound", err)
	}
	// The listings read only the views: refused until they catch up,
	// rather than answered without what they have not applied yet.
	if _, _, err := svc.ListSchedules(acme, "", "", 10); !errors.Is(err, scheduler.ErrUnavailable) {
		t.Fatalf("schedules listed before the projections caught up: %v, want ErrUnavailable", err)
	}
	if _, _, err := svc.List(ctx, acme, scheduler.TaskFilter{}, "", 10); !errors.Is(err, scheduler.ErrUnavailable) {
		t.Fatalf("tasks listed before the projections caught up: %v, want ErrUnavailable", err)
	}
	if l, _, err := n.Service.ListSchedules(acme, "", "", 10); err != nil || len(l) != 1 {
		t.Fatalf("the caught-up node's schedules: %d, %v", len(l), err)
	}
}

// TestFireScheduleNothingDue: fired while the log has nothing due (the
// alarm's projections were early, or lagged a fire), FireSchedule appends
// nothing and answers the log's next instant, for the alarm to come back
// then; a paused schedule has none.
func TestFireScheduleNothingDue(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	sc, _, err := n.Service.CreateSchedule(ctx, acme, scheduler.CreateScheduleRequest{ID: "hourly", Every: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	before := streamMsgs(t, n)
	seq, next, err := n.Service.FireSchedule(ctx, "acme", "hourly")
	if err != nil || seq != sc.State.LastSeq || !next.Equal(sc.State.Next()) || next.IsZero() {
		t.Fatalf("FireSchedule: seq %d next %v (%v), want seq %d next %v", seq, next, err, sc.State.LastSeq, sc.State.Next())
	}
	if after := streamMsgs(t, n); after != before {
		t.Fatalf("FireSchedule with nothing due appended %d events", after-before)
	}
	if _, err := n.Service.ScheduleAction(ctx, acme, "", "hourly", aggregate.PauseSchedule{}); err != nil {
		t.Fatal(err)
	}
	if _, next, err := n.Service.FireSchedule(ctx, "acme", "hourly"); err != nil || !next.IsZero() {
		t.Fatalf("FireSchedule of a paused schedule: next %v (%v), want none", next, err)
	}
}
