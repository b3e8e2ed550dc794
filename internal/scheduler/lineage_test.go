package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
)

// shape renders a tree as nested task names, children in order.
func shape(n scheduler.Node, names map[string]string) string {
	s := names[n.Task.TaskID]
	if s == "" {
		s = "?" + n.Task.TaskID
	}
	if len(n.Children) == 0 {
		return s
	}
	kids := make([]string, len(n.Children))
	for i, c := range n.Children {
		kids[i] = shape(c, names)
	}
	return fmt.Sprintf("%s%v", s, kids)
}

func TestLineage(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()

	// root ─┬─ c1 ─┬─ g1
	//       │      └─ g2
	//       └─ c2
	// Every task stays scheduled, so only these calls append events, and
	// the alarm's report of g1's end to c1's mailbox.
	names := map[string]string{}
	schedule := func(name, parent string) string {
		st := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: parent, Message: text("", "objective of "+name)})
		names[st.TaskID] = name
		return st.TaskID
	}
	root := schedule("root", "")
	c1 := schedule("c1", root)
	c2 := schedule("c2", root)
	g1 := schedule("g1", c1)
	g2 := schedule("g2", c1)
	if _, _, err := n.Service.AppendMail(ctx, acme, c1, text("note", "more work")); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Service.Cancel(ctx, acme, g1, "not needed"); err != nil {
		t.Fatal(err)
	}
	testnode.Eventually(t, "g1's end reported to c1", func() bool {
		return get(t, n, c1).MailIndex(events.ChildResultID(g1)) == 2
	})
	other := idle(t, n, acme, scheduler.ScheduleRequest{}) // another lineage
	idle(t, n, acme, scheduler.ScheduleRequest{ParentID: other.TaskID})

	t.Run("TreeFromAnyMember", func(t *testing.T) {
		t.Parallel()
		const want = "root[c1[g1 g2] c2]"
		for _, id := range []string{root, c1, c2, g1, g2} {
			tree, err := n.Service.Tree(ctx, acme, id)
			if err != nil {
				t.Fatalf("tree of %s: %v", names[id], err)
			}
			if got := shape(tree, names); got != want {
				t.Fatalf("tree of %s: %s, want %s", names[id], got, want)
			}
			g := tree.Children[0].Children[0]
			if g.Task.Status != "canceled" || g.Task.Spec.Message.Content[0].Text != "objective of g1" {
				t.Fatalf("g1 in the tree: status %s spec %+v", g.Task.Status, g.Task.Spec.Message)
			}
		}
	})

	t.Run("LineageHistoryInLogOrder", func(t *testing.T) {
		t.Parallel()
		want := []string{
			"root TaskScheduled", "c1 TaskScheduled", "c2 TaskScheduled", "g1 TaskScheduled", "g2 TaskScheduled",
			"c1 MailboxAppended", "g1 Canceled", "c1 MailboxAppended",
		}
		for _, id := range []string{root, g2} {
			evs, err := n.Service.LineageHistory(ctx, acme, id)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]string, len(evs))
			for i, ev := range evs {
				got[i] = names[ev.TaskID] + " " + string(ev.Type())
				if i > 0 && ev.Seq <= evs[i-1].Seq {
					t.Fatalf("lineage history of %s out of log order at %d: seq %d after %d", names[id], i, ev.Seq, evs[i-1].Seq)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("lineage history of %s:\n got %v\nwant %v", names[id], got, want)
			}
		}
	})

	t.Run("HistoryIsOneTask", func(t *testing.T) {
		t.Parallel()
		want := []events.Type{events.TypeTaskScheduled, events.TypeMailboxAppended, events.TypeMailboxAppended}
		if got := types(history(t, n, c1)); !slices.Equal(got, want) {
			t.Fatalf("history of c1: %v", got)
		}
	})
}
