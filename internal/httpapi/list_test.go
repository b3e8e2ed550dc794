package httpapi_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
)

func TestList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// Five tasks: a root with two children on another queue, one more
	// root, and one root of another customer.
	root := queuedTask(t, b, api.ScheduleRequest{Queue: "alpha", Message: text("m", "root")})
	c1 := queuedTask(t, b, api.ScheduleRequest{Queue: "beta", ParentID: root.ID})
	c2 := queuedTask(t, b, api.ScheduleRequest{Queue: "beta", ParentID: root.ID})
	x := runningTask(t, b, api.ScheduleRequest{Queue: "alpha"})
	y := queuedTask(t, b, api.ScheduleRequest{Queue: "alpha", CustomerID: "other"})
	if _, err := b.client.Cancel(ctx, y.ID, "not needed"); err != nil {
		t.Fatal(err)
	}
	all := sorted(root.ID, c1.ID, c2.ID, x.ID, y.ID)
	settled(t, b)

	t.Run("PagesCoverEverythingOnce", func(t *testing.T) {
		t.Parallel()
		var seen []string
		var sizes []int
		after := ""
		for page := 0; ; page++ {
			if page > 5 {
				t.Fatalf("pagination does not end; seen %v", seen)
			}
			l, err := b.client.List(ctx, api.ListOptions{Limit: 2, After: after})
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, len(l.Tasks))
			for _, task := range l.Tasks {
				seen = append(seen, task.ID)
			}
			if l.Next == "" {
				break
			}
			after = l.Next
		}
		if !slices.Equal(sizes, []int{2, 2, 1}) {
			t.Fatalf("page sizes %v, want [2 2 1]", sizes)
		}
		if !slices.IsSorted(seen) {
			t.Fatalf("pages are not in id order: %v", seen)
		}
		if !slices.Equal(sorted(seen...), all) {
			t.Fatalf("pages returned %v, want each of %v once", seen, all)
		}
	})

	t.Run("ExactPageHasNoNext", func(t *testing.T) {
		t.Parallel()
		l, err := b.client.List(ctx, api.ListOptions{Limit: 5})
		if err != nil || len(l.Tasks) != 5 || l.Next != "" {
			t.Fatalf("limit 5 over 5 tasks: %v %d tasks next %q", err, len(l.Tasks), l.Next)
		}
		l, err = b.client.List(ctx, api.ListOptions{})
		if err != nil || !slices.Equal(taskIDs(l.Tasks), all) || l.Next != "" {
			t.Fatalf("default limit: %v %v next %q", err, taskIDs(l.Tasks), l.Next)
		}
		for _, task := range l.Tasks {
			if task.ID == root.ID && (len(task.Message.Content) != 1 || task.Message.Content[0].Text != "root") {
				t.Fatalf("listed task lost its message: %+v", task.Message)
			}
		}
	})

	t.Run("Filters", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			opts api.ListOptions
			want []string
		}{
			{"Status", api.ListOptions{Status: "queued"}, sorted(root.ID, c1.ID, c2.ID)},
			{"StatusRunning", api.ListOptions{Status: "running"}, sorted(x.ID)},
			{"StatusCanceled", api.ListOptions{Status: "canceled"}, sorted(y.ID)},
			{"StatusNone", api.ListOptions{Status: "timed_out"}, []string{}},
			{"Queue", api.ListOptions{Queue: "beta"}, sorted(c1.ID, c2.ID)},
			{"RootID", api.ListOptions{RootID: root.ID}, sorted(root.ID, c1.ID, c2.ID)},
			{"RootIDOfLeaf", api.ListOptions{RootID: x.ID}, sorted(x.ID)},
			{"CustomerID", api.ListOptions{CustomerID: "other"}, sorted(y.ID)},
			{"Combined", api.ListOptions{Status: "queued", Queue: "alpha"}, sorted(root.ID)},
			{"CombinedPaged", api.ListOptions{Queue: "alpha", CustomerID: "default", Limit: 1}, sorted(root.ID, x.ID)[:1]},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				l, err := b.client.List(ctx, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				if got := taskIDs(l.Tasks); !slices.Equal(got, tc.want) {
					t.Fatalf("list %+v: %v, want %v", tc.opts, got, tc.want)
				}
				if l.Tasks == nil {
					t.Fatalf("list %+v: tasks is null, want []", tc.opts)
				}
			})
		}
	})
}

