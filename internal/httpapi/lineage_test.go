package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// TestLineage checks the wire form of a lineage: the tree answer, and a
// child's result delivered to its parent's mailbox and stop check, end to
// end. (The lineage rules, check reasons and the tree's shape from any
// member are internal/scheduler's TestScheduleChild, TestCheck and
// TestLineage.)
func TestLineage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("TreeAnswer", func(t *testing.T) {
		t.Parallel()
		root := mustSchedule(t, b, api.ScheduleRequest{Queue: "tree", Message: text("r", "root objective")})
		child := mustSchedule(t, b, api.ScheduleRequest{Queue: "tree", ParentID: root.ID, Message: text("c", "child objective")})
		grand := mustSchedule(t, b, api.ScheduleRequest{Queue: "tree", ParentID: child.ID, Message: text("g", "grandchild objective")})
		if child.ParentID != root.ID || child.RootID != root.ID || grand.ParentID != child.ID || grand.RootID != root.ID || root.RootID != root.ID {
			t.Fatalf("lineage: root %+v child %+v grandchild %+v", root, child, grand)
		}

		tree, err := b.client.Tree(ctx, grand.ID)
		if err != nil {
			t.Fatalf("tree from %s: %v", grand.ID, err)
		}
		if tree.Task.ID != root.ID || len(tree.Children) != 1 {
			t.Fatalf("tree: root node %+v with %d children", tree.Task, len(tree.Children))
		}
		c := tree.Children[0]
		if c.Task.ID != child.ID || len(c.Children) != 1 {
			t.Fatalf("tree: child node %+v with %d children", c.Task, len(c.Children))
		}
		g := c.Children[0]
		if g.Task.ID != grand.ID || g.Children == nil || len(g.Children) != 0 {
			t.Fatalf("tree: grandchild node %+v children %v", g.Task, g.Children)
		}
		if len(g.Task.Message.Content) != 1 || g.Task.Message.Content[0].Text != "grandchild objective" {
			t.Fatalf("tree: grandchild message %+v", g.Task.Message)
		}
		a := rawDo(t, b, http.MethodGet, "/v1/tasks/"+grand.ID+"/tree", "")
		var raw map[string]json.RawMessage
		if a.status != http.StatusOK || json.Unmarshal(a.body, &raw) != nil || raw["task"] == nil || raw["children"] == nil {
			t.Fatalf("raw tree answer: %d %s", a.status, a.body)
		}
	})

	t.Run("ChildResultReachesParentMailbox", func(t *testing.T) {
		t.Parallel()
		parent := mustSchedule(t, b, api.ScheduleRequest{Queue: "parents", Message: text("p", "delegate")})
		child := runningTask(t, b, api.ScheduleRequest{Queue: "kids", ParentID: parent.ID})
		if _, err := b.client.RecordResult(ctx, child.ID, api.ResultRequest{
			DeliveryID: child.Claim.DeliveryID, Success: true, Summary: "found the bug",
			Effects: []events.Effect{{Kind: "comment", Ref: "7"}},
		}); err != nil {
			t.Fatal(err)
		}

		wantID := "child-" + child.ID
		var mail api.Mail
		eventually(t, "child result in the parent's mailbox", func() bool {
			var err error
			mail, err = b.client.Mailbox(ctx, parent.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			return len(mail.Messages) > 0
		})
		if len(mail.Messages) != 1 || mail.Cursor != 0 {
			t.Fatalf("parent mailbox %+v, want one message and cursor 0", mail)
		}
		m := mail.Messages[0]
		if m.ID != wantID || m.Index != 1 || m.CreatedAt.IsZero() || len(m.Content) != 1 || m.Content[0].Type != "child_result" {
			t.Fatalf("child report %+v, want id %s with one child_result part", m, wantID)
		}
		var report struct {
			TaskID string         `json:"taskId"`
			Status string         `json:"status"`
			Result *events.Result `json:"result"`
		}
		if err := json.Unmarshal([]byte(m.Content[0].Text), &report); err != nil {
			t.Fatalf("child report text %q: %v", m.Content[0].Text, err)
		}
		requireSchema(t, "ChildResult", []byte(m.Content[0].Text))
		if report.TaskID != child.ID || report.Status != "succeeded" || report.Result == nil ||
			report.Result.Summary != "found the bug" || len(report.Result.Effects) != 1 {
			t.Fatalf("child report %+v", report)
		}

		// A stop check hands it out (no claim holds the parent: a peek).
		ch, err := b.client.Check(ctx, parent.ID, "")
		if err != nil || ch.ShouldStop || ch.Reason != "active" || ch.Cursor != 0 || len(ch.Messages) != 1 || ch.Messages[0].ID != wantID {
			t.Fatalf("parent check: %v %+v", err, ch)
		}
		if n := countType(t, b, parent.ID, "MailboxAppended"); n != 1 {
			t.Fatalf("%d MailboxAppended events on the parent, want 1", n)
		}
	})
}
