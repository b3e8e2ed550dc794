package projections

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// at is a fixed instant plus n seconds, so due times are easy to read.
func at(n int) time.Time { return time.Unix(1_700_000_000, 0).Add(time.Duration(n) * time.Second) }

func TestTimerQueueOrdering(t *testing.T) {
	t.Parallel()

	t.Run("DueAscendingTiesByKey", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		q.set("c", "cust", at(2))
		q.set("b", "cust", at(1))
		q.set("a", "cust", at(2))
		q.set("d", "cust", at(0))
		got := q.due(at(10), 10, nil)
		want := []string{"d", "b", "a", "c"}
		if !slices.Equal(got, want) {
			t.Fatalf("due = %v, want %v", got, want)
		}
	})

	t.Run("SetUpdatesDue", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		q.set("a", "cust", at(1))
		q.set("b", "cust", at(2))
		q.set("a", "cust", at(3)) // update, not a second entry
		if q.Len() != 2 {
			t.Fatalf("Len = %d, want 2", q.Len())
		}
		if got, want := q.due(at(10), 10, nil), []string{"b", "a"}; !slices.Equal(got, want) {
			t.Fatalf("due = %v, want %v", got, want)
		}
		if e, ok := q.earliest(); !ok || !e.Equal(at(2)) {
			t.Fatalf("earliest = %v %v, want %v", e, ok, at(2))
		}
		q.set("a", "cust", at(0)) // moved earlier again
		if e, _ := q.earliest(); !e.Equal(at(0)) {
			t.Fatalf("earliest = %v, want %v", e, at(0))
		}
		if got := q.dueOf("a"); got != at(0).UnixNano() {
			t.Fatalf("dueOf(a) = %d, want %d", got, at(0).UnixNano())
		}
	})

	t.Run("Remove", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		q.set("a", "x", at(1))
		q.set("b", "y", at(2))
		q.remove("a")
		q.remove("a")       // twice is harmless
		q.remove("missing") // unknown is harmless
		if q.has("a") || !q.has("b") || q.Len() != 1 {
			t.Fatalf("after remove: has(a)=%v has(b)=%v Len=%d", q.has("a"), q.has("b"), q.Len())
		}
		if e, ok := q.earliest(); !ok || !e.Equal(at(2)) {
			t.Fatalf("earliest = %v %v, want %v", e, ok, at(2))
		}
		if _, ok := q.byCustomer["x"]; ok {
			t.Fatal("customer x keeps an empty heap")
		}
		q.remove("b")
		if _, ok := q.earliest(); ok || q.Len() != 0 || q.customers.Len() != 0 {
			t.Fatalf("empty queue: earliest ok=%v Len=%d customers=%d", ok, q.Len(), q.customers.Len())
		}
		if got := q.due(at(100), 10, nil); len(got) != 0 {
			t.Fatalf("due on empty queue = %v", got)
		}
	})

	t.Run("EarliestAcrossCustomers", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		q.set("a1", "A", at(5))
		q.set("b1", "B", at(3))
		q.set("a2", "A", at(4))
		if e, _ := q.earliest(); !e.Equal(at(3)) {
			t.Fatalf("earliest = %v, want %v", e, at(3))
		}
		q.remove("b1")
		if e, _ := q.earliest(); !e.Equal(at(4)) {
			t.Fatalf("earliest = %v, want %v", e, at(4))
		}
	})
}

func TestTimerQueueEarliestExcept(t *testing.T) {
	t.Parallel()
	q := newTimerQueue()
	q.set("a1", "A", at(1))
	q.set("a2", "A", at(7))
	q.set("b1", "B", at(2))
	q.set("b2", "B", at(5))
	q.set("c1", "C", at(6))
	for _, tc := range []struct {
		skipped []string
		want    int
		ok      bool
	}{
		{nil, 1, true},
		{[]string{"a1"}, 2, true},
		{[]string{"a1", "b1"}, 5, true},
		{[]string{"a1", "b1", "b2"}, 6, true},
		{[]string{"a1", "b1", "b2", "c1"}, 7, true},
		{[]string{"a1", "a2", "b1", "b2", "c1"}, 0, false},
	} {
		got, ok := q.earliestExcept(func(id string) bool { return slices.Contains(tc.skipped, id) })
		if ok != tc.ok || ok && got != at(tc.want).UnixNano() {
			t.Errorf("skipping %v: %v %v, want %v %v", tc.skipped, time.Unix(0, got), ok, at(tc.want), tc.ok)
		}
	}
}

