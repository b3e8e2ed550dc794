package httpapi_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

// TestLabelsAndSearch: labels are part of the task resource (not
// inherited by children) and GET /v1/tasks finds tasks by labels, request
// id and creation time, combined with the other filters and paginated.
func TestLabelsAndSearch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	red := map[string]string{"repo": "example/storefront", "team": "red"}
	r1 := mustSchedule(t, b, api.ScheduleRequest{Queue: "s1", Labels: red, RequestID: "req-r1"})
	child := mustSchedule(t, b, api.ScheduleRequest{Queue: "s1", ParentID: r1.ID})
	r2 := mustSchedule(t, b, api.ScheduleRequest{Queue: "s2", Labels: map[string]string{"repo": "example/storefront"}})
	r3 := mustSchedule(t, b, api.ScheduleRequest{Queue: "s1", Labels: red, CustomerID: "other", RequestID: "req-r1"})
	settled(t, b)

	t.Run("Resource", func(t *testing.T) {
		t.Parallel()
		got, err := b.client.Get(ctx, r1.ID)
		if err != nil || !equalLabels(got.Labels, red) || !equalLabels(r1.Labels, red) {
			t.Fatalf("task labels %v (scheduled answer %v), want %v; %v", got.Labels, r1.Labels, red, err)
		}
		if got, err := b.client.Get(ctx, child.ID); err != nil || got.Labels != nil {
			t.Fatalf("child labels %v, want none (not inherited); %v", got.Labels, err)
		}
		a := rawDo(t, b, http.MethodGet, "/v1/tasks/"+child.ID, "")
		if strings.Contains(string(a.body), `"labels"`) {
			t.Fatalf("a task without labels shows the key: %s", a.body)
		}
	})

	list := func(t *testing.T, o api.ListOptions) []string {
		t.Helper()
		l, err := b.client.List(ctx, o)
		if err != nil {
			t.Fatalf("list %+v: %v", o, err)
		}
		return taskIDs(l.Tasks)
	}
	t.Run("Filters", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			o    api.ListOptions
			want []string
		}{
			{"OneLabel", api.ListOptions{Labels: map[string]string{"repo": "example/storefront"}}, sorted(r1.ID, r2.ID, r3.ID)},
			{"TwoLabels", api.ListOptions{Labels: red}, sorted(r1.ID, r3.ID)},
			{"LabelsAndCustomer", api.ListOptions{Labels: red, CustomerID: "default"}, []string{r1.ID}},
			{"LabelsAndQueue", api.ListOptions{Labels: map[string]string{"repo": "example/storefront"}, Queue: "s2"}, []string{r2.ID}},
			{"NoSuchValue", api.ListOptions{Labels: map[string]string{"repo": "example/other"}}, nil},
			{"RequestID", api.ListOptions{RequestID: "req-r1"}, []string{r1.ID}},
			{"RequestIDOfCustomer", api.ListOptions{RequestID: "req-r1", CustomerID: "other"}, []string{r3.ID}},
			{"UnknownRequestID", api.ListOptions{RequestID: "req-none"}, nil},
			{"CreatedAfter", api.ListOptions{CreatedAfter: r2.CreatedAt}, []string{r3.ID}},
			{"CreatedBefore", api.ListOptions{CreatedBefore: child.CreatedAt}, []string{r1.ID}},
			{"CreatedBetween", api.ListOptions{CreatedAfter: r1.CreatedAt, CreatedBefore: r3.CreatedAt}, sorted(child.ID, r2.ID)},
			{"CreatedAndLabels", api.ListOptions{CreatedAfter: r1.CreatedAt, Labels: red}, []string{r3.ID}},
		} {
			if got := list(t, tc.o); !slices.Equal(got, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			}
		}
	})

	t.Run("Pages", func(t *testing.T) {
		t.Parallel()
		o := api.ListOptions{Labels: map[string]string{"repo": "example/storefront"}, Limit: 2}
		l, err := b.client.List(ctx, o)
		if err != nil || len(l.Tasks) != 2 || l.Next == "" {
			t.Fatalf("first page: %v %v next %q", err, taskIDs(l.Tasks), l.Next)
		}
		o.After = l.Next
		l2, err := b.client.List(ctx, o)
		if err != nil || l2.Next != "" || !slices.Equal(append(taskIDs(l.Tasks), taskIDs(l2.Tasks)...), sorted(r1.ID, r2.ID, r3.ID)) {
			t.Fatalf("second page: %v %v next %q", err, taskIDs(l2.Tasks), l2.Next)
		}
	})

	t.Run("BadFilters", func(t *testing.T) {
		t.Parallel()
		five := url.Values{}
		for i := range 5 {
			five.Add("label", fmt.Sprintf("k%d=v", i))
		}
		for _, query := range []string{
			five.Encode(),
			"label=repo",
			"label==v",
			"label=Repo=v",
			"label=" + strings.Repeat("k", 64) + "=v",
			"label=k=" + strings.Repeat("v", 257),
			"label=k=%FF",
			"label=k=a&label=k=b",
			"requestId=" + url.QueryEscape("a b"),
			"requestId=" + strings.Repeat("r", 65),
			"createdAfter=yesterday",
			"createdBefore=2026-01-02",
		} {
			requireErrorBody(t, rawDo(t, b, http.MethodGet, "/v1/tasks?"+query, ""), http.StatusBadRequest, "invalid_argument")
		}
		// An empty label= is as if left out.
		if a := rawDo(t, b, http.MethodGet, "/v1/tasks?label=&queue=s2", ""); a.status != http.StatusOK || !strings.Contains(string(a.body), r2.ID) {
			t.Fatalf("empty label filter: %d %s", a.status, a.body)
		}
		// The longest accepted filter values work.
		q := "label=" + strings.Repeat("k", 63) + "=" + strings.Repeat("v", 256) + "&createdAfter=" + url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339))
		if a := rawDo(t, b, http.MethodGet, "/v1/tasks?"+q, ""); a.status != http.StatusOK {
			t.Fatalf("longest label filter: %d %s", a.status, a.body)
		}
	})
}

