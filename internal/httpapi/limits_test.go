package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
)

// TestFieldLimits: each oversize or empty field a client controls, in a
// body under the 1 MiB body limit, is refused 400 and writes nothing.
func TestFieldLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := queuedTask(t, b, api.ScheduleRequest{})
	r := runningTask(t, b, api.ScheduleRequest{})
	settled(t, b)
	mb := strings.Repeat("x", 1_000_000)
	urls := make([]string, 32)
	for i := range urls {
		urls[i] = fmt.Sprintf(`{"kind":"link","url":"https://example.com/%s"}`, strings.Repeat("u", 32_000))
	}
	result, cancel, mailbox := "/v1/tasks/"+r.ID+"/result", "/v1/tasks/"+q.ID+"/cancel", "/v1/tasks/"+q.ID+"/mailbox"
	for _, tc := range []struct{ name, path, body string }{
		{"Error1MB", result, `{"success":false,"error":"` + mb + `"}`},
		{"CancelReason1MB", cancel, `{"reason":"` + mb + `"}`},
		{"EffectURLs32x32KB", result, `{"success":true,"effects":[` + strings.Join(urls, ",") + `]}`},
		{"SignalURI1MB", "/v1/tasks", `{"signal":{"uri":"` + mb + `"}}`},
		{"Repo1MB", "/v1/tasks", `{"repo":"` + mb + `"}`},
		{"EmptyMailboxBody", mailbox, `{"message":{"content":[]}}`},
		{"NoMailboxMessage", mailbox, `{}`},
		{"EmptyContentPart", mailbox, `{"message":{"content":[{"type":"text","text":""}]}}`},
		{"EmptyContentParts60000", "/v1/tasks", `{"message":{"content":[` + strings.Repeat(`{},`, 59_999) + `{}]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.body) >= api.MaxBodyBytes {
				t.Fatalf("body of %d bytes is not under the body limit", len(tc.body))
			}
			before := lastSeq(t, b)
			requireErrorBody(t, rawDo(t, b, http.MethodPost, tc.path, tc.body), http.StatusBadRequest, "invalid_argument")
			if after := lastSeq(t, b); after != before {
				t.Fatalf("the log grew from %d to %d", before, after)
			}
		})
	}
}

// TestLargestChildResultReachesParent: a child's result at every limit
// reaches its parent's mailbox, cut to fit and marked truncated, and the
// full result stays readable on the child.
func TestLargestChildResultReachesParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	parent := mustSchedule(t, b, api.ScheduleRequest{})
	child := runningTask(t, b, api.ScheduleRequest{ParentID: parent.ID})
	effects := make([]events.Effect, events.MaxEffects)
	for i := range effects {
		effects[i] = events.Effect{Kind: "link", Ref: fmt.Sprint(i), URL: "https://example.com/" + strings.Repeat("u", events.MaxURLBytes-20)}
	}
	full := api.ResultRequest{DeliveryID: child.Claim.DeliveryID, Success: true, Effects: effects,
		Summary: strings.Repeat("s", events.MaxSummaryBytes), Error: strings.Repeat("e", events.MaxErrorBytes)}
	if _, err := b.client.RecordResult(ctx, child.ID, full); err != nil {
		t.Fatal(err)
	}
	var report events.ChildResult
	eventually(t, "the parent heard", func() bool {
		m, err := b.client.Mailbox(ctx, parent.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Messages) == 0 {
			return false
		}
		if m.Messages[0].ID != events.ChildResultID(child.ID) {
			t.Fatalf("mailbox %+v, want the child's report", m.Messages)
		}
		if err := json.Unmarshal([]byte(m.Messages[0].Content[0].Text), &report); err != nil {
			t.Fatal(err)
		}
		return true
	})
	if !report.Truncated || report.TaskID != child.ID || report.Result == nil || !strings.HasPrefix(full.Summary, report.Result.Summary) {
		t.Fatalf("report %+v, want a truncated report of %s", report, child.ID)
	}
	got, err := b.client.Get(ctx, child.ID)
	if err != nil || got.Result.Summary != full.Summary || len(got.Result.Effects) != events.MaxEffects {
		t.Fatalf("the child's full result: %v", err)
	}
}

// TestEventTooLargeForTheLog: a request within every field limit whose
// event is larger than the log takes answers 413 naming the limit, with
// no Retry-After, and writes nothing.
func TestEventTooLargeForTheLog(t *testing.T) {
	t.Parallel()
	const limit = 16 << 10
	b := setup(t, func(c *node.Config) { c.MaxEventBytes = limit })
	settled(t, b)
	body := `{"message":{"content":[{"type":"text","text":"` + strings.Repeat("x", 20<<10) + `"}]}}`
	before := lastSeq(t, b)
	a := rawDo(t, b, http.MethodPost, "/v1/tasks", body)
	requireErrorBody(t, a, http.StatusRequestEntityTooLarge, "payload_too_large")
	if ra := a.header.Get("Retry-After"); ra != "" {
		t.Fatalf("Retry-After %q on a request that can never succeed", ra)
	}
	if !strings.Contains(string(a.body), fmt.Sprint(limit)) {
		t.Fatalf("error %s does not name the limit %d", a.body, limit)
	}
	if after := lastSeq(t, b); after != before {
		t.Fatalf("the log grew from %d to %d", before, after)
	}
	items, err := b.client.ScheduleBatch(context.Background(), []api.ScheduleRequest{
		{Message: text("", strings.Repeat("x", 20<<10))}, {Message: text("", "small")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if items[0].Status != http.StatusRequestEntityTooLarge || !errors.Is(items[0].Err(), api.ErrPayloadTooLarge) || items[1].Status != http.StatusCreated {
		t.Fatalf("batch items %+v, want 413 and 201", items)
	}
}

// TestRelatedTaskMustBeVisible: relatedTaskId names a task the caller may
// see, else 404 as for any other task it may not see.
func TestRelatedTaskMustBeVisible(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	ctx := context.Background()
	a, bc, op := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b"), tokenClient(t, b, "tok-op")
	later := 3600.0 // kept scheduled, so only the requests below append
	mine, _, err := a.Schedule(ctx, api.ScheduleRequest{DelaySeconds: &later})
	if err != nil {
		t.Fatal(err)
	}
	theirs, _, err := bc.Schedule(ctx, api.ScheduleRequest{DelaySeconds: &later})
	if err != nil {
		t.Fatal(err)
	}
	for _, related := range []string{theirs.ID, "no-such-task"} {
		before := lastSeq(t, b)
		if _, _, err := a.Schedule(ctx, api.ScheduleRequest{RelatedTaskID: related, DelaySeconds: &later}); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("related %s: %v, want not_found", related, err)
		}
		if after := lastSeq(t, b); after != before {
			t.Fatalf("the log grew from %d to %d", before, after)
		}
	}
	if got, _, err := a.Schedule(ctx, api.ScheduleRequest{RelatedTaskID: mine.ID}); err != nil || got.RelatedTaskID != mine.ID {
		t.Fatalf("related to its own task: %v", err)
	}
	if got, _, err := op.Schedule(ctx, api.ScheduleRequest{CustomerID: "A", RelatedTaskID: theirs.ID}); err != nil || got.RelatedTaskID != theirs.ID {
		t.Fatalf("an operator relating any task: %v", err)
	}
}

// TestLineageLimits: a child past the lineage's depth or task count is
// 409 lineage_limit; a repeated request id still answers its child.
func TestLineageLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Limits.MaxLineageTasks, c.Limits.MaxLineageDepth = 4, 2 })
	ctx := context.Background()
	root := mustSchedule(t, b, api.ScheduleRequest{})
	child := mustSchedule(t, b, api.ScheduleRequest{ParentID: root.ID, RequestID: "child"})
	grandchild := mustSchedule(t, b, api.ScheduleRequest{ParentID: child.ID}) // 2 levels below the root
	_, _, err := b.client.Schedule(ctx, api.ScheduleRequest{ParentID: grandchild.ID})
	apiError(t, err, http.StatusConflict, "lineage_limit")
	mustSchedule(t, b, api.ScheduleRequest{ParentID: root.ID}) // the 4th task
	for _, parent := range []string{root.ID, child.ID} {
		_, _, err := b.client.Schedule(ctx, api.ScheduleRequest{ParentID: parent})
		apiError(t, err, http.StatusConflict, "lineage_limit")
	}
	again, created, err := b.client.Schedule(ctx, api.ScheduleRequest{ParentID: root.ID, RequestID: "child"})
	if err != nil || created || again.ID != child.ID {
		t.Fatalf("repeat at the limit: %v created=%v id %s, want the existing %s", err, created, again.ID, child.ID)
	}
	mustSchedule(t, b, api.ScheduleRequest{}) // another lineage has room
}
