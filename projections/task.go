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
	delivery                          string
	signal                            *events.Signal
	conc                              *events.Concurrency // the spec's concurrency limit, nil for none
	claim                             *aggregate.Owner    // nil until claimed
	// retry is the spec's retry policy, nil for the tasks without.
	retry *events.RetryPolicy
	// extra holds the fields a live task mostly leaves empty, nil for
	// the tasks with none of them (a queued task has none): 8 bytes
	// rather than 60, which with timer and statusAt keeps the record in
	// the 256-byte size class.
	extra *taskExtra
	// timer is the task's place in the timer queue of its status
	// (timerOf): those queues keep it here rather than in maps.
	timer timerSlot

	// Unix nanoseconds, 0 for the zero time.
	runAt, created, started, completed, deadline, nextAt, firstAt int64

	firstSeq, lastSeq events.Position
	readySeq          uint64
	version, attempt  int32
	members, open     int32
	statusAt          int32 // the index in its status's set (views.byStatus)
	status            uint8 // index in statuses
	published         bool
	rejected          bool
}

// taskExtra holds a task's rarely set fields: the State's Reason, Result,
// Effects (behind a pointer: 8 bytes rather than a slice's 24, for the
// tasks that have none), Retries, mailbox ids and Cursor, the children,
// and, for a lineage's head, the sequence at which the lineage closed.
type taskExtra struct {
	reason    string
	result    *events.Result
	effects   *[]events.Effect
	retries   *[]aggregate.Attempt
	lists     *taskLists
	closedSeq events.Position // 0 while the lineage is open
	cursor    int32
}

// extras returns a copy of t's extra fields (the zero value for none).
func (t *task) extras() taskExtra {
	if t.extra == nil {
		return taskExtra{}
	}
	return *t.extra
}

// setExtras sets t's extra fields, dropping the pointer when all are
// empty.
func (t *task) setExtras(x taskExtra) {
	switch {
	case x == (taskExtra{}):
		t.extra = nil
	case t.extra == nil:
		t.extra = &x
	default:
		*t.extra = x
	}
}

// closedSeq is the sequence at which t's lineage closed, if t is its
// head; 0 while it is open.
func (t *task) closedSeq() events.Position { return t.extras().closedSeq }

func (t *task) setClosedSeq(seq events.Position) {
	x := t.extras()
	x.closedSeq = seq
	t.setExtras(x)
}

// retries returns the State's Retries.
func (t *task) retries() []aggregate.Attempt {
	if x := t.extras(); x.retries != nil {
		return *x.retries
	}
	return nil
}

// taskLists are a task's mailbox message ids (the State's MailIDs) and
// children, in the order they came.
type taskLists struct{ mail, children []string }

func (t *task) mail() []string {
	if t.extra == nil || t.extra.lists == nil {
		return nil
	}
	return t.extra.lists.mail
}

func (t *task) children() []string {
	if t.extra == nil || t.extra.lists == nil {
		return nil
	}
	return t.extra.lists.children
}

// setLists sets t's lists.
func (t *task) setLists(mail, children []string) {
	x := t.extras()
	x.lists = x.lists.with(mail, children)
	t.setExtras(x)
}

// with returns l set to mail and children: nil when both are empty, l
// itself when it is not nil.
func (l *taskLists) with(mail, children []string) *taskLists {
	switch {
	case len(mail) == 0 && len(children) == 0:
		return nil
	case l == nil:
		return &taskLists{mail: mail, children: children}
	}
	l.mail, l.children = mail, children
	return l
}

var statuses = [...]aggregate.Status{"", aggregate.StatusScheduled, aggregate.StatusQueued, aggregate.StatusRunning,
	aggregate.StatusSucceeded, aggregate.StatusFailed, aggregate.StatusCanceled, aggregate.StatusTimedOut}

// statusIndex returns the index of s in statuses, which holds every
// status the aggregate gives.
func statusIndex(s aggregate.Status) uint8 { return uint8(slices.Index(statuses[:], s)) }

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
	t.status = statusIndex(s.Status)
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
	t.rejected = s.Rejected
	x := t.extras()
	x.result, x.reason = s.Result, s.Reason
	switch {
	case len(s.Effects) == 0:
		x.effects = nil
	case x.effects == nil || len(*x.effects) != len(s.Effects) || &(*x.effects)[0] != &s.Effects[0]:
		e := s.Effects // Apply never writes into a list it was given: the same array is the same list
		x.effects = &e
	}
	t.retry = s.Spec.Retry // a spec never changes: the pointer is the first event's
	switch {
	case len(s.Retries) == 0:
		x.retries = nil
	case x.retries == nil || len(*x.retries) != len(s.Retries):
		r := s.Retries // Apply only appends to a copy: a new length is a new list
		x.retries = &r
	}
	x.lists = x.lists.with(s.MailIDs, t.children())
	x.cursor = int32(s.Cursor)
	t.setExtras(x)
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
		Rejected: t.rejected, MailIDs: t.mail(), Retries: t.retries(),
		Version: int(t.version), FirstSeq: t.firstSeq, LastSeq: t.lastSeq,
	}
	if x := t.extra; x != nil {
		s.Result, s.Reason, s.Cursor = x.result, x.reason, int(x.cursor)
		if x.effects != nil {
			s.Effects = *x.effects
		}
	}
	if t.signal != nil {
		s.Spec.Signal = *t.signal
	}
	if t.claim != nil {
		s.Claim = *t.claim
	}
	return s
}

func (t *task) terminal() bool { return statuses[t.status].Terminal() }

// attemptNo is the State's Attempt: the number of the current attempt.
func (t *task) attemptNo() int {
	return len(t.retries()) + 1
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
