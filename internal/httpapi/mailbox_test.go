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

		ch, err := b.client.Check(ctx, task.ID)
		if err != nil || ch.ShouldStop || ch.Reason != "active" || ch.Cursor != 3 || !slices.Equal(mailIDs(ch.Messages), []string{"m1", "m2", "m3"}) {
			t.Fatalf("first check: %v %+v", err, ch)
		}
		wantText := map[string]string{"m1": "note m1", "m2": "note m2", "m3": "x"}
		for i, m := range ch.Messages {
			if m.Index != i+1 || m.CreatedAt.IsZero() || len(m.Content) != 1 || m.Content[0].Text != wantText[m.ID] {
				t.Fatalf("checked message %d: %+v", i, m)
			}
		}
		ch, err = b.client.Check(ctx, task.ID)
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

	t.Run("TwoMessagesThenCheck", func(t *testing.T) {
		t.Parallel()
		task := queuedTask(t, b, api.ScheduleRequest{Queue: "mail"})
		for _, id := range []string{"first", "second"} {
			if _, err := b.client.AppendMail(ctx, task.ID, text(id, id)); err != nil {
				t.Fatal(err)
			}
		}
		ch, err := b.client.Check(ctx, task.ID)
		if err != nil || ch.Cursor != 2 || !slices.Equal(mailIDs(ch.Messages), []string{"first", "second"}) {
			t.Fatalf("first check: %v %+v", err, ch)
		}
		ch, err = b.client.Check(ctx, task.ID)
		if err != nil || ch.Cursor != 2 || len(ch.Messages) != 0 {
			t.Fatalf("second check: %v %+v", err, ch)
		}
		mail, err := b.client.Mailbox(ctx, task.ID, 1)
		if err != nil || !slices.Equal(mailIDs(mail.Messages), []string{"second"}) || mail.Cursor != 2 {
			t.Fatalf("mailbox after=1: %v %+v", err, mail)
		}
		ch, err = b.client.Check(ctx, task.ID)
		if err != nil || ch.Cursor != 2 || len(ch.Messages) != 0 {
			t.Fatalf("check after reading the mailbox: %v %+v", err, ch)
		}
	})

	t.Run("RepeatedMessageIDIsNoOp", func(t *testing.T) {
		t.Parallel()
		task := queuedTask(t, b, api.ScheduleRequest{Queue: "mail"})
		for _, id := range []string{"a", "b"} {
			if _, err := b.client.AppendMail(ctx, task.ID, text(id, "original "+id)); err != nil {
				t.Fatal(err)
			}
		}
		version := len(historyTypes(t, b, task.ID))
		a, err := b.client.AppendMail(ctx, task.ID, text("a", "a different text"))
		if err != nil || a.MessageID != "a" || a.Index != 1 {
			t.Fatalf("repeated id: %v %+v, want 202 with index 1", err, a)
		}
		raw := rawDo(t, b, http.MethodPost, "/v1/tasks/"+task.ID+"/mailbox", `{"message":{"id":"b","content":[]}}`)
		if raw.status != http.StatusAccepted {
			t.Fatalf("raw repeated id: %d %s, want 202", raw.status, raw.body)
		}
		if n := len(historyTypes(t, b, task.ID)); n != version {
			t.Fatalf("repeated ids appended: history has %d events, want %d", n, version)
		}
		mail, err := b.client.Mailbox(ctx, task.ID, 0)
		if err != nil || len(mail.Messages) != 2 || mail.Messages[0].Content[0].Text != "original a" {
			t.Fatalf("mailbox after repeats: %v %+v", err, mail)
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

	t.Run("TerminalTaskRefusesNewMessages", func(t *testing.T) {
		t.Parallel()
		task := runningTask(t, b, api.ScheduleRequest{Queue: "mail"})
		if _, err := b.client.AppendMail(ctx, task.ID, text("old", "before the end")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
			t.Fatal(err)
		}
		version := len(historyTypes(t, b, task.ID))
		_, err := b.client.AppendMail(ctx, task.ID, text("new", "after the end"))
		apiError(t, err, http.StatusConflict, "terminal")
		a, err := b.client.AppendMail(ctx, task.ID, text("old", "before the end"))
		if err != nil || a.MessageID != "old" || a.Index != 1 {
			t.Fatalf("repeated id on a terminal task: %v %+v, want 202 with index 1", err, a)
		}
		if n := len(historyTypes(t, b, task.ID)); n != version {
			t.Fatalf("history has %d events, want %d", n, version)
		}
		// The executor still collects the message with its stop answer.
		ch, err := b.client.Check(ctx, task.ID)
		if err != nil || !ch.ShouldStop || ch.Reason != "terminal" || ch.Cursor != 1 || !slices.Equal(mailIDs(ch.Messages), []string{"old"}) {
			t.Fatalf("check on a terminal task with an unread message: %v %+v", err, ch)
		}
	})

	t.Run("MissingTask", func(t *testing.T) {
		t.Parallel()
		_, err := b.client.AppendMail(ctx, "no-such-task", text("m", "x"))
		apiError(t, err, http.StatusNotFound, "")
		_, err = b.client.Mailbox(ctx, "no-such-task", 0)
		apiError(t, err, http.StatusNotFound, "")
	})
}

func TestCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

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

	t.Run("ActiveTaskContinues", func(t *testing.T) {
		t.Parallel()
		task := mustSchedule(t, b, api.ScheduleRequest{Queue: "check"})
		ch, err := b.client.Check(ctx, task.ID)
		if err != nil || ch.ShouldStop || ch.Reason != "active" || ch.Messages == nil || ch.Cursor != 0 {
			t.Fatalf("check on an active task: %v %+v", err, ch)
		}
	})
}
