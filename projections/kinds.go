package projections

// kindIndex is the search view of task kinds (GET /v1/tasks?kind=): each
// task's kind, and for each kind the ids of its tasks. Only tasks with a
// kind are in it, so a task without one costs it nothing (the task
// record holds no kind). A task's kind never changes after it was
// created.
type kindIndex struct {
	of     map[string]string              // task id → kind
	byKind map[string]map[string]struct{} // kind → task ids
}

func newKindIndex() kindIndex {
	return kindIndex{of: make(map[string]string), byKind: make(map[string]map[string]struct{})}
}

// add indexes task id's kind; none is a no-op.
func (x kindIndex) add(id, kind string) {
	if kind == "" {
		return
	}
	x.of[id] = kind
	ids := x.byKind[kind]
	if ids == nil {
		ids = make(map[string]struct{})
		x.byKind[kind] = ids
	}
	ids[id] = struct{}{}
}

// remove drops task id from the index.
func (x kindIndex) remove(id string) {
	kind, ok := x.of[id]
	if !ok {
		return
	}
	if ids := x.byKind[kind]; ids != nil {
		if delete(ids, id); len(ids) == 0 {
			delete(x.byKind, kind)
		}
	}
	delete(x.of, id)
}
