package projections

import (
	"slices"
	"time"
	"unique"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// task is the projections' record of one task: the aggregate state folded
// by the same aggregate.Apply the store uses (so a projection never
// disagrees with the aggregate about a transition), packed small because
// the projections hold every active task. It keeps what the views and
// their readers use: ids, customer, queue, status, times, delivery, claim,
// result, effects, retried attempts, mailbox ids and sequences. Of the
// spec it keeps the root, parent, queue, runAt, concurrency and retry
// policy, and the signal only until the ready notification that carries
// it is published (for a task with a retry policy, until it is terminal:
// a retry publishes another); the rest of the spec (and the message) is
// read from the task's first event when asked for.
//
// A root task also keeps its lineage's retention account (see retention):
// how many of the lineage's tasks the views hold, how many of them are
// open (not terminal, or waiting to report to their parent), and the
// sequence at which the last of them closed.
type task struct {
	id, customer, queue, root, parent string
	signal                            *events.Signal
	conc                              *events.Concurrency // the spec's concurrency limit, nil for none
	delivery, reason                  string
	claim                             *aggregate.Owner // nil until claimed
	result                            *events.Result
	// effects are the State's Effects behind a pointer: nil, 8 bytes
	// rather than a slice's 24, for the tasks that have none.
	effects *[]events.Effect
	// retry and retries are the spec's retry policy and the State's
	// Retries, nil for the tasks without.
	retry   *events.RetryPolicy
	retries *[]aggregate.Attempt
	// lists holds the mailbox ids and the children, nil for the many
	// tasks with neither: 8 bytes rather than two slices' 48, which
	// keeps the record in a smaller size class.
	lists *taskLists

	// Unix nanoseconds, 0 for the zero time.
	runAt, created, started, completed, deadline, nextAt, firstAt int64

	firstSeq, lastSeq, readySeq uint64
	closedSeq                   uint64 // 0 while the lineage is open
	version, cursor             int32
	attempt                     int32
	members, open               int32
	status                      uint8 // index in statuses
	published                   bool
	rejected                    bool
}

// taskLists are a task's mailbox message ids (the State's MailIDs) and
// children, in the order they came.
type taskLists struct{ mail, children []string }

func (t *task) mail() []string {
	if t.lists == nil {
		return nil
	}
	return t.lists.mail
}

func (t *task) children() []string {
	if t.lists == nil {
		return nil
	}
	return t.lists.children
}

// setLists sets t's lists, dropping the pointer when both are empty.
func (t *task) setLists(mail, children []string) {
	switch {
	case len(mail) == 0 && len(children) == 0:
		t.lists = nil
	case t.lists == nil:
		t.lists = &taskLists{mail: mail, children: children}
	default:
		t.lists.mail, t.lists.children = mail, children
	}
}

var statuses = [...]aggregate.Status{"", aggregate.StatusScheduled, aggregate.StatusQueued, aggregate.StatusRunning,
	aggregate.StatusSucceeded, aggregate.StatusFailed, aggregate.StatusCanceled, aggregate.StatusTimedOut}

// set packs s into t.
func (t *task) set(s *aggregate.State) {
	t.id = s.TaskID
	t.customer, t.queue = reuse(t.customer, s.CustomerID), reuse(t.queue, s.Spec.Queue)
	t.root, t.parent = s.Spec.RootID, s.Spec.ParentID
	if t.root == t.id {
		t.root = t.id // one copy of the bytes
	}
	switch {
	case s.Spec.Signal == (events.Signal{}) || s.Status.Terminal(),
		s.Status != aggregate.StatusScheduled && s.Spec.Retry == nil:
		t.signal = nil
	case t.signal == nil || *t.signal != s.Spec.Signal:
		sig := s.Spec.Signal
		t.signal = &sig
	}
	t.conc = s.Spec.Concurrency
	t.status = uint8(slices.Index(statuses[:], s.Status))
	t.runAt, t.created, t.started = nanos(s.Spec.RunAt), nanos(s.CreatedAt), nanos(s.StartedAt)
	t.completed, t.deadline = nanos(s.CompletedAt), nanos(s.Deadline)
	t.delivery, t.attempt, t.nextAt, t.published = s.Delivery.ID, int32(s.Delivery.Attempt), nanos(s.Delivery.NextAt), s.Delivery.Published
	t.firstAt, t.readySeq = nanos(s.Delivery.FirstAt), s.Delivery.ReadySeq
	switch {
	case s.Claim == (aggregate.Owner{}):
		t.claim = nil
	case t.claim == nil || *t.claim != s.Claim:
		c := s.Claim
		if c.DeliveryID == t.delivery {
			c.DeliveryID = t.delivery // one copy of the bytes
		}
		c.ExecutorID = reuse("", c.ExecutorID)
		t.claim = &c
	}
	t.result, t.reason, t.rejected = s.Result, s.Reason, s.Rejected
	switch {
	case len(s.Effects) == 0:
		t.effects = nil
	case t.effects == nil || len(*t.effects) != len(s.Effects) || &(*t.effects)[0] != &s.Effects[0]:
		e := s.Effects // Apply never writes into a list it was given: the same array is the same list
		t.effects = &e
	}
	t.retry = s.Spec.Retry // a spec never changes: the pointer is the first event's
	switch {
	case len(s.Retries) == 0:
		t.retries = nil
	case t.retries == nil || len(*t.retries) != len(s.Retries):
		r := s.Retries // Apply only appends to a copy: a new length is a new list
		t.retries = &r
	}
	t.setLists(s.MailIDs, t.children())
	t.cursor = int32(s.Cursor)
	t.version, t.firstSeq, t.lastSeq = int32(s.Version), s.FirstSeq, s.LastSeq
}

// state unpacks t.
func (t *task) state() aggregate.State {
	s := aggregate.State{
		TaskID: t.id, CustomerID: t.customer,
		Spec:   events.TaskSpec{RootID: t.root, ParentID: t.parent, Queue: t.queue, RunAt: unnanos(t.runAt), Concurrency: t.conc, Retry: t.retry},
		Status: statuses[t.status], CreatedAt: unnanos(t.created), StartedAt: unnanos(t.started),
		CompletedAt: unnanos(t.completed), Deadline: unnanos(t.deadline),
		Delivery: aggregate.Delivery{
			ID: t.delivery, Attempt: int(t.attempt), NextAt: unnanos(t.nextAt), FirstAt: unnanos(t.firstAt),
			Published: t.published, ReadySeq: t.readySeq,
		},
		Result: t.result, Reason: t.reason, Rejected: t.rejected,
		MailIDs: t.mail(), Cursor: int(t.cursor),
		Version: int(t.version), FirstSeq: t.firstSeq, LastSeq: t.lastSeq,
	}
	if t.signal != nil {
		s.Spec.Signal = *t.signal
	}
	if t.claim != nil {
		s.Claim = *t.claim
	}
	if t.effects != nil {
		s.Effects = *t.effects
	}
	if t.retries != nil {
		s.Retries = *t.retries
	}
	return s
}

func (t *task) terminal() bool { return statuses[t.status].Terminal() }

// attemptNo is the State's Attempt: the number of the current attempt.
func (t *task) attemptNo() int {
	if t.retries == nil {
		return 1
	}
	return len(*t.retries) + 1
}

// reuse returns s, as one copy shared by every task that repeats it
// (customers, queues, executors) unless it equals old, whose copy is
// already shared; a copy no task uses any more is garbage collected.
func reuse(old, s string) string {
	switch s {
	case old:
		return old
	case "":
		return ""
	}
	return unique.Make(s).Value()
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func unnanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n) // local, as the event decoder gives times
}
