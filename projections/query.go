package projections

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Views are the read models the Engine keeps. Their methods here and in
// due.go, keys.go, schedules.go and stats.go only read: each takes the
// read lock and answers from the events applied so far, so they are safe
// for concurrent use with the fold. Every write goes through the Engine
// (Run, Apply, ApplyOwn, Rebuild, a restored snapshot, and the
// corrections in repair.go) under the write lock. The zero Views is not
// usable: an Engine's are.
type Views struct {
	shards events.Shards // the log's layout, to tell a task's part

	// mu guards v, which a rebuild or a restored snapshot swaps whole.
	mu sync.RWMutex
	v  *views

	// caughtUp is set once the Engine has applied every event the log
	// held when Run started (Engine.CaughtUp).
	caughtUp atomic.Bool

	// queuedSig are the QueuedSignal channels by customer and queue,
	// closed by the fold (signalQueued).
	sigMu     sync.Mutex
	queuedSig map[string]chan struct{}
}

// Evicted counts the tasks of finished lineages retention dropped from
// the projections since the engine started.
func (vw *Views) Evicted() uint64 {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	return vw.v.evicted
}

// Task returns the projected state of a task. Of its spec it has the
// root, parent, queue and runAt, and the signal until the ready
// notification is published: read the rest from the task's first event.
func (vw *Views) Task(id string) (aggregate.State, bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	t := vw.v.tasks[id]
	if t == nil {
		return aggregate.State{}, false
	}
	return vw.v.state(t), true
}

// OpenIn returns how many lineages whose root is in one of parts have not
// ended: a task not terminal, or not reported to its parent yet.
func (vw *Views) OpenIn(parts []int) int {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	n := 0
	for _, t := range vw.v.tasks {
		if part, _ := vw.shards.Split(t.firstSeq); t.id == t.root && t.open > 0 && slices.Contains(parts, part) {
			n++
		}
	}
	return n
}

// Children returns the ids of a task's children in creation order.
func (vw *Views) Children(id string) []string {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	if t := vw.v.tasks[id]; t != nil {
		return slices.Clone(t.children())
	}
	return nil
}

// Lineage returns how many levels below its root task id sits (0 for a
// root) and how many tasks its lineage has, as far as the views hold them;
// ok is false when they do not hold the task. An open lineage is never
// evicted, so for a live task the views hold all of it that this process
// has applied.
func (vw *Views) Lineage(id string) (depth, size int, ok bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	t := vw.v.tasks[id]
	if t == nil {
		return 0, 0, false
	}
	h, depth := vw.v.ancestry(t)
	return depth, int(h.members), true
}

// ErrNotReady is returned by reads that need a caught-up projection
// before the engine has caught up with the log.
var ErrNotReady = errors.New("projections: not caught up with the log")

// Ancestors returns the projected states of a task's parent, its parent,
// and so on up to the root. A missing ancestor ends the chain. It fails
// with ErrNotReady until the engine has caught up.
func (vw *Views) Ancestors(id string) ([]aggregate.State, error) {
	if !vw.caughtUp.Load() {
		return nil, ErrNotReady
	}
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	var out []aggregate.State
	seen := map[string]bool{id: true}
	for t := vw.v.tasks[id]; t != nil && t.parent != ""; {
		pid := t.parent
		if seen[pid] {
			break
		}
		seen[pid] = true
		if t = vw.v.tasks[pid]; t != nil {
			out = append(out, vw.v.state(t))
		}
	}
	return out, nil
}

// TerminalAncestor returns the nearest of a task's ancestors (its parent,
// its parent's parent, … up to the root) that is terminal, as far as the
// views hold them: found is false when none is, or the views do not hold
// the task. It allocates nothing and is safe for concurrent use: claims
// and releases ask it of every task they would run.
func (vw *Views) TerminalAncestor(id string) (ancestorID string, status aggregate.Status, found bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	t := vw.v.tasks[id]
	for range 1 << 16 { // bounded, as ancestry: a damaged log's parent cycle cannot loop it
		if t == nil || t.parent == "" {
			break
		}
		p := vw.v.tasks[t.parent]
		if p == nil || p == t {
			break
		}
		if p.terminal() {
			return p.id, statuses[p.status], true
		}
		t = p
	}
	return "", "", false
}

