package projections

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestIDIndex: after any adds and removes, across block splits, an
// idIndex walks exactly the ids a sorted set holds after a cursor with a
// prefix, in order, and stops when told.
func TestIDIndex(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		var x idIndex
		model := map[string]bool{}
		id := rapid.StringMatching(`[0-9A-C]{1,4}`)
		for range rapid.IntRange(0, 3*idBlock).Draw(t, "ops") {
			s := id.Draw(t, "id")
			if rapid.IntRange(0, 3).Draw(t, "op") == 0 {
				x.remove(s)
				delete(model, s)
			} else {
				x.add(s)
				model[s] = true
			}
		}
		for _, b := range x.blocks {
			if len(b) == 0 || len(b) > idBlock || !slices.IsSorted(b) {
				t.Fatalf("a block of %d ids, sorted %v", len(b), slices.IsSorted(b))
			}
		}
		prefix := rapid.StringMatching(`[0-9A-C]{0,2}`).Draw(t, "prefix")
		after := rapid.StringMatching(`[0-9A-C]{0,3}`).Draw(t, "after")
		stop := rapid.IntRange(1, 50).Draw(t, "stop")
		var want []string
		for _, s := range sortedKeys(model) {
			if s > after && strings.HasPrefix(s, prefix) && len(want) < stop {
				want = append(want, s)
			}
		}
		var got []string
		x.ascend(prefix, after, func(id string) bool {
			got = append(got, id)
			return len(got) < stop
		})
		if !slices.Equal(got, want) {
			t.Fatalf("ascend(%q, %q) stopping at %d: %v, want %v", prefix, after, stop, got, want)
		}
	})
}

// checkIDIndex fails the test unless v's id index holds exactly each
// customer's tasks, in order (so evictions left it too).
func checkIDIndex(t *testing.T, v *views) {
	t.Helper()
	want := map[string][]string{}
	for id, task := range v.tasks {
		want[task.customer] = append(want[task.customer], id)
	}
	for _, ids := range want {
		slices.Sort(ids)
	}
	got := map[string][]string{}
	for c, x := range v.ids {
		for _, b := range x.blocks {
			got[c] = append(got[c], b...)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("id index %v, the tasks %v", got, want)
	}
}
