package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// History returns every event of a task in log order.
func (s *feed) History(ctx context.Context, p Principal, id string) ([]events.Event, error) {
	if err := events.ValidID(id); err != nil {
		return nil, invalid("task id: %v", err)
	}
	evs, err := s.store.History(ctx, id)
	st := aggregate.Replay(evs)
	if err := s.visible(p, id, st, err); err != nil {
		return nil, err
	}
	return s.withSlots(ctx, st, evs)
}

// LineageHistory returns the events of a task's whole lineage (its root
// and every descendant), interleaved in log order.
func (s *feed) LineageHistory(ctx context.Context, p Principal, id string) ([]events.Event, error) {
	st, err := s.get(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if s.retained(st.Spec.RootID) {
		var all []events.Event
		queue := []string{st.Spec.RootID}
		for len(queue) > 0 && len(all) < maxTreeNodes*64 {
			tid := queue[0]
			queue = queue[1:]
			evs, err := s.store.History(ctx, tid)
			if err != nil {
				return nil, s.unavailable(err)
			}
			all = append(all, evs...)
			queue = append(queue, s.views.Children(tid)...)
		}
		if s.retained(st.Spec.RootID) { // not evicted during the walk
			slices.SortFunc(all, func(a, b events.Event) int { return cmp.Compare(a.Seq, b.Seq) })
			return all, nil
		}
	}
	return s.lineageFromLog(ctx, st)
}

// retained reports whether the projections hold the task: a lineage
// evicted by retention is known only to the log.
func (s *feed) retained(id string) bool {
	_, ok := s.applied.Task(id)
	return ok
}

// lineageFromLog reads the lineage of task st from the log.
func (s *feed) lineageFromLog(ctx context.Context, st aggregate.State) ([]events.Event, error) {
	root := st
	if st.Spec.RootID != st.TaskID {
		var err error
		if root, err = s.store.Load(ctx, st.Spec.RootID); err != nil {
			return nil, s.unavailable(err)
		}
	}
	evs, err := s.store.Lineage(ctx, root)
	if err != nil {
		return nil, s.unavailable(err)
	}
	return evs, nil
}

// CustomerEvents calls fn for every event of customerID's tasks stored at
// or after since, in log order, and quarantine (logged and counted first)
// for every message there that does not decode; nil quarantine passes
// over them.
func (s *feed) CustomerEvents(ctx context.Context, p Principal, customerID string, since time.Time, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error {
	if !p.IsOperator() && p.CustomerID != customerID {
		return fmt.Errorf("%w: customer %s", aggregate.ErrNotFound, customerID)
	}
	skip := func(c *events.CorruptError) error {
		s.quarantined("customer events", c)
		if quarantine == nil {
			return nil
		}
		return quarantine(c)
	}
	if err := s.store.CustomerEvents(ctx, customerID, since, fn, skip); err != nil {
		return s.unavailable(err)
	}
	return nil
}

// quarantined counts a message of the log that does not decode, which
// the read named by what passes over with a marker, and logs it through
// the repeats limiter keyed by its seq: a customer reading the feed in a
// loop does not write a line per read.
func (s *feed) quarantined(what string, c *events.CorruptError) {
	s.skipped.Inc()
	s.repeats.Log(zerolog.WarnLevel, fmt.Sprintf("quarantine skip seq %d", c.Pos),
		"skipped a message of the log that does not decode (quarantined; taskledger replay quarantine lists them)",
		func(e *zerolog.Event) {
			e.Err(c.Err).Uint64("seq", uint64(c.Pos)).Str("subject", c.Subject).Str("read", what)
		})
}

// withSpec fills in the spec (message included) that the projections
// keep only in part, from the task's first event (one read by sequence):
// a task's spec never changes after it.
func (s *feed) withSpec(ctx context.Context, st *aggregate.State) error {
	ev, err := s.store.Event(ctx, st.FirstSeq)
	if err != nil {
		return s.unavailable(err)
	}
	switch p := ev.Data.(type) {
	case events.TaskScheduled:
		st.Spec = p.Spec
	case events.AdmissionRejected:
		st.Spec = p.Spec
	}
	return nil
}

// Node is one task of a tree with its children (service.Node).
type Node = service.Node

// maxTreeNodes bounds a tree answer.
const maxTreeNodes = 10000

// Tree returns the whole lineage of a task, from its root, each task
// without its payload (as List; Get has it).
func (s *feed) Tree(ctx context.Context, p Principal, id string) (Node, error) {
	st, err := s.get(ctx, p, id)
	if err != nil {
		return Node{}, err
	}
	var n Node
	if !s.retained(st.Spec.RootID) {
		evs, err := s.lineageFromLog(ctx, st)
		if err != nil {
			return Node{}, err
		}
		n = treeOf(evs, st.Spec.RootID)
	} else {
		budget := maxTreeNodes
		if n, err = s.subtree(ctx, st.Spec.RootID, &budget); err != nil {
			return Node{}, err
		}
	}
	withoutPayloads(&n)
	return n, nil
}

// withoutPayloads drops the payload of every task of the tree n: up to
// 256 KiB each, in a lineage of up to thousands of tasks.
func withoutPayloads(n *Node) {
	n.Task.Spec.Payload = nil
	for i := range n.Children {
		withoutPayloads(&n.Children[i])
	}
}

// treeOf folds a lineage's events into its tree, children in creation
// order, at most maxTreeNodes tasks.
func treeOf(evs []events.Event, rootID string) Node {
	states := map[string]aggregate.State{}
	children := map[string][]string{}
	for _, ev := range evs {
		before := states[ev.TaskID]
		st := aggregate.Apply(before, ev)
		if !before.Exists() && st.Spec.ParentID != "" {
			children[st.Spec.ParentID] = append(children[st.Spec.ParentID], ev.TaskID)
		}
		states[ev.TaskID] = st
	}
	budget := maxTreeNodes
	var build func(id string) Node
	build = func(id string) Node {
		n := Node{Task: states[id]}
		for _, c := range children[id] {
			if budget--; budget <= 0 {
				break
			}
			n.Children = append(n.Children, build(c))
		}
		return n
	}
	return build(rootID)
}

func (s *feed) subtree(ctx context.Context, id string, budget *int) (Node, error) {
	st, ok := s.applied.Task(id)
	if !ok {
		return Node{}, s.unavailable(fmt.Errorf("task %s not in the projections yet", id))
	}
	if err := s.withSpec(ctx, &st); err != nil {
		return Node{}, err
	}
	n := Node{Task: st}
	for _, c := range s.views.Children(id) {
		if *budget--; *budget <= 0 {
			break
		}
		child, err := s.subtree(ctx, c, budget)
		if err != nil {
			return Node{}, err
		}
		n.Children = append(n.Children, child)
	}
	return n, nil
}