// Earliest returns the earliest due time across the timer queues.
func (vw *Views) Earliest() (time.Time, bool) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	var best time.Time
	found := false
	for _, q := range vw.v.timers {
		if t, ok := q.earliest(); ok && (!found || t.Before(best)) {
			best, found = t, true
		}
	}
	return best, found
}

// TimerLen returns how many tasks wait in timer queue t.
func (vw *Views) TimerLen(t Timer) int {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	return vw.v.timers[t].Len()
}

// Admissions returns how many non-terminal root tasks customerID has
// (active) and how many root tasks it had admitted after since (recent;
// at most AdmissionWindow ago): what admission control counts.
func (vw *Views) Admissions(customerID string, since time.Time) (active, recent int) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	l := vw.v.admissions[customerID] // sorted (views.admit)
	// The first entry after since: a comparison that never answers "equal"
	// makes the search return it.
	first, _ := slices.BinarySearchFunc(l, since, func(at, since time.Time) int {
		if at.After(since) {
			return 1
		}
		return -1
	})
	return vw.v.activeRoots[customerID], len(l) - first
}

// QueueCounts returns the number of tasks per queue and status.
func (vw *Views) QueueCounts() map[string]map[aggregate.Status]int {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	out := make(map[string]map[aggregate.Status]int, len(vw.v.queueCounts))
	for q, m := range vw.v.queueCounts {
		out[q] = make(map[aggregate.Status]int, len(m))
		for s, n := range m {
			if n != 0 {
				out[q][s] = n
			}
		}
	}
	return out
}

// Queued returns up to limit of customerID's queued tasks on queue, the
// one published longest ago first, skipping ids skip reports.
func (vw *Views) Queued(customerID, queue string, limit int, skip func(taskID string) bool) []aggregate.State {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	h := vw.v.timers[Republish].byCustomer[queueBucket(customerID, queue)]
	if h == nil {
		return nil
	}
	var out []aggregate.State
	it := h.ascending(math.MaxInt64)
	for item, ok := it.next(); ok && len(out) < limit; item, ok = it.next() {
		if !skip(item.key) {
			out = append(out, vw.v.state(vw.v.tasks[item.key]))
		}
	}
	return out
}

// QueuedSignal returns a channel closed once a task of customerID is
// queued on queue (its ready notification published) after the call.
func (vw *Views) QueuedSignal(customerID, queue string) <-chan struct{} {
	vw.sigMu.Lock()
	defer vw.sigMu.Unlock()
	k := queueBucket(customerID, queue)
	ch := vw.queuedSig[k]
	if ch == nil {
		ch = make(chan struct{})
		vw.queuedSig[k] = ch
	}
	return ch
}

// signalQueued closes the QueuedSignal channel of customerID and queue.
func (vw *Views) signalQueued(customerID, queue string) {
	vw.sigMu.Lock()
	defer vw.sigMu.Unlock()
	k := queueBucket(customerID, queue)
	if ch := vw.queuedSig[k]; ch != nil {
		close(ch)
		delete(vw.queuedSig, k)
	}
}

// HasQueue reports whether a task was ever scheduled on queue, as far as
// the views keep it: only such a queue gets a ready consumer.
func (vw *Views) HasQueue(queue string) bool {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	_, ok := vw.v.queueCounts[queue]
	return ok
}

// CustomerQueue reports whether customerID has a non-terminal task on
// queue, and on how many queues it has non-terminal tasks.
func (vw *Views) CustomerQueue(customerID, queue string) (live bool, queues int) {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	qs := vw.v.liveQueues[customerID]
	return qs[queue] > 0, len(qs)
}

