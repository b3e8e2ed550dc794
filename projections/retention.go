package projections

import (
	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

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
//
// On a sharded log the account is kept per shard, each with an even
// share of the limit: a lineage lives in one shard, so what one shard's
// retention evicts follows that shard's order alone, however the shards'
// events interleave (live and in a rebuild they do differently).
type retention struct {
	limit   int // per shard; < 0: keep everything
	shards  events.Shards
	kept    int             // tasks of closed lineages the views hold, in all shards
	parts   []retained      // by shard
	seq     events.Position // the position being applied
	evicted uint64
}

// retained is one shard's retention account.
type retained struct {
	kept   int             // tasks of the shard's closed lineages the views hold
	closed []closedLineage // in closing order; stale after a reopen
}

// newRetention returns the retention of a log of shards keeping limit
// tasks of closed lineages in all (< 0: all of them), split evenly over
// the parts that hold tasks (with epochs, not the shards of keys and
// schedules).
func newRetention(limit int, shards events.Shards) retention {
	n := shards.N()
	if shards.Slots > 0 {
		n -= len(shards.SlotParts(-1)) // the shards hold no task
	}
	if limit > 0 {
		limit = (limit + n - 1) / n
	}
	return retention{limit: limit, shards: shards, parts: make([]retained, shards.N())}
}

// part returns the account of the shard of position pos.
func (r *retention) part(pos events.Position) *retained {
	return &r.parts[pos.Part(r.shards)]
}

// account adds n tasks to the kept count of the shard of position pos.
func (r *retention) account(pos events.Position, n int) {
	r.part(pos).kept += n
	r.kept += n
}

type closedLineage struct {
	head string
	seq  events.Position
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
	if at := h.closedSeq(); at != 0 {
		v.account(at, -int(h.members))
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
	p := v.part(v.seq)
	p.closed = append(p.closed, closedLineage{head: h.id, seq: v.seq})
	v.account(v.seq, int(h.members))
}

// evict drops each shard's oldest closed lineages while it keeps more
// than limit tasks of closed lineages.
func (v *views) evict() {
	for i := range v.parts {
		p := &v.parts[i]
		for v.limit >= 0 && p.kept > v.limit && len(p.closed) > 0 {
			c := p.closed[0]
			p.closed = p.closed[1:]
			if h := v.tasks[c.head]; h != nil && h.closedSeq() == c.seq {
				v.account(c.seq, -int(h.members))
				v.drop(h)
			}
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
		v.kinds.remove(t.id)
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
