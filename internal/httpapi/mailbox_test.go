package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// TestMailbox checks the wire form of the mailbox routes: 202 with the
// message's id and index, ?after=, the check's messages, the task's
// mailbox counters; and that a message without an id gets one. (The
// cursor's rules, repeated ids and terminal tasks are internal/
// scheduler's TestCheck/MailboxCursor and StopHandsOutPendingMail; a
// missing task's 404 is TestBadRequestsChangeNothing's.)
func TestMailbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("CheckHandsOutEachMessageOnce", func(t *testing.T) {
		t.Parallel()
		task := runningTask(t, b, api.ScheduleRequest{Queue: "mail"})
		for i, id := range []string{"m1", "m2"} {
			a, err := b.client.AppendMail(ctx, task.ID, text(id, "note "+id))
			if err != nil || a.MessageID != id || a.Index != i+1 {
				t.Fatalf("append %s: %v %+v, want index %d", id, err, a, i+1)
			}
		}
		raw := rawDo(t, b, http.MethodPost, "/v1/tasks/"+task.ID+"/mailbox", `{"message":{"id":"m3","content":[{"type":"text","text":"x"}]}}`)
		var accepted api.MailAccepted
		if raw.status != http.StatusAccepted || json.Unmarshal(raw.body, &accepted) != nil || accepted.MessageID != "m3" || accepted.Index != 3 {
			t.Fatalf("raw append: %d %s, want 202 with messageId m3 index 3", raw.status, raw.body)
		}

		// Reading the mailbox does not move the cursor.
		mail, err := b.client.Mailbox(ctx, task.ID, 1)
		if err != nil || !slices.Equal(mailIDs(mail.Messages), []string{"m2", "m3"}) || mail.Cursor != 0 {
			t.Fatalf("mailbox after=1 before any check: %v %+v", err, mail)
		}
		if got, _ := b.client.Get(ctx, task.ID); got.Mailbox != (api.Mailbox{Count: 3, Cursor: 0}) {
			t.Fatalf("mailbox counters after a read: %+v", got.Mailbox)
		}

		// A monitor's check (no token) peeks: the messages stay.
		ch, err := b.client.Check(ctx, task.ID, "")
		if err != nil || ch.Cursor != 0 || !slices.Equal(mailIDs(ch.Messages), []string{"m1", "m2", "m3"}) {
			t.Fatalf("monitor's check: %v %+v", err, ch)
		}
		raw = rawDo(t, b, http.MethodPost, "/v1/tasks/"+task.ID+"/check", `{"deliveryId":"not-the-claim"}`)
		if raw.status != http.StatusOK || json.Unmarshal(raw.body, &ch) != nil || ch.Cursor != 0 || len(ch.Messages) != 3 {
			t.Fatalf("check with another token: %d %s, want 200 peeking all 3 at cursor 0", raw.status, raw.body)
		}
		raw = rawDo(t, b, http.MethodPost, "/v1/tasks/"+task.ID+"/check", `{"deliveryId":"bad.token"}`)
		if raw.status != http.StatusBadRequest {
			t.Fatalf("check with a malformed token: %d %s, want 400", raw.status, raw.body)
		}

		// The claim holder's check consumes them.
		ch, err = b.client.Check(ctx, task.ID, task.Claim.DeliveryID)
		if err != nil || ch.ShouldStop || ch.Reason != "active" || ch.Cursor != 3 || !slices.Equal(mailIDs(ch.Messages), []string{"m1", "m2", "m3"}) {
			t.Fatalf("first check: %v %+v", err, ch)
		}
		wantText := map[string]string{"m1": "note m1", "m2": "note m2", "m3": "x"}
		for i, m := range ch.Messages {
			if m.Index != i+1 || m.CreatedAt.IsZero() || len(m.Content) != 1 || m.Content[0].Text != wantText[m.ID] {
				t.Fatalf("checked message %d: %+v", i, m)
			}
		}
		ch, err = b.client.Check(ctx, task.ID, task.Claim.DeliveryID)
		if err != nil || ch.ShouldStop || ch.Cursor != 3 || len(ch.Messages) != 0 || ch.Messages == nil {
			t.Fatalf("second check: %v %+v, want no messages ([]) and cursor 3", err, ch)
		}

		mail, err = b.client.Mailbox(ctx, task.ID, 1)
		if err != nil || !slices.Equal(mailIDs(mail.Messages), []string{"m2", "m3"}) || mail.Cursor != 3 {
			t.Fatalf("mailbox after=1: %v %+v", err, mail)
		}
		mail, err = b.client.Mailbox(ctx, task.ID, 3)
		if err != nil || len(mail.Messages) != 0 || mail.Cursor != 3 {
			t.Fatalf("mailbox after=3: %v %+v", err, mail)
		}
		if got, _ := b.client.Get(ctx, task.ID); got.Mailbox != (api.Mailbox{Count: 3, Cursor: 3}) {
			t.Fatalf("mailbox counters after checks: %+v", got.Mailbox)
		}
		if n := countType(t, b, task.ID, "MailboxRead"); n != 1 {
			t.Fatalf("%d MailboxRead events, want 1 (a check with nothing new appends nothing)", n)
		}
	})

	t.Run("GeneratedMessageID", func(t *testing.T) {
		t.Parallel()
		task := queuedTask(t, b, api.ScheduleRequest{Queue: "mail"})
		a, err := b.client.AppendMail(ctx, task.ID, events.Message{Content: []events.ContentPart{{Type: "text", Text: "no id"}}})
		if err != nil || a.MessageID == "" || a.Index != 1 || events.ValidID(a.MessageID) != nil {
			t.Fatalf("append without id: %v %+v", err, a)
		}
		mail, err := b.client.Mailbox(ctx, task.ID, 0)
		if err != nil || len(mail.Messages) != 1 || mail.Messages[0].ID != a.MessageID {
			t.Fatalf("mailbox: %v %+v", err, mail)
		}
	})
}

// TestCheck checks the HTTP answers of the stop check: a missing task is
// a 200 answer, not a 404; a malformed id is a 400.
func TestCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("MissingTaskStops", func(t *testing.T) {
		t.Parallel()
		a := rawDo(t, b, http.MethodPost, "/v1/tasks/no-such-task/check", "")
		var ch api.Check
		if a.status != http.StatusOK || json.Unmarshal(a.body, &ch) != nil {
			t.Fatalf("check on a missing task: %d %s, want 200", a.status, a.body)
		}
		if !ch.ShouldStop || ch.Reason != "missing" || len(ch.Messages) != 0 || ch.Cursor != 0 {
			t.Fatalf("check on a missing task: %+v", ch)
		}
	})

	t.Run("MalformedIDIsInvalid", func(t *testing.T) {
		t.Parallel()
		for _, id := range []string{"bad.id", "bad*", "bad%3E", "bad%20id", strings.Repeat("a", 65)} {
			a := rawDo(t, b, http.MethodPost, "/v1/tasks/"+id+"/check", "")
			requireErrorBody(t, a, http.StatusBadRequest, "invalid_argument")
		}
	})
}