// Filter selects tasks for List. Empty fields match everything.
type Filter struct {
	Status     aggregate.Status
	Queue      string
	CustomerID string
	RootID     string
	// TaskID selects the one task with that id (a request id's task).
	TaskID string
	// Labels selects tasks carrying every one of these key=value pairs.
	Labels map[string]string
	// Kind selects the tasks of that kind.
	Kind string
	// CreatedAfter and CreatedBefore select tasks created strictly
	// after and strictly before them; zero is no bound.
	CreatedAfter, CreatedBefore time.Time
	// IDPrefix selects the tasks whose id starts with it.
	IDPrefix string
}

func (v *views) match(f *Filter, t *task) bool {
	return (f.Status == "" || statuses[t.status] == f.Status) &&
		(f.Queue == "" || t.queue == f.Queue) &&
		(f.CustomerID == "" || t.customer == f.CustomerID) &&
		(f.RootID == "" || t.root == f.RootID) &&
		(f.TaskID == "" || t.id == f.TaskID) &&
		(f.CreatedAfter.IsZero() || t.created > f.CreatedAfter.UnixNano()) &&
		(f.CreatedBefore.IsZero() || t.created < f.CreatedBefore.UnixNano()) &&
		strings.HasPrefix(t.id, f.IDPrefix) &&
		v.labels.has(t.id, f.Labels) &&
		(f.Kind == "" || v.kinds.of[t.id] == f.Kind)
}

// candidates returns the tasks List must check for f (nil for an id the
// views do not hold): the one task of a TaskID, the tasks of f's rarest
// label pair, those of its status (without an IDPrefix, which the ordered
// ids serve better), or (nil, false) for a walk of the ordered ids.
func (v *views) candidates(f *Filter) (iter.Seq[*task], bool) {
	byID := func(ids iter.Seq[string]) iter.Seq[*task] {
		return func(yield func(*task) bool) {
			for id := range ids {
				if !yield(v.tasks[id]) {
					return
				}
			}
		}
	}
	switch {
	case f.TaskID != "":
		return byID(slices.Values([]string{f.TaskID})), true
	case len(f.Labels) > 0:
		return byID(maps.Keys(v.labels.smallest(f.Labels))), true
	case f.Kind != "":
		return byID(maps.Keys(v.kinds.byKind[f.Kind])), true
	case f.Status != "" && f.IDPrefix == "":
		var set statusSet // none for a status the aggregate does not give
		if i := statusIndex(f.Status); int(i) < len(v.byStatus) {
			set = v.byStatus[i]
		}
		return slices.Values(set), true
	}
	return nil, false
}

