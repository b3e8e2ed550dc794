package httpapi_test

import (
	"context"
	"slices"
	"testing"

	"github.com/taskledger/taskledger/api"
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
