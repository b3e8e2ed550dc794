package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/internal/service"
)

// tasks is the part of the service that writes and reads single tasks:
// scheduling (POST /v1/tasks and /v1/tasks/batch, with validation,
// lineage limits and admission), reading (GET /v1/tasks/{id}),
// canceling, retrying, the mailbox (POST and GET /v1/tasks/{id}/mailbox)
// and the stop check (POST /v1/tasks/{id}/check). It is safe for
// concurrent use.
type tasks struct {
	*core
	views    TaskViews
	delivery releaser
	// publishes is the ready queue's Publishes, asked once: only then does
	// create release a task due at once itself.
	publishes  bool
	readyGrace time.Duration
	usage      Usage
	admission  Admission
	metrics    *Metrics
	logger     zerolog.Logger
	feed       *feed // the mailbox reads a task's history
	failures   checkFailures
	// The Limits it enforces.
	maxLineageTasks, maxLineageDepth, maxQueues int
}

// releaser is the ready queue as Schedule uses it to hand on a task due
// at once that it released itself (Config.Delivery).
type releaser interface {
	Release(st aggregate.State)
}

// TaskViews is what scheduling, retrying and checking a task read from
// the projections, besides Applied: its lineage's size and ancestors,
// its customer's queues, and the repair of a timer queue.
type TaskViews interface {
	// Lineage returns how many levels below its root a task sits and
	// how many tasks its lineage has; ok is false for a task the views
	// do not hold.
	Lineage(id string) (depth, size int, ok bool)
	// Ancestors returns the states of a task's parent, its parent, and
	// so on up to the root; it fails until the views have caught up.
	Ancestors(id string) ([]aggregate.State, error)
	// TerminalAncestor returns the nearest ancestor of a task that has
	// ended, as far as the views hold them; found is false for none.
	TerminalAncestor(id string) (ancestorID string, status aggregate.Status, found bool)
	// CustomerQueue reports whether customerID has a live task on queue,
	// and on how many queues it has live tasks.
	CustomerQueue(customerID, queue string) (live bool, queues int)
	// Repair makes sure a task that s (just loaded from the log) says
	// waits on a timer is in that timer queue, and reports whether it
	// had to put it back.
	Repair(s aggregate.State) bool
}

// ScheduleRequest is a request for a new task (service.ScheduleRequest).
type ScheduleRequest = service.ScheduleRequest

// Schedule accepts a task. created is false when the customer's requestId
// was seen before; the existing task comes back then, whatever this
// request said. A task's id is derived from (customer, requestId) when a
// requestId is given, so racing retries land on one task.
func (s *tasks) Schedule(ctx context.Context, p Principal, req ScheduleRequest) (st aggregate.State, created bool, err error) {
	return s.schedule(ctx, p, req, nil)
}

// schedule is Schedule, settling as settle does with later.
func (s *tasks) schedule(ctx context.Context, p Principal, req ScheduleRequest, later *events.Position) (st aggregate.State, created bool, err error) {
	now := s.now()
	spec, customerID, err := s.validate(p, req, now)
	if err != nil {
		return st, false, err
	}
	return s.create(ctx, p, customerID, spec, now, later)
}

// requestTaskID is the id of the task a customer's request id names:
// derived from both, so racing retries land on one task.
func requestTaskID(customerID, requestID string) string {
	return events.DeriveID("r", customerID, requestID)
}

