package scheduler_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
)

func TestTenancy(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()

	// acme's queued root with a child and an unread mailbox message.
	root := claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "tenancy", Message: text("", "acme's secret")}).TaskID)
	child := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: root.TaskID})
	if _, _, err := n.Service.AppendMail(ctx, acme, root.TaskID, text("m1", "for acme's executor")); err != nil {
		t.Fatal(err)
	}
	theirs := idle(t, n, globex, scheduler.ScheduleRequest{})
	before := history(t, n, root.TaskID)

	t.Run("ForeignTaskNotFound", func(t *testing.T) {
		denied := []struct {
			name string
			call func() error
		}{
			{"Get", func() error { _, err := n.Service.Get(ctx, globex, root.TaskID); return err }},
			{"Claim", func() error {
				_, err := n.Service.Claim(ctx, globex, root.TaskID, root.Delivery.ID, "w1")
				return err
			}},
			{"RecordResult", func() error {
				_, err := n.Service.RecordResult(ctx, globex, root.TaskID, "", events.Result{Success: true})
				return err
			}},
			{"Cancel", func() error { _, err := n.Service.Cancel(ctx, globex, root.TaskID, "mine now"); return err }},
			{"AppendMail", func() error {
				_, _, err := n.Service.AppendMail(ctx, globex, root.TaskID, text("m2", "hello from globex"))
				return err
			}},
			{"Mailbox", func() error { _, _, err := n.Service.Mailbox(ctx, globex, root.TaskID, 0); return err }},
			{"History", func() error { _, err := n.Service.History(ctx, globex, root.TaskID); return err }},
			{"LineageHistory", func() error { _, err := n.Service.LineageHistory(ctx, globex, child.TaskID); return err }},
			{"Tree", func() error { _, err := n.Service.Tree(ctx, globex, child.TaskID); return err }},
			{"ScheduleChild", func() error {
				_, _, err := n.Service.Schedule(ctx, globex, scheduler.ScheduleRequest{ParentID: root.TaskID})
				return err
			}},
			{"CustomerEvents", func() error {
				return n.Service.CustomerEvents(ctx, globex, "acme", time.Time{}, func(events.Event) error {
					t.Error("globex read one of acme's events")
					return nil
				}, nil)
			}},
		}
		for _, c := range denied {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				requireIs(t, c.call(), aggregate.ErrNotFound)
			})
		}

		t.Run("Check", func(t *testing.T) {
			t.Parallel()
			res, err := n.Service.Check(ctx, globex, root.TaskID, "")
			if err != nil {
				t.Fatal(err)
			}
			if !res.ShouldStop || res.Reason != api.ReasonMissing || len(res.Messages) != 0 || res.Cursor != 0 {
				t.Fatalf("globex's check of acme's task: %+v, want stop (missing) without messages", res)
			}
		})

		t.Run("List", func(t *testing.T) {
			t.Parallel()
			for _, c := range []struct {
				f    scheduler.TaskFilter
				want []string
			}{
				{scheduler.TaskFilter{}, []string{theirs.TaskID}},
				{scheduler.TaskFilter{CustomerID: "acme"}, nil},
				{scheduler.TaskFilter{RootID: root.TaskID}, nil},
				{scheduler.TaskFilter{Queue: "tenancy"}, nil},
			} {
				page, next, err := n.Service.List(ctx, globex, c.f, "", 100)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, st := range page {
					got = append(got, st.TaskID)
				}
				if !slices.Equal(got, c.want) || next != "" {
					t.Fatalf("globex lists %v (next %q) with filter %+v, want %v", got, next, c.f, c.want)
				}
			}
		})
	})

	t.Run("ForeignCallsChangedNothing", func(t *testing.T) {
		after := history(t, n, root.TaskID)
		if !slices.Equal(types(after), types(before)) {
			t.Fatalf("history of acme's task went from %v to %v", types(before), types(after))
		}
		if st := get(t, n, root.TaskID); st.Status != aggregate.StatusQueued || st.Cursor != 0 || len(st.MailIDs) != 1 {
			t.Fatalf("acme's task: status %s cursor %d mail %v, want queued and unread", st.Status, st.Cursor, st.MailIDs)
		}
		if kids := n.Engine.Children(root.TaskID); len(kids) != 1 {
			t.Fatalf("acme's task has children %v, want only %s", kids, child.TaskID)
		}
	})

	t.Run("OwnerSees", func(t *testing.T) {
		if st, err := n.Service.Get(ctx, acme, root.TaskID); err != nil || st.TaskID != root.TaskID {
			t.Fatalf("acme's get: %s, %v", st.TaskID, err)
		}
		tree, err := n.Service.Tree(ctx, acme, child.TaskID)
		if err != nil || tree.Task.TaskID != root.TaskID || len(tree.Children) != 1 {
			t.Fatalf("acme's tree: %+v, %v", tree.Task.TaskID, err)
		}
		_, err = n.Service.Get(ctx, acme, theirs.TaskID)
		requireIs(t, err, aggregate.ErrNotFound)
		var own int
		err = n.Service.CustomerEvents(ctx, acme, "acme", time.Time{}, func(ev events.Event) error {
			if ev.CustomerID != "acme" {
				t.Fatalf("acme's customer events hold %s's event", ev.CustomerID)
			}
			own++
			return nil
		}, nil)
		if err != nil || own < len(before)+1 {
			t.Fatalf("acme's customer events: %d, %v; want at least %d", own, err, len(before)+1)
		}
		page, _, err := n.Service.List(ctx, acme, scheduler.TaskFilter{}, "", 100)
		if err != nil || len(page) != 2 {
			t.Fatalf("acme lists %d tasks (%v), want its 2", len(page), err)
		}
		res, err := n.Service.Check(ctx, acme, root.TaskID, "")
		if err != nil || res.ShouldStop || len(res.Messages) != 1 || res.Messages[0].Message.ID != "m1" {
			t.Fatalf("acme's check: %+v, %v; want continue with message m1", res, err)
		}
	})

	t.Run("OperatorSeesAll", func(t *testing.T) {
		page, _, err := n.Service.List(ctx, operator, scheduler.TaskFilter{}, "", 100)
		if err != nil || len(page) != 3 {
			t.Fatalf("operator lists %d tasks (%v), want 3", len(page), err)
		}
		for _, id := range []string{root.TaskID, child.TaskID, theirs.TaskID} {
			if _, err := n.Service.History(ctx, operator, id); err != nil {
				t.Fatalf("operator history of %s: %v", id, err)
			}
		}
		if _, err := n.Service.Tree(ctx, operator, child.TaskID); err != nil {
			t.Fatal(err)
		}
		if _, _, err := n.Service.Mailbox(ctx, operator, root.TaskID, 0); err != nil {
			t.Fatal(err)
		}
		st, err := n.Service.Claim(ctx, operator, root.TaskID, root.Delivery.ID, "ops")
		if err != nil || st.Status != aggregate.StatusRunning {
			t.Fatalf("operator's claim of acme's task: %s, %v", st.Status, err)
		}
		if _, err := n.Service.Cancel(ctx, operator, theirs.TaskID, "ops"); err != nil {
			t.Fatal(err)
		}
	})
}
