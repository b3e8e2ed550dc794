package projections

import (
	"container/heap"
	"math"
	"time"
)

// timerSlot is where one item of a TimerQueue is: the heap that holds it
// (nil while none does) and its index in that heap's items, kept up to
// date as the heap moves items. A queue of tasks by status keeps the slot
// in the task's record, so it needs no map of its own (see
// TimerQueue.slotOf); the other queues keep theirs in a map.
type timerSlot struct {
	h *dueHeap
	i int32
}

// dueHeap is a min-heap of keys by due time; each item's slot follows its
// index. Ties break by key so the order is deterministic.
type dueHeap struct {
	items []dueItem
	name  string      // the bucket's key in its TimerQueue
	q     *TimerQueue // the queue whose bucket it is; nil for a queue's heap of buckets
	at    timerSlot   // the bucket's place in its queue's heap of buckets
}

type dueItem struct {
	key  string
	due  int64 // unix nanoseconds
	slot *timerSlot
}

func (h *dueHeap) Len() int { return len(h.items) }
func (h *dueHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	return a.due < b.due || a.due == b.due && a.key < b.key
}
func (h *dueHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].slot.i, h.items[j].slot.i = int32(i), int32(j)
}
func (h *dueHeap) Push(x any) {
	it := x.(dueItem)
	*it.slot = timerSlot{h: h, i: int32(len(h.items))}
	h.items = append(h.items, it)
}
func (h *dueHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items[len(h.items)-1] = dueItem{}
	h.items = h.items[:len(h.items)-1]
	*it.slot = timerSlot{}
	return it
}

// set puts key, whose slot is s, in h at due, or moves it there if h
// holds it already. s must not be in another heap.
func (h *dueHeap) set(key string, due int64, s *timerSlot) {
	if s.h == h {
		h.items[s.i].due = due
		heap.Fix(h, int(s.i))
		return
	}
	heap.Push(h, dueItem{key: key, due: due, slot: s})
}

// remove takes the item in slot s, which h holds, out of h.
func (h *dueHeap) remove(s *timerSlot) { heap.Remove(h, int(s.i)) }

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
	n          int      // items held
	// slotOf, if set, returns the slot of key (nil for none), kept
	// outside the queue: a task's record holds one slot, shared by the
	// queues of tasks by status, of which a task is in one at a time
	// (set moves it). Without it the queue keeps its slots in own.
	slotOf func(key string) *timerSlot
	own    map[string]*timerSlot
}

func newTimerQueue() *TimerQueue {
	return &TimerQueue{byCustomer: make(map[string]*dueHeap), customers: &dueHeap{}, own: make(map[string]*timerSlot)}
}

// newSlotQueue returns a TimerQueue whose items' slots slotOf keeps.
func newSlotQueue(slotOf func(key string) *timerSlot) *TimerQueue {
	q := newTimerQueue()
	q.slotOf, q.own = slotOf, nil
	return q
}

// Len is the number of tasks in the queue.
func (q *TimerQueue) Len() int { return q.n }

// slot returns key's slot if q holds key, else nil.
func (q *TimerQueue) slot(key string) *timerSlot {
	var s *timerSlot
	if q.slotOf != nil {
		s = q.slotOf(key)
	} else {
		s = q.own[key]
	}
	if s == nil || s.h == nil || s.h.q != q {
		return nil
	}
	return s
}

// set puts taskID in customerID's bucket at due, or moves it there. A
// task whose slot another queue holds leaves that queue: a projection
// behind the log has it in the queue of its old status when Repair puts
// it in the one its fresh state names. A key slotOf has no slot for is
// not queued.
func (q *TimerQueue) set(taskID, customerID string, due time.Time) {
	s := q.slotFor(taskID)
	if s == nil {
		return
	}
	h := q.byCustomer[customerID]
	if h == nil {
		h = &dueHeap{name: customerID, q: q}
		q.byCustomer[customerID] = h
	}
	if s.h != nil && s.h != h {
		s.h.q.drop(s)
	}
	if s.h == nil {
		q.n++
	}
	h.set(taskID, due.UnixNano(), s)
	q.customers.set(h.name, h.items[0].due, &h.at)
}

// slotFor returns key's slot, making one if q keeps its own.
func (q *TimerQueue) slotFor(key string) *timerSlot {
	if q.slotOf != nil {
		return q.slotOf(key)
	}
	s := q.own[key]
	if s == nil {
		s = &timerSlot{}
		q.own[key] = s
	}
	return s
}

// postpone moves taskID's due time to due if q holds it.
func (q *TimerQueue) postpone(taskID string, due time.Time) {
	if s := q.slot(taskID); s != nil {
		q.set(taskID, s.h.name, due)
	}
}

func (q *TimerQueue) remove(taskID string) {
	if s := q.slot(taskID); s != nil {
		q.drop(s)
		delete(q.own, taskID)
	}
}

// drop takes the item in slot s, which q holds, out of q (its own slot,
// if q keeps them, stays).
func (q *TimerQueue) drop(s *timerSlot) {
	h := s.h
	h.remove(s)
	q.n--
	if head, ok := h.min(); ok {
		q.customers.set(h.name, head.due, &h.at)
	} else {
		delete(q.byCustomer, h.name)
		q.customers.remove(&h.at)
	}
}

func (q *TimerQueue) has(taskID string) bool { return q.slot(taskID) != nil }

// dueOf returns the due time of taskID, which q must hold.
func (q *TimerQueue) dueOf(taskID string) int64 {
	s := q.slot(taskID)
	return s.h.items[s.i].due
}

// timerEntry is an item of a TimerQueue as entries reports it.
type timerEntry struct {
	bucket string
	due    int64
}

// entries returns every item of q by key: for digests and tests.
func (q *TimerQueue) entries() map[string]timerEntry {
	out := make(map[string]timerEntry, q.n)
	for name, h := range q.byCustomer {
		for _, it := range h.items {
			out[it.key] = timerEntry{bucket: name, due: it.due}
		}
	}
	return out
}

// earliest returns the earliest due time in the queue.
func (q *TimerQueue) earliest() (time.Time, bool) {
	head, ok := q.customers.min()
	return time.Unix(0, head.due), ok
}

// earliestExcept returns the earliest due time of an item skip does not
// report. It visits only skipped items and the customers they delay, so
// it costs about as much as the number of skipped items. Like due, it
// asks skip about each item at most once, and about a customer's items in
// due order: a filter that counts what it let through (releasable) sees
// each item once, in the order due hands them out.
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
		items.next() // the root, skipped above
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
