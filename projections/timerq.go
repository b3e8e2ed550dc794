package projections

import (
	"container/heap"
	"math"
	"time"
)

// dueHeap is a min-heap of keys by due time with an index for updates. Ties
// break by key so the order is deterministic.
type dueHeap struct {
	items []dueItem
	pos   map[string]int
	name  string // the bucket's key in a TimerQueue
}

type dueItem struct {
	key string
	due int64 // unix nanoseconds
}

func newDueHeap() *dueHeap { return &dueHeap{pos: make(map[string]int)} }

func (h *dueHeap) Len() int { return len(h.items) }
func (h *dueHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	return a.due < b.due || a.due == b.due && a.key < b.key
}
func (h *dueHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.pos[h.items[i].key] = i
	h.pos[h.items[j].key] = j
}
func (h *dueHeap) Push(x any) {
	it := x.(dueItem)
	h.pos[it.key] = len(h.items)
	h.items = append(h.items, it)
}
func (h *dueHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	delete(h.pos, it.key)
	return it
}

func (h *dueHeap) set(key string, due int64) {
	if i, ok := h.pos[key]; ok {
		h.items[i].due = due
		heap.Fix(h, i)
		return
	}
	heap.Push(h, dueItem{key: key, due: due})
}

func (h *dueHeap) remove(key string) {
	if i, ok := h.pos[key]; ok {
		heap.Remove(h, i)
	}
}

func (h *dueHeap) min() (dueItem, bool) {
	if len(h.items) == 0 {
		return dueItem{}, false
	}
	return h.items[0], true
}

// ascending iterates the items due at or before now in due order without
// changing the heap: a frontier of heap indices ordered by due, costing
// O(k log k) for k items visited.
type ascending struct {
	h        *dueHeap
	now      int64
	frontier frontier
	buf      [8]int // the frontier's first indices: one allocation per iteration, not two
}

func (h *dueHeap) ascending(now int64) *ascending {
	it := &ascending{h: h, now: now}
	it.frontier = frontier{h: h, idx: it.buf[:0]}
	it.push(0)
	return it
}

func (it *ascending) push(i int) {
	if i < len(it.h.items) && it.h.items[i].due <= it.now {
		heap.Push(&it.frontier, i)
	}
}

func (it *ascending) next() (dueItem, bool) {
	if it.frontier.Len() == 0 {
		return dueItem{}, false
	}
	i := heap.Pop(&it.frontier).(int)
	it.push(2*i + 1)
	it.push(2*i + 2)
	return it.h.items[i], true
}

type frontier struct {
	h   *dueHeap
	idx []int
}

func (f frontier) Len() int           { return len(f.idx) }
func (f frontier) Less(i, j int) bool { return f.h.Less(f.idx[i], f.idx[j]) }
func (f frontier) Swap(i, j int)      { f.idx[i], f.idx[j] = f.idx[j], f.idx[i] }
func (f *frontier) Push(x any)        { f.idx = append(f.idx, x.(int)) }
func (f *frontier) Pop() any {
	x := f.idx[len(f.idx)-1]
	f.idx = f.idx[:len(f.idx)-1]
	return x
}

// TimerQueue holds due times of tasks, kept fair across customers: each
// customer has its own heap, and a heap of customers orders them by their
// earliest item. It is not safe for concurrent use; the Engine guards it.
type TimerQueue struct {
	byCustomer map[string]*dueHeap
	customers  *dueHeap // key: customer, due: its earliest item
	owner      map[string]string
}

func newTimerQueue() *TimerQueue {
	return &TimerQueue{byCustomer: make(map[string]*dueHeap), customers: newDueHeap(), owner: make(map[string]string)}
}

// Len is the number of tasks in the queue.
func (q *TimerQueue) Len() int { return len(q.owner) }

func (q *TimerQueue) set(taskID, customerID string, due time.Time) {
	h := q.byCustomer[customerID]
	if h == nil {
		h = newDueHeap()
		h.name = customerID
		q.byCustomer[customerID] = h
	}
	h.set(taskID, due.UnixNano())
	q.owner[taskID] = h.name // one string per bucket, whatever the caller built
	q.customers.set(h.name, h.items[0].due)
}

func (q *TimerQueue) remove(taskID string) {
	customerID, ok := q.owner[taskID]
	if !ok {
		return
	}
	delete(q.owner, taskID)
	h := q.byCustomer[customerID]
	h.remove(taskID)
	if head, ok := h.min(); ok {
		q.customers.set(customerID, head.due)
	} else {
		delete(q.byCustomer, customerID)
		q.customers.remove(customerID)
	}
}

func (q *TimerQueue) has(taskID string) bool {
	_, ok := q.owner[taskID]
	return ok
}

func (q *TimerQueue) dueOf(taskID string) int64 {
	h := q.byCustomer[q.owner[taskID]]
	return h.items[h.pos[taskID]].due
}

// earliest returns the earliest due time in the queue.
func (q *TimerQueue) earliest() (time.Time, bool) {
	head, ok := q.customers.min()
	return time.Unix(0, head.due), ok
}

// earliestExcept returns the earliest due time of an item skip does not
// report. It visits only skipped items and the customers they delay, so
// it costs about as much as the number of skipped items.
func (q *TimerQueue) earliestExcept(skip func(taskID string) bool) (int64, bool) {
	var best int64
	found := false
	custs := q.customers.ascending(math.MaxInt64)
	for c, ok := custs.next(); ok && (!found || c.due < best); c, ok = custs.next() {
		h := q.byCustomer[c.key]
		if root := h.items[0]; !skip(root.key) {
			best, found = root.due, true // the customer's earliest; no later one can beat it
			continue
		}
		items := h.ascending(math.MaxInt64)
		for it, ok := items.next(); ok && (!found || it.due < best); it, ok = items.next() {
			if !skip(it.key) {
				best, found = it.due, true
				break
			}
		}
	}
	return best, found
}

// due returns up to limit task ids due at or before now, skipping those
// skip reports, taking turns across customers: every customer with a due
// item gets its earliest one before any customer gets a second.
func (q *TimerQueue) due(now time.Time, limit int, skip func(taskID string) bool) []string {
	n := now.UnixNano()
	next := func(it *ascending) (string, bool) {
		item, ok := it.next()
		for ok && skip != nil && skip(item.key) {
			item, ok = it.next()
		}
		return item.key, ok
	}
	// The first turn visits customers by their earliest item only until
	// limit is reached: with many customers and a small limit (the
	// alarm asks for its free slots), most are never iterated.
	var out []string
	var iters []*ascending // customers with an item in this turn
	custs := q.customers.ascending(n)
	for c, ok := custs.next(); ok && len(out) < limit; c, ok = custs.next() {
		it := q.byCustomer[c.key].ascending(n)
		if key, ok := next(it); ok {
			out = append(out, key)
			iters = append(iters, it)
		}
	}
	for len(out) < limit && len(iters) > 0 {
		for i := 0; i < len(iters) && len(out) < limit; {
			key, ok := next(iters[i])
			if !ok {
				iters = append(iters[:i], iters[i+1:]...)
				continue
			}
			out = append(out, key)
			i++
		}
	}
	return out
}
