package aggregate_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

func TestScheduleLabels(t *testing.T) {
	t.Parallel()
	sixteen, seventeen := map[string]string{}, map[string]string{}
	for i := range 17 {
		if i < 16 {
			sixteen[fmt.Sprint("k", i)] = "v"
		}
		seventeen[fmt.Sprint("k", i)] = "v"
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		ok     bool
	}{
		{"None", nil, true},
		{"Typical", map[string]string{"repo": "example/storefront", "team.a/b_c-d": "", "0": "ü"}, true},
		{"Sixteen", sixteen, true},
		{"Seventeen", seventeen, false},
		{"LongestKey", map[string]string{strings.Repeat("k", 63): "v"}, true},
		{"KeyTooLong", map[string]string{strings.Repeat("k", 64): "v"}, false},
		{"EmptyKey", map[string]string{"": "v"}, false},
		{"UpperCaseKey", map[string]string{"Repo": "v"}, false},
		{"KeyStartsWithDash", map[string]string{"-x": "v"}, false},
		{"KeyWithEquals", map[string]string{"a=b": "v"}, false},
		{"LongestValue", map[string]string{"k": strings.Repeat("v", 256)}, true},
		{"ValueTooLong", map[string]string{"k": strings.Repeat("v", 257)}, false},
		{"ValueNotUTF8", map[string]string{"k": "\xff"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sp := spec()
			sp.Labels = tc.labels
			got, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: sp}, t0)
			if !tc.ok {
				if !errors.Is(err, aggregate.ErrInvalid) {
					t.Fatalf("Decide = %v, %v; want ErrInvalid", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			have := got[0].Data.(events.TaskScheduled).Spec.Labels
			if len(tc.labels) == 0 && have != nil || len(tc.labels) > 0 && !reflect.DeepEqual(have, tc.labels) {
				t.Fatalf("labels = %#v, want %#v", have, tc.labels)
			}
		})
	}
}

// TestScheduleLabelsCopied: the event does not share the caller's map,
// and an empty map is no labels.
func TestScheduleLabelsCopied(t *testing.T) {
	t.Parallel()
	sp := spec()
	sp.Labels = map[string]string{"a": "1"}
	got, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: sp}, t0)
	if err != nil {
		t.Fatal(err)
	}
	sp.Labels["a"] = "changed"
	if v := got[0].Data.(events.TaskScheduled).Spec.Labels["a"]; v != "1" {
		t.Fatalf("the event's label changed with the caller's map: %q", v)
	}
	sp.Labels = map[string]string{}
	got, err = aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: sp}, t0)
	if err != nil || got[0].Data.(events.TaskScheduled).Spec.Labels != nil {
		t.Fatalf("empty labels: %v, %v; want nil labels", got, err)
	}
}

func TestRetrySpec(t *testing.T) {
	t.Parallel()
	child := spec()
	child.ParentID, child.RootID, child.RequestID, child.RelatedTaskID = "parent-1", "root-1", "req-1", "other-1"
	child.Labels, child.Repo = map[string]string{"repo": "x"}, "https://example.com/x"
	childFailed := with([]events.Event{ev(t0, events.TaskScheduled{Spec: child})}, ev(later, events.Canceled{Reason: "stop"}))
	for _, h := range terminalHistories {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			got, err := aggregate.RetrySpec(aggregate.Replay(h.given))
			if err != nil {
				t.Fatal(err)
			}
			want := spec()
			want.RootID, want.RunAt, want.RelatedTaskID, want.RetryOf = "", got.RunAt, taskID, taskID
			if !reflect.DeepEqual(got, want) || !got.RunAt.IsZero() {
				t.Fatalf("RetrySpec = %+v, want %+v", got, want)
			}
		})
	}
	t.Run("ChildBecomesRoot", func(t *testing.T) {
		t.Parallel()
		got, err := aggregate.RetrySpec(aggregate.Replay(childFailed))
		if err != nil {
			t.Fatal(err)
		}
		if got.ParentID != "" || got.RootID != "" || got.RequestID != "" || got.RelatedTaskID != taskID || got.RetryOf != taskID ||
			got.Labels["repo"] != "x" || got.Repo != child.Repo {
			t.Fatalf("RetrySpec = %+v", got)
		}
		newID := "task-2"
		got.RootID = newID
		if _, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: newID, CustomerID: custID, Spec: got}, t0); err != nil {
			t.Fatalf("the retry spec does not schedule: %v", err)
		}
	})
	for name, given := range map[string][]events.Event{"Scheduled": scheduled, "Queued": queued, "Running": running, "Retried": retried} {
		t.Run("Live"+name, func(t *testing.T) {
			t.Parallel()
			if _, err := aggregate.RetrySpec(aggregate.Replay(given)); !errors.Is(err, aggregate.ErrNotTerminal) {
				t.Fatalf("RetrySpec = %v, want ErrNotTerminal", err)
			}
		})
	}
	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		if _, err := aggregate.RetrySpec(aggregate.State{}); !errors.Is(err, aggregate.ErrNotFound) {
			t.Fatalf("RetrySpec = %v, want ErrNotFound", err)
		}
	})
	for name, mutate := range map[string]func(*events.TaskSpec){
		"OtherRelated": func(s *events.TaskSpec) { s.RelatedTaskID = "other-1" },
		"AsChild":      func(s *events.TaskSpec) { s.ParentID, s.RootID = "parent-1", "root-1" },
	} {
		t.Run("Inconsistent"+name, func(t *testing.T) {
			t.Parallel()
			sp := spec()
			sp.RetryOf, sp.RelatedTaskID = "old-1", "old-1"
			mutate(&sp)
			if _, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: taskID, CustomerID: custID, Spec: sp}, t0); !errors.Is(err, aggregate.ErrInvalid) {
				t.Fatalf("Decide = %v, want ErrInvalid", err)
			}
		})
	}
}