// create schedules the task spec describes for customerID (whose id its
// RequestID names, when it has one): Schedule's work once the request is
// checked, shared with RetryTask; now is the request's time. It settles
// as settle does with later.
func (s *tasks) create(ctx context.Context, p Principal, customerID string, spec events.TaskSpec, now time.Time, later *events.Position) (st aggregate.State, created bool, err error) {
	// Checked here, not only by the aggregate: a repeated request id
	// answers its task before the aggregate sees the spec, and an invalid
	// request is refused whether it repeats or not. Before the parent is
	// loaded, too: a parentId of "*" or ">" would match every task's
	// subject.
	if err := aggregate.ValidateRequest(spec); err != nil {
		return st, false, err
	}
	taskID := events.NewID()
	if spec.RequestID != "" {
		taskID = requestTaskID(customerID, spec.RequestID)
	}
	if spec.RelatedTaskID != "" {
		if _, err := s.Get(ctx, p, spec.RelatedTaskID); err != nil {
			return st, false, fmt.Errorf("relatedTaskId: %w", err)
		}
	}
	if spec.ParentID != "" {
		parent, err := s.store.Load(ctx, spec.ParentID)
		if err != nil && (!isCorrupt(err) || parent.CustomerID == customerID) {
			return st, false, s.unavailable(err) // another customer's corrupt task is not found, below
		}
		if !parent.Exists() || parent.CustomerID != customerID {
			return st, false, fmt.Errorf("%w: parent %s", aggregate.ErrNotFound, spec.ParentID)
		}
		if err := s.childRoom(parent); err != nil {
			// A repeated requestId answers the child it created before its
			// lineage ended or filled up (answered 200 with the existing
			// task), not a conflict.
			if spec.RequestID != "" {
				if st, found, rerr := s.repeated(ctx, taskID, spec.ParentID, later); found || rerr != nil {
					return st, false, rerr
				}
			}
			return st, false, err
		}
		spec.RootID = parent.Spec.RootID
	} else {
		spec.RootID = taskID
	}
	sc := aggregate.Schedule{TaskID: taskID, CustomerID: customerID, Spec: spec}
	if s.publishes && !spec.RunAt.After(now) && spec.Concurrency == nil {
		sc.DeliveryID, sc.NextAt = events.NewID(), now.Add(s.readyGrace)
	}
	var cmd aggregate.Command = sc
	if spec.ParentID == "" && s.usage != nil {
		// A replay is not charged again: look before admitting.
		if spec.RequestID != "" {
			if st, found, err := s.repeated(ctx, taskID, spec.ParentID, later); found || err != nil {
				return st, false, err
			}
		}
		if reason := s.admit(ctx, customerID, spec, now); reason != "" {
			s.metrics.Rejections.Inc()
			cmd = aggregate.Reject{TaskID: taskID, CustomerID: customerID, Spec: spec, Reason: reason}
		}
	}
	st, evs, err := s.store.Execute(ctx, taskID, p.Actor(), cmd)
	err = s.fromStore(err)
	if err == nil {
		crashpoint.Hit(crashpoint.Scheduled)
	}
	if errors.Is(err, aggregate.ErrExists) {
		st, _, err = s.repeated(ctx, taskID, spec.ParentID, later)
		return st, false, err
	}
	if err != nil {
		return st, false, err
	}
	if st.Version == 1 && st.Delivery.ID != "" {
		// The views take the release before anyone may claim the task: a
		// claim it is handed to (handoff) then folds its Claimed in at once
		// instead of waiting for the tail. The ready queue hands it on
		// without this request waiting for its publish.
		if s.applied.ApplyOwn(evs) {
			evs = nil
		}
		s.delivery.Release(st)
		if len(evs) == 0 {
			return st, true, nil
		}
	}
	if err := s.settle(ctx, st, evs, later); err != nil {
		return st, false, err
	}
	if st.Rejected {
		return st, false, &AdmissionError{Task: st}
	}
	return st, true, nil
}

// childRoom fails when parent may not have another child: with
// ErrParentTerminal when it has ended, with ErrAncestorTerminal when one
// of its ancestors has (as far as the views hold them: a cancel of this
// process is there once it answered), and as lineageRoom does.
func (s *tasks) childRoom(parent aggregate.State) error {
	if parent.Status.Terminal() {
		return fmt.Errorf("%w: parent %s is %s", ErrParentTerminal, parent.TaskID, parent.Status)
	}
	if id, status, found := s.views.TerminalAncestor(parent.TaskID); found {
		return fmt.Errorf("%w: %s, an ancestor of parent %s, is %s", ErrAncestorTerminal, id, parent.TaskID, status)
	}
	return s.lineageRoom(parent.TaskID)
}

// lineageRoom fails with ErrLineageLimit when a new child of parentID
// would be deeper than MaxLineageDepth or make its lineage larger than
// MaxLineageTasks. The counts come from the projections, so concurrent
// requests can overshoot by the number in flight; a parent the views do
// not hold yet (another process wrote it) is not checked.
func (s *tasks) lineageRoom(parentID string) error {
	depth, size, ok := s.views.Lineage(parentID)
	switch {
	case !ok:
	case s.maxLineageDepth >= 0 && depth+1 > s.maxLineageDepth:
		return fmt.Errorf("%w: a child of %s would be %d levels below its root, at most %d", ErrLineageLimit, parentID, depth+1, s.maxLineageDepth)
	case s.maxLineageTasks >= 0 && size+1 > s.maxLineageTasks:
		return fmt.Errorf("%w: the lineage of %s has %d tasks, at most %d", ErrLineageLimit, parentID, size, s.maxLineageTasks)
	}
	return nil
}

// repeated answers a repeated request id with the task it named (found),
// and a task admission rejected with the same rejection. A request id
// the customer used under another parent (or none) fails with
// ErrRequestIDConflict instead: the task it named is not this request's.
// It settles as settle does with later.
func (s *tasks) repeated(ctx context.Context, taskID, parentID string, later *events.Position) (st aggregate.State, found bool, err error) {
	if st, err = s.store.Load(ctx, taskID); err != nil {
		return st, false, s.unavailable(err)
	}
	if !st.Exists() {
		return st, false, nil
	}
	if st.Spec.ParentID != parentID {
		return aggregate.State{}, true, fmt.Errorf("%w: requestId %q named task %s, %s", ErrRequestIDConflict, st.Spec.RequestID, st.TaskID, underParent(st.Spec.ParentID))
	}
	if err := s.settle(ctx, st, nil, later); err != nil {
		return st, true, err
	}
	if st.Rejected {
		return st, true, &AdmissionError{Task: st}
	}
	return st, true, nil
}