// TestScheduleBadLabels: every kind of bad label is a 400 and writes
// nothing, on schedule and in a batch item.
func TestScheduleBadLabels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := lastSeq(t, b)
	seventeen := map[string]string{}
	for i := range 17 {
		seventeen[fmt.Sprint("k", i)] = "v"
	}
	for name, labels := range map[string]map[string]string{
		"Seventeen":    seventeen,
		"EmptyKey":     {"": "v"},
		"UpperCase":    {"Repo": "v"},
		"Space":        {"a b": "v"},
		"KeyTooLong":   {strings.Repeat("k", 64): "v"},
		"ValueTooLong": {"k": strings.Repeat("v", 257)},
	} {
		_, _, err := b.client.Schedule(context.Background(), api.ScheduleRequest{Labels: labels})
		apiError(t, err, http.StatusBadRequest, "")
		items, err := b.client.ScheduleBatch(context.Background(), []api.ScheduleRequest{{Labels: labels}})
		if err != nil || len(items) != 1 || items[0].Status != http.StatusBadRequest {
			t.Fatalf("%s in a batch: %v %+v", name, err, items)
		}
	}
	// Invalid UTF-8 cannot come through JSON (the body is refused) and a
	// label value that is not a string is malformed.
	for _, body := range []string{`{"labels": {"k": "\xff"}}`, `{"labels": {"k": 1}}`, `{"labels": ["k"]}`} {
		requireErrorBody(t, rawDo(t, b, http.MethodPost, "/v1/tasks", body), http.StatusBadRequest, "invalid_argument")
	}
	if after := lastSeq(t, b); after != before {
		t.Fatalf("refused schedules wrote to the log: %d → %d", before, after)
	}
}

func equalLabels(a, b map[string]string) bool { return maps.Equal(a, b) && (a == nil) == (b == nil) }
