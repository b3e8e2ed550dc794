package scheduler_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
)

// check runs a token-less stop check (a peek) as p and fails the test on
// an error.
func check(t *testing.T, n *testnode.Node, p scheduler.Principal, id string) scheduler.CheckResult {
	t.Helper()
	return checkAs(t, n, p, id, "")
}

// checkAs runs a stop check as p with delivery token deliveryID and fails
// the test on an error.
func checkAs(t *testing.T, n *testnode.Node, p scheduler.Principal, id, deliveryID string) scheduler.CheckResult {
	t.Helper()
	res, err := n.Service.Check(context.Background(), p, id, deliveryID)
	if err != nil {
		t.Fatalf("check %s: %v", id, err)
	}
	return res
}

// requireCheck asserts a check's stop decision and reason.
func requireCheck(t *testing.T, res scheduler.CheckResult, stop bool, reason string) {
	t.Helper()
	if res.ShouldStop != stop || res.Reason != reason {
		t.Fatalf("check answered stop %v reason %q, want stop %v reason %q", res.ShouldStop, res.Reason, stop, reason)
	}
}

// mailIndexes returns the ids and indexes of mail items, "id@index".
func mailIndexes(items []scheduler.MailItem) []string {
	out := make([]string, len(items))
	for i, m := range items {
		out[i] = m.Message.ID + "@" + strconv.Itoa(m.Index)
	}
	return out
}

