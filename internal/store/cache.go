package store

import "github.com/taskledger/taskledger/aggregate"

// taskCache holds the states Execute decides on, in two parts, so that
// the cost of a command does not grow with the number of tasks ever
// written (docs/performance.md, "Growth"):
//
//   - live: tasks not yet terminal, up to size; a full map evicts an
//     arbitrary entry. Live tasks are the ones commands come for.
//   - finished: terminal tasks, only the most recent size/8 (at least 1)
//     in a ring, oldest out first. A finished task is still written
//     (a mailbox cursor, a late duplicate result) but seldom; one that
//     left the ring is read from the log again.
//
// Before the split, finished tasks stayed in the one map and, once it
// was full, evicted live ones at random: every command on an evicted
// task read its subject from the log, and past CacheSize tasks written
// that was most of them.
//
// It is not safe for concurrent use: the Store's mu guards it.
type taskCache struct {
	size     int
	live     map[string]aggregate.State
	finished map[string]ringEntry
	ring     []string // task ids by slot; "" for a free one
	next     int      // the slot the next finished task takes
}

// ringEntry is a finished task's state and the ring slot that holds its
// id, so a slot reused for another task evicts only the task it holds.
type ringEntry struct {
	st   aggregate.State
	slot int
}

// newTaskCache returns a cache of up to size live tasks and size/8
// finished ones; size ≤ 0 caches nothing.
func newTaskCache(size int) *taskCache {
	c := &taskCache{size: size, live: make(map[string]aggregate.State), finished: make(map[string]ringEntry)}
	if size > 0 {
		c.ring = make([]string, max(size/8, 1))
	}
	return c
}

// get returns the cached state of taskID.
func (c *taskCache) get(taskID string) (aggregate.State, bool) {
	if st, ok := c.live[taskID]; ok {
		return st, true
	}
	e, ok := c.finished[taskID]
	return e.st, ok
}

// put caches st: among the live tasks, or once it is terminal among the
// finished ones, where it takes the oldest finished task's slot.
func (c *taskCache) put(st aggregate.State) {
	if c.size <= 0 {
		return
	}
	id := st.TaskID
	if !st.Status.Terminal() {
		c.dropFinished(id)
		putBounded(c.live, c.size, id, st)
		return
	}
	delete(c.live, id)
	if e, ok := c.finished[id]; ok {
		c.finished[id] = ringEntry{st: st, slot: e.slot}
		return
	}
	slot := c.next
	c.next = (c.next + 1) % len(c.ring)
	if old := c.ring[slot]; old != "" {
		delete(c.finished, old)
	}
	c.ring[slot] = id
	c.finished[id] = ringEntry{st: st, slot: slot}
}

// drop forgets taskID.
func (c *taskCache) drop(taskID string) {
	delete(c.live, taskID)
	c.dropFinished(taskID)
}

func (c *taskCache) dropFinished(taskID string) {
	if e, ok := c.finished[taskID]; ok {
		c.ring[e.slot] = ""
		delete(c.finished, taskID)
	}
}

// putBounded stores v under id in m, first evicting one arbitrary entry
// when m is full at size and does not hold id yet.
func putBounded[V any](m map[string]V, size int, id string, v V) {
	if _, ok := m[id]; !ok && len(m) >= size {
		for k := range m {
			delete(m, k)
			break
		}
	}
	m[id] = v
}
