package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// badIDs are ids the API refuses with a 400: characters a NATS subject
// would give meaning to, a space, and one character too many.
var badIDs = []struct{ name, id string }{
	{"Dot", "a.b"},
	{"Star", "a*"},
	{"Greater", "a>"},
	{"OnlyStar", "*"},
	{"OnlyGreater", ">"},
	{"Space", "a b"},
	{"TooLong", strings.Repeat("a", 65)},
}

// jsonString quotes s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

type badRequest struct {
	name         string
	method, path string
	body         string
	status       int
	code         string
}

func TestBadRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := queuedTask(t, b, api.ScheduleRequest{Queue: "valid"})
	r := runningTask(t, b, api.ScheduleRequest{Queue: "valid"})
	settled(t, b)

	const (
		bad     = http.StatusBadRequest
		invalid = "invalid_argument"
	)
	var cases []badRequest
	add := func(name, method, path, body string, status int, code string) {
		cases = append(cases, badRequest{name, method, path, body, status, code})
	}
	tasks, claim := "/v1/tasks", "/v1/tasks/"+q.ID+"/claim"
	result, mailbox := "/v1/tasks/"+r.ID+"/result", "/v1/tasks/"+q.ID+"/mailbox"
	cancel, next := "/v1/tasks/"+q.ID+"/cancel", "/v1/claims/next"

	// Bodies that are not one JSON object.
	for _, path := range []string{tasks, claim, result, cancel, mailbox, next} {
		route := strings.NewReplacer(q.ID, "ID", r.ID, "ID").Replace(path)
		for _, body := range []struct{ name, body string }{
			{"Malformed", `{"queue":`},
			{"Garbage", `queue=a`},
			{"TrailingObject", `{} {}`},
			{"TrailingBrace", `{}}`},
			{"TrailingBracket", `{}]`},
			{"TrailingWord", `{} x`},
			{"Array", `[]`},
			{"String", `"x"`},
		} {
			add(body.name+"Body"+route, http.MethodPost, path, body.body, bad, invalid)
		}
	}
	add("WrongFieldType", http.MethodPost, tasks, `{"timeoutSeconds":"60"}`, bad, invalid)

	// Malformed ids where the HTTP layer reads them: the path and the
	// queries. (Ids in bodies are the service's to check.)
	for _, id := range badIDs {
		p := "/v1/tasks/" + url.PathEscape(id.id)
		for _, route := range []struct{ method, suffix string }{
			{http.MethodGet, ""}, {http.MethodPost, "/claim"}, {http.MethodPost, "/check"},
			{http.MethodPost, "/result"}, {http.MethodPost, "/effects"}, {http.MethodPost, "/cancel"}, {http.MethodPost, "/mailbox"},
			{http.MethodGet, "/mailbox"}, {http.MethodGet, "/history"}, {http.MethodGet, "/tree"},
		} {
			body := ""
			if route.method == http.MethodPost {
				body = `{}`
			}
			add("TaskIDInPath"+id.name+route.method+strings.ReplaceAll(route.suffix, "/", ""), route.method, p+route.suffix, body, bad, invalid)
		}
		for _, param := range []string{"queue", "customerId", "rootId", "after"} {
			add("List"+strings.ToUpper(param[:1])+param[1:]+id.name, http.MethodGet, tasks+"?"+param+"="+url.QueryEscape(id.id), "", bad, invalid)
		}
	}
	// Arguments the HTTP layer parses or bounds itself.
	add("RunAtMalformed", http.MethodPost, tasks, `{"runAt":"tomorrow"}`, bad, invalid)
	add("NextNegativeWait", http.MethodPost, next, `{"queue":"valid","executorId":"w1","waitSeconds":-1}`, bad, invalid)

	// Sizes.
	huge := strings.Repeat("a", api.MaxBodyBytes)
	add("BodyTooLargeSchedule", http.MethodPost, tasks, `{"repo":"`+huge+`"}`, http.StatusRequestEntityTooLarge, "payload_too_large")
	add("BodyTooLargeMailbox", http.MethodPost, mailbox, `{"message":{"content":[{"type":"text","text":"`+huge+`"}]}}`, http.StatusRequestEntityTooLarge, "payload_too_large")
	add("BodyTooLargeResult", http.MethodPost, result, `{"success":true,"summary":"`+huge+`"}`, http.StatusRequestEntityTooLarge, "payload_too_large")

	// Queries.
	for _, query := range []string{"status=bogus", "status=RUNNING", "limit=0", "limit=-1", "limit=abc", "limit=1.5"} {
		add("List"+strings.NewReplacer("=", "", "-", "Minus", ".", "Dot").Replace(query), http.MethodGet, tasks+"?"+query, "", bad, invalid)
	}
	for _, after := range []string{"-1", "x"} {
		add("MailboxAfter"+strings.ReplaceAll(after, "-", "Minus"), http.MethodGet, mailbox+"?after="+after, "", bad, invalid)
	}

	// Unknown routes and missing tasks.
	notFound := http.StatusNotFound
	add("UnknownRoute", http.MethodGet, "/v1/nope", "", notFound, "not_found")
	add("UnknownRoot", http.MethodGet, "/", "", notFound, "not_found")
	add("UnknownTaskAction", http.MethodPost, "/v1/tasks/"+q.ID+"/explode", `{}`, notFound, "not_found")
	add("UnknownVersion", http.MethodGet, "/v2/tasks/"+q.ID, "", notFound, "not_found")
	for _, route := range []struct{ method, suffix, body string }{
		{http.MethodGet, "", ""}, {http.MethodPost, "/claim", `{"deliveryId":"d1","executorId":"w1"}`},
		{http.MethodPost, "/result", `{"success":true}`}, {http.MethodPost, "/cancel", `{}`},
		{http.MethodPost, "/mailbox", `{"message":{"id":"m1","content":[]}}`}, {http.MethodGet, "/mailbox", ""},
		{http.MethodGet, "/history", ""}, {http.MethodGet, "/tree", ""},
	} {
		add("MissingTask"+route.method+strings.ReplaceAll(route.suffix, "/", ""), route.method, "/v1/tasks/no-such-task"+route.suffix, route.body, notFound, "not_found")
	}

	seen := make(map[string]bool, len(cases))
	for _, tc := range cases {
		if seen[tc.name] {
			t.Fatalf("duplicate case name %s", tc.name)
		}
		seen[tc.name] = true
	}

	// Sequential on purpose: each case checks that the log did not grow,
	// which only holds while no other request writes.
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := lastSeq(t, b)
			a := rawDo(t, b, tc.method, tc.path, tc.body)
			requireErrorBody(t, a, tc.status, tc.code)
			if after := lastSeq(t, b); after != before {
				t.Fatalf("%s %s appended to the log: last sequence %d, want %d", tc.method, tc.path, after, before)
			}
		})
	}

	// Nothing about the fixtures moved.
	ctx := context.Background()
	for _, want := range []api.Task{q, r} {
		got, err := b.client.Get(ctx, want.ID)
		if err != nil || got.Status != want.Status || got.Version != want.Version {
			t.Fatalf("task %s after the bad requests: %v %+v, want status %s version %d", want.ID, err, got, want.Status, want.Version)
		}
	}
	l, err := b.client.List(ctx, api.ListOptions{})
	if err != nil || len(l.Tasks) != 2 {
		t.Fatalf("list after the bad requests: %v %d tasks, want 2", err, len(l.Tasks))
	}
}