// appendMail appends a message as p and requires its index.
func appendMail(t *testing.T, n *testnode.Node, p scheduler.Principal, id, msgID string, wantIndex int) {
	t.Helper()
	gotID, index, err := n.Service.AppendMail(context.Background(), p, id, text(msgID, "note "+msgID))
	if err != nil {
		t.Fatalf("append %s to %s: %v", msgID, id, err)
	}
	if gotID != msgID || index != wantIndex {
		t.Fatalf("append %s: id %q index %d, want index %d", msgID, gotID, index, wantIndex)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()

	t.Run("Active", func(t *testing.T) {
		t.Parallel()
		st := idle(t, n, acme, scheduler.ScheduleRequest{})
		res := check(t, n, acme, st.TaskID)
		requireCheck(t, res, false, api.ReasonActive)
		if len(res.Messages) != 0 || res.Cursor != 0 {
			t.Fatalf("check of a task without mail: %+v", res)
		}
	})

	t.Run("Terminal", func(t *testing.T) {
		t.Parallel()
		st := idle(t, n, acme, scheduler.ScheduleRequest{})
		if _, err := n.Service.Cancel(ctx, acme, st.TaskID, "stop"); err != nil {
			t.Fatal(err)
		}
		requireCheck(t, check(t, n, acme, st.TaskID), true, api.ReasonTerminal)
	})

	t.Run("AncestorTerminal", func(t *testing.T) {
		t.Parallel()
		root := idle(t, n, acme, scheduler.ScheduleRequest{})
		child := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: root.TaskID})
		grandchild := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: child.TaskID})
		requireCheck(t, check(t, n, acme, grandchild.TaskID), false, api.ReasonActive)
		if _, err := n.Service.Cancel(ctx, acme, root.TaskID, "stop the lineage"); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{child.TaskID, grandchild.TaskID} {
			requireCheck(t, check(t, n, acme, id), true, api.ReasonAncestorTerminal)
			if st := get(t, n, id); st.Status.Terminal() {
				t.Fatalf("descendant %s is %s: the check should report the ancestor, not end it", id, st.Status)
			}
		}
	})

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		for _, p := range []scheduler.Principal{operator, acme} {
			requireCheck(t, check(t, n, p, "no-such-task"), true, api.ReasonMissing)
		}
		_, err := n.Service.Check(ctx, operator, "bad.id", "")
		requireIs(t, err, aggregate.ErrInvalid)
		_, err = n.Service.Check(ctx, operator, "no-such-task", "bad.token")
		requireIs(t, err, aggregate.ErrInvalid)
	})

	t.Run("MailboxCursor", func(t *testing.T) {
		t.Parallel()
		st := running(t, n, acme, scheduler.ScheduleRequest{})
		appendMail(t, n, acme, st.TaskID, "m1", 1)
		appendMail(t, n, acme, st.TaskID, "m2", 2)
		appendMail(t, n, acme, st.TaskID, "m1", 1) // a repeated message id is the same message

		// Mailbox reads do not move the cursor.
		items, cursor, err := n.Service.Mailbox(ctx, acme, st.TaskID, 0)
		if err != nil || !slices.Equal(mailIndexes(items), []string{"m1@1", "m2@2"}) || cursor != 0 {
			t.Fatalf("mailbox: %v cursor %d err %v, want m1@1 m2@2 at cursor 0", mailIndexes(items), cursor, err)
		}

		// A monitor's check without a token, or one with a token that is
		// not the claim's, peeks: the messages stay for the holder.
		for _, token := range []string{"", "not-the-claim"} {
			res := checkAs(t, n, acme, st.TaskID, token)
			requireCheck(t, res, false, api.ReasonActive)
			if got := mailIndexes(res.Messages); !slices.Equal(got, []string{"m1@1", "m2@2"}) || res.Cursor != 0 {
				t.Fatalf("check with token %q: %v cursor %d, want m1@1 m2@2 left at cursor 0", token, got, res.Cursor)
			}
		}

		res := checkAs(t, n, acme, st.TaskID, st.Claim.DeliveryID)
		requireCheck(t, res, false, api.ReasonActive)
		if got := mailIndexes(res.Messages); !slices.Equal(got, []string{"m1@1", "m2@2"}) || res.Cursor != 2 {
			t.Fatalf("holder's first check: %v cursor %d, want m1@1 m2@2 cursor 2", got, res.Cursor)
		}
		if res := checkAs(t, n, acme, st.TaskID, st.Claim.DeliveryID); len(res.Messages) != 0 || res.Cursor != 2 {
			t.Fatalf("holder's second check: %v cursor %d, want nothing new at cursor 2", mailIndexes(res.Messages), res.Cursor)
		}

		appendMail(t, n, acme, st.TaskID, "m3", 3)
		if res := check(t, n, acme, st.TaskID); !slices.Equal(mailIndexes(res.Messages), []string{"m3@3"}) || res.Cursor != 2 {
			t.Fatalf("monitor's check: %v cursor %d, want m3@3 left at cursor 2", mailIndexes(res.Messages), res.Cursor)
		}
		if res := checkAs(t, n, acme, st.TaskID, st.Claim.DeliveryID); !slices.Equal(mailIndexes(res.Messages), []string{"m3@3"}) || res.Cursor != 3 {
			t.Fatalf("third check: %v cursor %d, want m3@3 cursor 3", mailIndexes(res.Messages), res.Cursor)
		}
		items, cursor, err = n.Service.Mailbox(ctx, acme, st.TaskID, 1)
		if err != nil || !slices.Equal(mailIndexes(items), []string{"m2@2", "m3@3"}) || cursor != 3 {
			t.Fatalf("mailbox after 1: %v cursor %d err %v, want m2@2 m3@3 at cursor 3", mailIndexes(items), cursor, err)
		}
		if got := get(t, n, st.TaskID); got.Cursor != 3 {
			t.Fatalf("stored cursor %d, want 3", got.Cursor)
		}
	})

	t.Run("StopHandsOutPendingMail", func(t *testing.T) {
		t.Parallel()
		st := idle(t, n, acme, scheduler.ScheduleRequest{})
		appendMail(t, n, acme, st.TaskID, "last-words", 1)
		if _, err := n.Service.Cancel(ctx, acme, st.TaskID, "stop"); err != nil {
			t.Fatal(err)
		}
		_, _, err := n.Service.AppendMail(ctx, acme, st.TaskID, text("too-late", "x"))
		requireIs(t, err, aggregate.ErrTerminal)
		// A repeated message id answers its index even on a terminal task.
		appendMail(t, n, acme, st.TaskID, "last-words", 1)

		// No claim holds a terminal task: every check peeks, and each
		// hands out the last words.
		for range 2 {
			res := check(t, n, acme, st.TaskID)
			requireCheck(t, res, true, api.ReasonTerminal)
			if got := mailIndexes(res.Messages); !slices.Equal(got, []string{"last-words@1"}) || res.Cursor != 0 {
				t.Fatalf("stop check: %v cursor %d, want last-words@1 at cursor 0", got, res.Cursor)
			}
		}
	})
}