// TestTimerQueueAsksOnce: earliestExcept and due ask their filter about
// each item at most once, and about a customer's items in due order, so a
// filter that counts what it let through (releasable) sees what either
// query would hand out alike. Here a limit-2 key whose first task is in
// flight: a2, the second of the key, is the earliest the alarm acts on.
func TestTimerQueueAsksOnce(t *testing.T) {
	t.Parallel()
	q := newTimerQueue()
	q.set("a1", "A", at(1)) // in flight, holding the first slot
	q.set("a2", "A", at(2))
	q.set("a3", "A", at(3)) // no slot left
	q.set("b1", "B", at(4))
	limit2 := func(asked *[]string) func(string) bool {
		granted := 0
		return func(id string) bool {
			*asked = append(*asked, id)
			if granted >= 2 && id[0] == 'a' {
				return true
			}
			if id[0] == 'a' {
				granted++
			}
			return id == "a1"
		}
	}
	var asked []string
	got, ok := q.earliestExcept(limit2(&asked))
	if !ok || got != at(2).UnixNano() || !slices.Equal(asked, []string{"a1", "a2"}) {
		t.Fatalf("earliestExcept = %v %v, asking %v; want %v, asking [a1 a2]", time.Unix(0, got), ok, asked, at(2))
	}
	asked = nil
	if keys := q.due(at(9), 10, limit2(&asked)); !slices.Equal(keys, []string{"a2", "b1"}) || !slices.Equal(asked, []string{"a1", "a2", "b1", "a3"}) {
		t.Fatalf("due = %v, asking %v; want [a2 b1], asking [a1 a2 b1 a3]", keys, asked)
	}
}

func TestTimerQueueDue(t *testing.T) {
	t.Parallel()

	t.Run("FairAcrossCustomers", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		for i := range 1000 {
			q.set(fmt.Sprintf("a%04d", i), "A", at(i%500))
		}
		q.set("b0", "B", at(900))
		got := q.due(at(1000), 2, nil)
		want := []string{"a0000", "b0"} // A's earliest, then B's only item
		if !slices.Equal(got, want) {
			t.Fatalf("due = %v, want %v", got, want)
		}
	})

	t.Run("TakesTurns", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		q.set("a1", "A", at(1))
		q.set("a2", "A", at(2))
		q.set("a3", "A", at(3))
		q.set("b1", "B", at(5))
		q.set("b2", "B", at(6))
		q.set("c1", "C", at(4))
		got := q.due(at(10), 10, nil)
		want := []string{"a1", "c1", "b1", "a2", "b2", "a3"}
		if !slices.Equal(got, want) {
			t.Fatalf("due = %v, want %v", got, want)
		}
	})

	t.Run("LimitLargerThanItems", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		q.set("a", "A", at(1))
		q.set("b", "B", at(2))
		if got := q.due(at(10), 1000, nil); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("due = %v", got)
		}
		if got := q.due(at(10), 0, nil); len(got) != 0 {
			t.Fatalf("due with limit 0 = %v", got)
		}
	})

	t.Run("SkipRespected", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		for i := range 5 {
			q.set(fmt.Sprintf("a%d", i), "A", at(i))
		}
		q.set("b0", "B", at(0))
		skipped := map[string]bool{"a0": true, "a1": true, "b0": true}
		got := q.due(at(10), 2, func(id string) bool { return skipped[id] })
		if want := []string{"a2", "a3"}; !slices.Equal(got, want) {
			t.Fatalf("due = %v, want %v", got, want)
		}
		all := q.due(at(10), 10, func(string) bool { return true })
		if len(all) != 0 {
			t.Fatalf("due with everything skipped = %v", all)
		}
	})

	t.Run("NotYetDueExcluded", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		q.set("a1", "A", at(1))
		q.set("a2", "A", at(5))
		q.set("b1", "B", at(6))
		q.set("c1", "C", at(5))
		got := q.due(at(5), 10, nil) // due exactly at now counts
		if want := []string{"a1", "c1", "a2"}; !slices.Equal(got, want) {
			t.Fatalf("due = %v, want %v", got, want)
		}
		if got := q.due(at(0), 10, nil); len(got) != 0 {
			t.Fatalf("due before anything = %v", got)
		}
	})

	t.Run("DoesNotChangeQueue", func(t *testing.T) {
		t.Parallel()
		q := newTimerQueue()
		for i := range 50 {
			q.set(fmt.Sprintf("t%02d", i), fmt.Sprintf("c%d", i%3), at(50-i))
		}
		first := q.due(at(100), 100, nil)
		second := q.due(at(100), 100, nil)
		if !slices.Equal(first, second) || len(first) != 50 || q.Len() != 50 {
			t.Fatalf("due changed the queue: %d then %d items, Len %d", len(first), len(second), q.Len())
		}
	})
}