// List returns up to limit tasks matching f with ids greater than after,
// ordered by id (task ids are time-ordered, so this is creation order for
// generated ids). A filter on a task id or on labels reads only the
// tasks the index names for it, a filter on a status that status's tasks;
// any other walks the customers' ordered ids from after (and IDPrefix) and
// stops at limit matches, so it reads only the ids it passes (for an
// operator naming no customer, up to limit matches of each customer).
// It is safe for concurrent use.
func (vw *Views) List(f Filter, after string, limit int) []aggregate.State {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	var out []aggregate.State
	add := func(t *task) bool {
		if t == nil || t.id <= after || !vw.v.match(&f, t) {
			return false
		}
		out = append(out, vw.v.state(t))
		return true
	}
	tasks, indexed := vw.v.candidates(&f)
	switch {
	case indexed:
		for t := range tasks {
			add(t)
		}
	case f.CustomerID != "":
		vw.v.walk(vw.v.ids[f.CustomerID], &f, after, limit, add)
	default:
		for _, x := range vw.v.ids {
			vw.v.walk(x, &f, after, limit, add)
		}
	}
	slices.SortFunc(out, func(a, b aggregate.State) int { return strings.Compare(a.TaskID, b.TaskID) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// walk offers add the tasks of x (nil: none) after after, in id order,
// until add took limit of them.
func (v *views) walk(x *idIndex, f *Filter, after string, limit int, add func(*task) bool) {
	if x == nil {
		return
	}
	n := 0
	x.ascend(f.IDPrefix, after, func(id string) bool {
		if add(v.tasks[id]) {
			n++
		}
		return n < limit
	})
}

// Digest returns a deterministic hash of every projected fact, so a
// projection built live and one rebuilt from the log (or restored from a
// snapshot) can be compared. It is a function of the events applied
// alone, never of the time: of a task's timer it hashes the due time the
// log gives (timerOf), not the one the alarm postponed a republish check
// to (Postpone) nor the one a heartbeat renewed a claim to (Renew), nor
// a claim's grace after a restart: none of these appends an event.
func (vw *Views) Digest() string {
	vw.mu.RLock()
	defer vw.mu.RUnlock()
	h := sha256.New()
	for _, id := range sortedKeys(vw.v.tasks) {
		t := vw.v.tasks[id]
		st := vw.v.state(t)                                           // labels included
		st.Result, st.Spec.Concurrency, st.Spec.Retry = nil, nil, nil // pointers: printed by value
		fmt.Fprintf(h, "%+v|%+v|%v|%d %d %d", st, t.extras().result, t.children(), t.members, t.open, t.closedSeq())
		if t.conc != nil {
			fmt.Fprintf(h, "|%+v", *t.conc)
		}
		if t.retry != nil {
			fmt.Fprintf(h, "|retry %+v", *t.retry)
		}
		fmt.Fprintln(h)
	}
	for _, id := range sortedKeys(vw.v.byKey) {
		k := vw.v.byKey[id]
		fmt.Fprintf(h, "key %s %s %q %v %v %d\n", id, k.CustomerID, k.Key, k.Holders, k.Attempts, k.LastSeq)
	}
	fmt.Fprintf(h, "retention kept %d\n", vw.v.kept)
	for i, q := range vw.v.timers {
		items := q.entries()
		for _, id := range sortedKeys(items) {
			due := items[id].due
			if t := vw.v.tasks[id]; t != nil {
				st := vw.v.state(t)
				if tm, at, ok := timerOf(&st); ok && tm == Timer(i) {
					due = at.UnixNano() // as the log gives it
				}
			}
			fmt.Fprintf(h, "timer %d %s %s %d\n", i, id, items[id].bucket, due)
		}
	}
	for _, c := range sortedKeys(vw.v.activeRoots) {
		fmt.Fprintf(h, "roots %s %d\n", c, vw.v.activeRoots[c])
	}
	for _, c := range sortedKeys(vw.v.admissions) {
		fmt.Fprintf(h, "admissions %s %v\n", c, vw.v.admissions[c])
	}
	byStatus := vw.v.statusIDs()
	for _, st := range sortedKeys(byStatus) {
		fmt.Fprintf(h, "status %s %v\n", st, byStatus[st])
	}
	enc := msgpack.NewEncoder(h)
	enc.SetSortMapKeys(true) // a task spec's labels hash the same every time
	for _, k := range sortedKeys(vw.v.scheds) {
		sc := vw.v.scheds[k]
		fmt.Fprintf(h, "schedule %s ", k)
		_ = enc.Encode(sc.state) // its exported fields: not the parsed timing's pointers
		fmt.Fprintf(h, " %+v %s\n", sc.runs, sc.pending)
	}
	for _, p := range sortedKeys(vw.v.labels.byPair) {
		fmt.Fprintf(h, "label %s %v\n", p, sortedKeys(vw.v.labels.byPair[p]))
	}
	for _, k := range sortedKeys(vw.v.kinds.byKind) {
		fmt.Fprintf(h, "kind %s %v\n", k, sortedKeys(vw.v.kinds.byKind[k]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
