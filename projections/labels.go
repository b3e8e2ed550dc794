package projections

import (
	"maps"
	"slices"

	"github.com/taskledger/taskledger/aggregate"
)

// labelIndex is the search view of task labels: each labeled task's
// labels, and for each key=value pair the ids of the tasks that carry
// it. Only labeled tasks are in it, so a task without labels costs it
// nothing (and the task record holds no labels at all). A task's labels
// never change after it was created; the maps handed out are shared and
// must not be written to.
type labelIndex struct {
	of     map[string]map[string]string   // task id → labels
	byPair map[string]map[string]struct{} // labelPair(k, v) → task ids
}

func newLabelIndex() labelIndex {
	return labelIndex{of: make(map[string]map[string]string), byPair: make(map[string]map[string]struct{})}
}

// state unpacks t with its labels and kind: the projections' answer for
// a task.
func (v *views) state(t *task) aggregate.State {
	s := t.state()
	s.Spec.Labels, s.Spec.Kind = v.labels.of[t.id], v.kinds.of[t.id]
	return s
}

// labelPair joins a key and a value with a byte no key contains.
func labelPair(k, v string) string { return k + "=" + v }

// add indexes task id's labels; none is a no-op.
func (x labelIndex) add(id string, labels map[string]string) {
	if len(labels) == 0 {
		return
	}
	x.of[id] = labels
	for k, v := range labels {
		p := labelPair(k, v)
		ids := x.byPair[p]
		if ids == nil {
			ids = make(map[string]struct{})
			x.byPair[p] = ids
		}
		ids[id] = struct{}{}
	}
}

// remove drops task id from the index.
func (x labelIndex) remove(id string) {
	for k, v := range x.of[id] {
		p := labelPair(k, v)
		if ids := x.byPair[p]; ids != nil {
			if delete(ids, id); len(ids) == 0 {
				delete(x.byPair, p)
			}
		}
	}
	delete(x.of, id)
}

// has reports whether task id carries every pair of want.
func (x labelIndex) has(id string, want map[string]string) bool {
	labels := x.of[id]
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// smallest returns the ids of the tasks carrying the rarest pair of want
// (nil when some pair has none): the candidates a search must check.
func (x labelIndex) smallest(want map[string]string) map[string]struct{} {
	var best map[string]struct{}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		ids := x.byPair[labelPair(k, want[k])]
		if len(ids) == 0 {
			return nil
		}
		if best == nil || len(ids) < len(best) {
			best = ids
		}
	}
	return best
}
