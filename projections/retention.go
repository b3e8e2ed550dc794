package projections

import "github.com/taskledger/taskledger/aggregate"

// DefaultRetain is how many tasks of finished lineages the views keep
// unless Config.Retain says otherwise.
const DefaultRetain = 100_000

// retention bounds the memory finished tasks hold. A lineage (a task
// with no parent in the views, and every descendant linked under it)
// closes when each of its tasks is terminal and has reported to its
// parent. While the views hold more than limit tasks of closed lineages,
// the lineage that closed first is evicted whole. Evicting whole
// lineages keeps every view consistent: an open task's ancestors and a
// kept task's children are always there. Eviction follows log order
// alone, so a projection rebuilt from the log or restored from a
// snapshot keeps exactly the same tasks. The log keeps everything;
// reads of an evicted task go to it.
type retention struct {
	limit   int             // < 0: keep everything
	kept    int             // tasks of closed lineages the views hold
	closed  []closedLineage // in closing order; stale after a reopen
	seq     uint64          // the sequence being applied
	evicted uint64
}

type closedLineage struct {
	head string
	seq  uint64
}

// head returns the top of t's lineage: its furthest ancestor the views
// hold. The walk is bounded so a damaged log with a parent cycle cannot
// loop it.
func (v *views) head(t *task) *task {
	h, _ := v.ancestry(t)
	return h
}

// ancestry returns t's head and how many levels below it t sits.
func (v *views) ancestry(t *task) (head *task, depth int) {
	for range 1 << 16 {
		p := v.tasks[t.parent]
		if t.parent == "" || p == nil || p == t {
			break
		}
		t, depth = p, depth+1
	}
	return t, depth
}

// join counts a new task in its lineage, reopening a closed one (a child
// that raced its parent's end).
func (v *views) join(t *task) {
	h := v.head(t)
	if h.closedSeq() != 0 {
		v.kept -= int(h.members)
		h.setClosedSeq(0)
	}
	h.members++
	if !t.terminal() {
		h.open++
	} else if h.open == 0 {
		v.closeLineage(h)
	}
}

// closeOne records that t is no longer open: terminal, and reported to
// its parent if it has to be.
func (v *views) closeOne(t *task) {
	if h := v.head(t); h.open > 0 {
		if h.open--; h.open == 0 {
			v.closeLineage(h)
		}
	}
}

func (v *views) closeLineage(h *task) {
	h.setClosedSeq(v.seq)
	v.closed = append(v.closed, closedLineage{head: h.id, seq: v.seq})
	v.kept += int(h.members)
}

// evict drops the oldest closed lineages while more than limit tasks of
// closed lineages are kept.
func (v *views) evict() {
	for v.limit >= 0 && v.kept > v.limit && len(v.closed) > 0 {
		c := v.closed[0]
		v.closed = v.closed[1:]
		if h := v.tasks[c.head]; h != nil && h.closedSeq() == c.seq {
			v.kept -= int(h.members)
			v.drop(h)
		}
	}
}

// drop removes a closed lineage from every view. Its tasks are terminal
// and in no timer queue.
func (v *views) drop(h *task) {
	stack := []*task{h}
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		status := statuses[t.status]
		st := t.state()
		v.count(&st, &aggregate.State{})
		delete(v.tasks, t.id)
		v.labels.remove(t.id)
		v.unindexID(t)
		v.byStatus[t.status].remove(t)
		if qc := v.queueCounts[t.queue]; qc != nil {
			if qc[status]--; qc[status] <= 0 {
				delete(qc, status)
			}
		}
		v.evicted++
		for _, c := range t.children() {
			if ct := v.tasks[c]; ct != nil {
				stack = append(stack, ct)
			}
		}
	}
}