// model is a naive timer queue: a map of items, sorted on every read.
type model struct {
	items map[string]modelItem
}

type modelItem struct {
	key, customer string
	due           int64
}

func byDueKey(a, b modelItem) int {
	return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.key, b.key))
}

func (m *model) earliest() (int64, bool) {
	if len(m.items) == 0 {
		return 0, false
	}
	best := int64(0)
	first := true
	for _, it := range m.items {
		if first || it.due < best {
			best, first = it.due, false
		}
	}
	return best, true
}

func (m *model) earliestExcept(skip func(string) bool) (int64, bool) {
	var best int64
	found := false
	for _, it := range m.items {
		if !skip(it.key) && (!found || it.due < best) {
			best, found = it.due, true
		}
	}
	return best, found
}

// due: customers whose earliest item (skipped or not) is due, ordered by
// that item then by customer; each round takes every such customer's next
// unskipped due item.
func (m *model) due(now int64, limit int, skip func(string) bool) []string {
	per := map[string][]modelItem{}
	for _, it := range m.items {
		per[it.customer] = append(per[it.customer], it)
	}
	type cust struct {
		name  string
		head  int64
		ready []string
	}
	var custs []cust
	for name, its := range per {
		slices.SortFunc(its, byDueKey)
		if its[0].due > now {
			continue
		}
		c := cust{name: name, head: its[0].due}
		for _, it := range its {
			if it.due <= now && (skip == nil || !skip(it.key)) {
				c.ready = append(c.ready, it.key)
			}
		}
		custs = append(custs, c)
	}
	slices.SortFunc(custs, func(a, b cust) int { return cmp.Or(cmp.Compare(a.head, b.head), cmp.Compare(a.name, b.name)) })
	var out []string
	for round := 0; len(out) < limit; round++ {
		took := false
		for _, c := range custs {
			if round < len(c.ready) && len(out) < limit {
				out = append(out, c.ready[round])
				took = true
			}
		}
		if !took {
			break
		}
	}
	return out
}

// TestTimerQueueModel checks a queue that keeps its own slots and one
// whose slots are kept outside (as task records keep them) against the
// model.
func TestTimerQueueModel(t *testing.T) {
	t.Parallel()
	t.Run("OwnSlots", func(t *testing.T) {
		t.Parallel()
		rapid.Check(t, func(t *rapid.T) { checkTimerQueueModel(t, newTimerQueue()) })
	})
	t.Run("OutsideSlots", func(t *testing.T) {
		t.Parallel()
		rapid.Check(t, func(t *rapid.T) {
			slots := map[string]*timerSlot{}
			checkTimerQueueModel(t, newSlotQueue(func(key string) *timerSlot {
				if slots[key] == nil {
					slots[key] = &timerSlot{}
				}
				return slots[key]
			}))
		})
	})
}