// TestLimitsAreInclusive checks that the largest requests the service
// accepts (64-character ids, a 64 KiB message, a 16 KiB summary with 32
// effects) fit in the HTTP body limit, and that a list limit above 1000
// is clamped, not refused. (The service's own limits, and that their
// edges are accepted, are internal/scheduler's TestScheduleValidation and
// TestClaimAndResult/ResultLimits.)
func TestLimitsAreInclusive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	longID := strings.Repeat("a", 64)
	maxText := strings.Repeat("x", 64<<10-len("text"))
	task, _, err := b.client.Schedule(ctx, api.ScheduleRequest{
		RequestID: longID, Queue: longID, CustomerID: longID,
		Message: events.Message{ID: longID, Content: []events.ContentPart{{Type: "text", Text: maxText}}},
	})
	if err != nil || task.RequestID != longID || task.Queue != longID || task.CustomerID != longID {
		t.Fatalf("64-character ids and a 64 KiB message: %v", err)
	}
	task = b.waitStatus(t, task.ID, "queued")
	if _, err := b.client.AppendMail(ctx, task.ID, events.Message{ID: longID, Content: []events.ContentPart{{Type: "text", Text: maxText}}}); err != nil {
		t.Fatalf("64 KiB mailbox message: %v", err)
	}
	running, err := b.client.Claim(ctx, task.ID, task.Delivery.ID, longID)
	if err != nil {
		t.Fatalf("claim with a 64-character executor id: %v", err)
	}
	effects := make([]events.Effect, 32)
	for i := range effects {
		effects[i] = events.Effect{Kind: "comment", Ref: fmt.Sprint(i)}
	}
	done, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{
		DeliveryID: running.Claim.DeliveryID, Success: true, Summary: strings.Repeat("s", 16<<10), Effects: effects,
	})
	if err != nil || done.Status != "succeeded" || len(done.Result.Effects) != 32 {
		t.Fatalf("16 KiB summary and 32 effects: %v", err)
	}
	l, err := b.client.List(ctx, api.ListOptions{Limit: 1000000})
	if err != nil || len(l.Tasks) != 1 {
		t.Fatalf("limit above 1000: %v %d tasks", err, len(l.Tasks))
	}
}