// TestListIDPrefix: idPrefix lists exactly the caller's tasks whose id
// starts with it, in id order, page by page and with the other filters;
// another customer's task is not found by its id; a prefix that is no id
// is a 400.
func TestListIDPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Tokens = tenantTokens })
	ctx := context.Background()
	a, bc, op := api.NewClient(b.url, "tok-a"), api.NewClient(b.url, "tok-b"), api.NewClient(b.url, "tok-op")
	mine := append(scheduleN(t, a, "qa", 6), scheduleN(t, a, "qb", 3)...)
	theirs := scheduleN(t, bc, "qa", 2)
	if _, err := a.Cancel(ctx, mine[0].ID, "test"); err != nil {
		t.Fatal(err)
	}
	settled(t, b)
	// want lists mine that start with prefix (and pass keep), sorted.
	want := func(prefix string, keep func(api.Task) bool) []string {
		var out []string
		for _, task := range mine {
			if strings.HasPrefix(task.ID, prefix) && (keep == nil || keep(task)) {
				out = append(out, task.ID)
			}
		}
		return sorted(out...)
	}
	// Ids are time-ordered: the 10 leading characters are the millisecond,
	// the 11th random, so a prefix of 11 picks out about one task, of 9 the
	// tasks of about 32 ms.
	target := mine[4].ID
	for _, n := range []int{len(target), 11, 9, 1} {
		prefix := target[:n]
		var got []string
		after := ""
		for page := 0; ; page++ {
			if page > len(mine) {
				t.Fatalf("prefix %q: pagination does not end", prefix)
			}
			l, err := a.List(ctx, api.ListOptions{IDPrefix: prefix, Limit: 2, After: after})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, taskIDs(l.Tasks)...)
			if after = l.Next; after == "" {
				break
			}
		}
		if w := want(prefix, nil); !slices.Equal(got, w) || !slices.Contains(got, target) {
			t.Fatalf("prefix %q: %v, want %v", prefix, got, w)
		}
	}

	t.Run("WithFilters", func(t *testing.T) {
		t.Parallel()
		prefix := target[:1]
		l, err := a.List(ctx, api.ListOptions{IDPrefix: prefix, Queue: "qb"})
		if w := want(prefix, func(t api.Task) bool { return t.Queue == "qb" }); err != nil || !slices.Equal(taskIDs(l.Tasks), w) {
			t.Fatalf("queue qb: %v %v, want %v", err, taskIDs(l.Tasks), w)
		}
		l, err = a.List(ctx, api.ListOptions{IDPrefix: mine[0].ID[:1], Status: "canceled"})
		if err != nil || !slices.Equal(taskIDs(l.Tasks), []string{mine[0].ID}) {
			t.Fatalf("canceled: %v %v, want %s", err, taskIDs(l.Tasks), mine[0].ID)
		}
	})

	t.Run("OtherCustomer", func(t *testing.T) {
		t.Parallel()
		l, err := a.List(ctx, api.ListOptions{IDPrefix: theirs[0].ID})
		if err != nil || len(l.Tasks) != 0 {
			t.Fatalf("A found B's task by its id: %v %v", err, taskIDs(l.Tasks))
		}
		l, err = op.List(ctx, api.ListOptions{IDPrefix: theirs[0].ID})
		if err != nil || !slices.Equal(taskIDs(l.Tasks), []string{theirs[0].ID}) {
			t.Fatalf("the operator's search: %v %v", err, taskIDs(l.Tasks))
		}
		l, err = op.List(ctx, api.ListOptions{IDPrefix: theirs[0].ID, CustomerID: "A"})
		if err != nil || len(l.Tasks) != 0 {
			t.Fatalf("B's task listed as A's: %v %v", err, taskIDs(l.Tasks))
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for _, prefix := range []string{strings.Repeat("a", events.MaxIDLen+1), "a.b", "a b", "ü", "a/b"} {
			requireErrorBody(t, authDo(t, b, "Bearer tok-a", http.MethodGet, "/v1/tasks?idPrefix="+url.QueryEscape(prefix), ""), http.StatusBadRequest, "invalid_argument")
		}
	})
}