func checkTimerQueueModel(t *rapid.T, q *TimerQueue) {
	m := &model{items: map[string]modelItem{}}
	{
		nTasks := rapid.IntRange(1, 30).Draw(t, "tasks")
		customers := []string{"A", "B", "C", "D"}
		owner := make([]string, nTasks) // a task's customer never changes
		for i := range owner {
			owner[i] = rapid.SampledFrom(customers).Draw(t, "customer")
		}
		steps := rapid.IntRange(1, 120).Draw(t, "steps")
		for range steps {
			i := rapid.IntRange(0, nTasks-1).Draw(t, "task")
			key := fmt.Sprintf("t%02d", i)
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1:
				d := rapid.IntRange(0, 20).Draw(t, "due")
				q.set(key, owner[i], at(d))
				m.items[key] = modelItem{key: key, customer: owner[i], due: at(d).UnixNano()}
			case 4:
				d := rapid.IntRange(0, 20).Draw(t, "due")
				q.postpone(key, at(d))
				if it, ok := m.items[key]; ok {
					it.due = at(d).UnixNano()
					m.items[key] = it
				}
			case 2:
				q.remove(key)
				delete(m.items, key)
			case 3:
				now := at(rapid.IntRange(-1, 22).Draw(t, "now")).UnixNano()
				limit := rapid.IntRange(0, 35).Draw(t, "limit")
				mod := rapid.IntRange(0, 4).Draw(t, "skipMod")
				var skip func(string) bool
				if mod > 0 {
					skip = func(id string) bool { return int(id[len(id)-1])%(mod+1) == 0 }
				}
				got := q.due(time.Unix(0, now), limit, skip)
				want := m.due(now, limit, skip)
				if !slices.Equal(got, want) {
					t.Fatalf("due(now=%d, limit=%d, skipMod=%d) = %v, want %v", now, limit, mod, got, want)
				}
				if skip == nil {
					skip = func(string) bool { return false }
				}
				ge, gok := q.earliestExcept(skip)
				we, wok := m.earliestExcept(skip)
				if gok != wok || ge != we {
					t.Fatalf("earliestExcept(skipMod=%d) = %d %v, want %d %v", mod, ge, gok, we, wok)
				}
			}
			if q.Len() != len(m.items) {
				t.Fatalf("Len = %d, want %d", q.Len(), len(m.items))
			}
			ge, gok := q.earliest()
			we, wok := m.earliest()
			if gok != wok || gok && ge.UnixNano() != we {
				t.Fatalf("earliest = %v %v, want %d %v", ge, gok, we, wok)
			}
			for key, it := range m.items {
				if !q.has(key) || q.dueOf(key) != it.due {
					t.Fatalf("item %s: has=%v", key, q.has(key))
				}
			}
		}
	}
}

// TestTimerQueueSharedSlot checks queues that share their items' slots, as
// the queues of tasks by status share a task record's: setting an item in
// one takes it out of the other, and a remove from a queue that does not
// hold it changes nothing.
func TestTimerQueueSharedSlot(t *testing.T) {
	t.Parallel()
	slots := map[string]*timerSlot{"a": {}, "b": {}}
	slotOf := func(key string) *timerSlot { return slots[key] }
	q1, q2 := newSlotQueue(slotOf), newSlotQueue(slotOf)
	q1.set("a", "A", at(1))
	q1.set("b", "A", at(2))
	q2.set("a", "B", at(3))
	if q1.has("a") || !q2.has("a") || q1.Len() != 1 || q2.Len() != 1 || q2.dueOf("a") != at(3).UnixNano() {
		t.Fatalf("after the move: q1 has a %v (Len %d), q2 has a %v (Len %d)", q1.has("a"), q1.Len(), q2.has("a"), q2.Len())
	}
	if e, _ := q1.earliest(); !e.Equal(at(2)) {
		t.Fatalf("q1 earliest = %v, want %v", e, at(2))
	}
	q1.remove("a") // q2's
	q1.postpone("a", at(9))
	if !q2.has("a") || q2.dueOf("a") != at(3).UnixNano() {
		t.Fatal("q1 changed q2's item")
	}
	q2.set("a", "C", at(4)) // another bucket of the same queue
	if got := q2.entries(); len(got) != 1 || got["a"] != (timerEntry{bucket: "C", due: at(4).UnixNano()}) || len(q2.byCustomer) != 1 {
		t.Fatalf("q2 after a bucket move: %v, buckets %v", got, q2.byCustomer)
	}
	q2.remove("a")
	if q2.Len() != 0 || *slots["a"] != (timerSlot{}) {
		t.Fatalf("q2 after remove: Len %d, slot %+v", q2.Len(), *slots["a"])
	}
	q3 := newSlotQueue(slotOf)
	if q3.set("unknown", "A", at(1)); q3.Len() != 0 || q3.has("unknown") {
		t.Fatal("a key without a slot was queued")
	}
}