// underParent describes where a task sits: under which parent, or as a
// root.
func underParent(parentID string) string {
	if parentID == "" {
		return "a root task"
	}
	return "a child of " + parentID
}

func (s *tasks) validate(p Principal, req ScheduleRequest, now time.Time) (events.TaskSpec, string, error) {
	customerID := req.CustomerID
	switch {
	case !p.IsOperator() && customerID != "" && customerID != p.CustomerID:
		return events.TaskSpec{}, "", invalid("customerId is taken from the token")
	case !p.IsOperator():
		customerID = p.CustomerID
	case customerID == "":
		customerID = events.DefaultCustomer
	}
	queue := req.Queue
	if queue == "" {
		queue = events.DefaultQueue
	}
	timeout := events.DefaultTimeoutSeconds
	if req.TimeoutSeconds != nil {
		timeout = *req.TimeoutSeconds
	}
	if req.RunAt != nil && req.DelaySeconds != nil {
		return events.TaskSpec{}, "", invalid("give runAt or delaySeconds, not both")
	}
	runAt := now
	if req.RunAt != nil {
		runAt = *req.RunAt
		if err := checkRunAt(runAt, now); err != nil {
			return events.TaskSpec{}, "", err
		}
	}
	if req.DelaySeconds != nil {
		d := *req.DelaySeconds
		if !(d >= 0 && d <= maxDelaySeconds) { // NaN too
			return events.TaskSpec{}, "", invalid("delaySeconds must be between 0 and %d", maxDelaySeconds)
		}
		runAt = now.Add(time.Duration(d * float64(time.Second)))
	}
	if err := events.ValidID(customerID); err != nil {
		return events.TaskSpec{}, "", invalid("customerId: %v", err)
	}
	msg := req.Message
	if msg.CreatedAt.IsZero() {
		msg.CreatedAt = now
	}
	spec := events.TaskSpec{
		ParentID: req.ParentID, RequestID: req.RequestID, RelatedTaskID: req.RelatedTaskID,
		Queue: queue, Signal: req.Signal, Repo: req.Repo, Message: msg,
		RunAt: runAt.UTC(), TimeoutSeconds: timeout, Concurrency: req.Concurrency, Retry: retryPolicy(req.Retry),
		Labels: req.Labels, Kind: req.Kind, Payload: req.Payload,
	}
	if err := events.ValidID(queue); err != nil {
		return events.TaskSpec{}, "", invalid("queue: %v", err)
	}
	if err := s.checkQueues(customerID, queue); err != nil {
		return events.TaskSpec{}, "", err
	}
	return spec, customerID, nil
}

// retryPolicy fills a requested retry policy's defaults (api.RetryRequest);
// the aggregate checks its bounds.
func retryPolicy(r *api.RetryRequest) *events.RetryPolicy {
	if r == nil {
		return nil
	}
	or := func(v *int, def int) int {
		if v == nil {
			return def
		}
		return *v
	}
	on := r.On
	if on == nil {
		on = []string{events.RetryOnFailed}
	}
	return &events.RetryPolicy{
		MaxAttempts:       or(r.MaxAttempts, 1),
		BackoffSeconds:    or(r.BackoffSeconds, events.DefaultBackoffSeconds),
		MaxBackoffSeconds: or(r.MaxBackoffSeconds, events.DefaultMaxBackoffSeconds),
		On:                on,
	}
}

// checkQueues refuses a task on one more queue than MaxQueuesPerCustomer
// queues the customer has live tasks on. Counts come from the projections,
// so racing requests may overshoot by those in flight.
func (s *tasks) checkQueues(customerID, queue string) error {
	max := s.maxQueues
	if max < 0 {
		return nil
	}
	if live, n := s.views.CustomerQueue(customerID, queue); !live && n >= max {
		return invalid("customer %s has live tasks on %d queues, at most %d: use one of those, or wait for their tasks to finish", customerID, n, max)
	}
	return nil
}

// checkRunAt fails with ErrInvalid for a runAt before 1970 or more than
// maxDelaySeconds after now.
func checkRunAt(runAt, now time.Time) error {
	if runAt.Before(time.Unix(0, 0)) || runAt.After(now.Add(maxDelaySeconds*time.Second)) {
		return invalid("runAt must be after 1970 and at most %d seconds ahead", maxDelaySeconds)
	}
	return nil
}

// maxDelaySeconds bounds how far ahead a task may be scheduled: 52 of the
// longest timeouts (a year).
const maxDelaySeconds = events.MaxTimeoutSeconds * 52

// Get returns a task as the log has it now.
func (s *tasks) Get(ctx context.Context, p Principal, id string) (aggregate.State, error) {
	return s.get(ctx, p, id)
}

// Cancel cancels a non-terminal task.
func (s *tasks) Cancel(ctx context.Context, p Principal, id, reason string) (aggregate.State, error) {
	return s.execute(ctx, p, id, p.Actor(), aggregate.Cancel{Reason: reason}, nil)
}
