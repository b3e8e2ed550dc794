package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/internal/delivery"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/internal/store"
)

// Errors the service adds to the aggregate's: internal/service's, named
// here too.
var (
	ErrParentTerminal = service.ErrParentTerminal
	ErrUnavailable    = service.ErrUnavailable
	ErrLineageLimit   = service.ErrLineageLimit
	ErrTooManyPolls   = service.ErrTooManyPolls
)

// Store is the log as the service uses it.
type Store interface {
	Execute(ctx context.Context, taskID, actor string, cmd aggregate.Command) (aggregate.State, []events.Event, error)
	// ExecuteSeen is Execute for a command chosen from the task as it
	// stood at sequence seen.
	ExecuteSeen(ctx context.Context, taskID, actor string, cmd aggregate.Command, seen uint64) (aggregate.State, []events.Event, error)
	Load(ctx context.Context, taskID string) (aggregate.State, error)
	History(ctx context.Context, taskID string) ([]events.Event, error)
	Event(ctx context.Context, seq uint64) (events.Event, error)
	// Lineage returns the events of the lineage root heads, in log order.
	Lineage(ctx context.Context, root aggregate.State) ([]events.Event, error)
	// CustomerEvents calls fn for every event of a customer's tasks
	// stored at or after since, in log order.
	CustomerEvents(ctx context.Context, customerID string, since time.Time, fn func(events.Event) error) error
	// KeyHistory returns every event of a concurrency key in log order.
	KeyHistory(ctx context.Context, customerID, key string) ([]events.Event, error)
	// Follow calls fn for every event stored after the positions after
	// (by shard) on one of the subjects filters gives for a shard's
	// subjects (none: all), then for each later one, until ctx ends or fn
	// fails.
	Follow(ctx context.Context, filters func(events.Subjects) []string, after []uint64, fn func(events.Event) error) error
	// LastSeq returns the sum of the shards' last stream sequences: the
	// log's last sequence when it has one shard (0 when empty).
	LastSeq(ctx context.Context) (uint64, error)
	// LastPositions returns the position of every shard's last event.
	LastPositions(ctx context.Context) ([]uint64, error)
	// Shards says how the log is sharded.
	Shards() events.Shards
	Now() time.Time
}

// Views is every view the service reads from the projections
// (projections.Engine): the union of what its parts declare, so that one
// value configures them all.
type Views interface {
	Applied
	TaskViews
	ClaimViews
	FeedViews
}

// Applied is what every part of the service reads from the projections:
// whether they hold a write yet (read-your-writes) and who owns a task.
// Its methods are safe for concurrent use.
type Applied interface {
	// CaughtUp reports whether the views have applied everything the log
	// held when they started: before, a listing would miss tasks.
	CaughtUp() bool
	// WaitFor returns once the views have applied the event at seq, or
	// with ctx's error when ctx ends first.
	WaitFor(ctx context.Context, seq uint64) error
	// ApplyOwn folds events just appended into the views where it may
	// ahead of their tail, and reports whether all of them are in.
	ApplyOwn(evs []events.Event) bool
	// Task returns a task as the views hold it; ok is false for one they
	// do not hold (not applied yet, or evicted by retention).
	Task(id string) (aggregate.State, bool)
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
	// CustomerQueue reports whether customerID has a live task on queue,
	// and on how many queues it has live tasks.
	CustomerQueue(customerID, queue string) (live bool, queues int)
	// Repair makes sure a task that s (just loaded from the log) says
	// waits on a timer is in that timer queue, and reports whether it
	// had to put it back.
	Repair(s aggregate.State) bool
}

// Delivery is the ready queue as the service uses it (delivery.Queues).
type Delivery interface {
	// Dispatcher returns queue's dispatcher, on the queue's ready
	// consumer, which it creates (again) when needed; the error is the
	// ready stream's.
	Dispatcher(ctx context.Context, queue string) (*delivery.Dispatcher, error)
	// Publishes reports whether PublishReleased publishes what no
	// claimer here takes: only then does Schedule release a task itself.
	Publishes() bool
	// PublishReleased hands st, just released, to a claimer waiting in
	// this process, or else publishes its notification and records
	// ReadyPublished; it returns the task after that and the events
	// appended. A failure is left to the alarm.
	PublishReleased(ctx context.Context, st aggregate.State) (aggregate.State, []events.Event)
	// Drop deletes the ready notification of a task claimed without it.
	Drop(ctx context.Context, st aggregate.State)
	// Waiting returns how many claimers wait on queue ("": every queue).
	Waiting(queue string) int
	// Close ends the pulls of ready notifications; it is idempotent.
	Close()
}

var _ Delivery = (*delivery.Queues)(nil)

// Config configures a Service.
type Config struct {
	Store Store
	Views Views
	Runs  Runs // the tasks' Run state; nil: the run calls are ErrUnavailable
	// Delivery is the ready queue claims/next waits on. When it
	// publishes (Delivery.Publishes), Schedule releases a task due at
	// once in its TaskScheduled and hands it off or publishes its ready
	// notification itself (then records ReadyPublished) before it
	// answers, instead of leaving both to the alarm: two writes and two
	// alarm hops fewer. Otherwise the alarm releases and publishes every
	// task. Default: a delivery.Queues without a publisher, on JS,
	// ReadyStream, Subjects, AckWait and Limits.QueueIdle (which
	// configure nothing else).
	Delivery Delivery
	JS       jetstream.JetStream // required without Delivery
	// ReadyGrace is how long the alarm leaves a task Schedule released
	// to Schedule's own publish before it publishes the notification
	// itself (the retry path, after a failed publish or a crash); default
	// events.DefaultReadyGrace.
	ReadyGrace  time.Duration
	ReadyStream string          // the default Delivery's ready stream
	Subjects    events.Subjects // the default Delivery's subjects
	// ScheduleStore and Schedules are the schedules' log and projection;
	// default Store and Views when they have the methods (the node's do).
	ScheduleStore ScheduleStore
	Schedules     ScheduleViews
	Usage         Usage // for admission quotas; nil disables them
	Admission     Admission
	Logger        zerolog.Logger
	Metrics       *Metrics
	// WriteTimeout bounds how long a write waits for the projections to
	// apply it; default 10s.
	WriteTimeout time.Duration
	// AckWait is how long a notification the default Delivery hands a
	// claimer stays invisible to other claimers while it claims.
	AckWait time.Duration
	Limits
}

// Limits are the service's per-customer and per-lineage bounds and its
// queues' expiry; zero values mean the defaults.
type Limits struct {
	// MaxLineageTasks bounds the tasks of one lineage (a root and all its
	// descendants); default DefaultMaxLineageTasks, -1 no limit.
	MaxLineageTasks int
	// MaxLineageDepth bounds how many levels below its root a task may
	// be; default DefaultMaxLineageDepth, -1 no limit.
	MaxLineageDepth int
	// MaxPollsPerCustomer bounds the long polls one customer holds at
	// once in this process; default DefaultMaxPollsPerCustomer, negative
	// no limit. An operator's polls are not counted.
	MaxPollsPerCustomer int
	// MaxQueuesPerCustomer bounds the queues a customer has live tasks
	// on; a task on one more is ErrInvalid. Default
	// DefaultMaxQueuesPerCustomer, negative no limit.
	MaxQueuesPerCustomer int
	// QueueIdle is how long the default Delivery keeps a queue's ready
	// consumer without a pull (delivery.Config.Idle).
	QueueIdle time.Duration
	// MaxSchedules bounds a customer's live schedules; default
	// events.MaxSchedules, negative no limit.
	MaxSchedules int
}

// Defaults of the bounds.
const (
	DefaultMaxPollsPerCustomer  = 256
	DefaultMaxQueuesPerCustomer = 100
	DefaultMaxLineageTasks      = 1000 // tasks in one lineage, its root included
	DefaultMaxLineageDepth      = 16   // levels below the root
)

// Service is safe for concurrent use.
type Service struct {
	*core
	*feed
	*claims
	*runs
	cfg   Config
	close context.CancelFunc
}

// New returns a Service. Store, Views and Delivery or JS are required.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("scheduler: Config.Store is required")
	case cfg.Views == nil:
		return nil, errors.New("scheduler: Config.Views is required")
	case cfg.Delivery == nil && cfg.JS == nil:
		return nil, errors.New("scheduler: Config.Delivery or Config.JS is required")
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.ReadyGrace <= 0 {
		cfg.ReadyGrace = events.DefaultReadyGrace
	}
	if cfg.MaxLineageTasks == 0 {
		cfg.MaxLineageTasks = DefaultMaxLineageTasks
	}
	if cfg.MaxLineageDepth == 0 {
		cfg.MaxLineageDepth = DefaultMaxLineageDepth
	}
	if cfg.MaxPollsPerCustomer == 0 {
		cfg.MaxPollsPerCustomer = DefaultMaxPollsPerCustomer
	}
	if cfg.MaxQueuesPerCustomer == 0 {
		cfg.MaxQueuesPerCustomer = DefaultMaxQueuesPerCustomer
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Runs == nil {
		cfg.Runs = noRuns{}
	}
	if cfg.MaxSchedules == 0 {
		cfg.MaxSchedules = events.MaxSchedules
	}
	if cfg.ScheduleStore == nil {
		cfg.ScheduleStore, _ = cfg.Store.(ScheduleStore)
	}
	if cfg.Schedules == nil {
		cfg.Schedules, _ = cfg.Views.(ScheduleViews)
	}
	if cfg.ScheduleStore == nil || cfg.Schedules == nil {
		return nil, errors.New("scheduler: Config.ScheduleStore and Config.Schedules are required (or a Store and Views that serve schedules)")
	}
	if cfg.Delivery == nil {
		q, err := delivery.New(delivery.Config{
			JS: cfg.JS, Stream: cfg.ReadyStream, Subjects: cfg.Subjects, AckWait: cfg.AckWait, Idle: cfg.QueueIdle,
			Views: cfg.Views, Logger: cfg.Logger, Handed: cfg.Metrics.Handoffs.Inc,
		})
		if err != nil {
			return nil, err
		}
		cfg.Delivery = q
	}
	closing, close := context.WithCancel(context.Background())
	c := &core{store: cfg.Store, applied: cfg.Views, writeTimeout: cfg.WriteTimeout, closing: closing}
	return &Service{core: c, feed: &feed{core: c, views: cfg.Views, schedules: cfg.Schedules},
		claims: &claims{core: c, views: cfg.Views, delivery: cfg.Delivery, maxPolls: cfg.MaxPollsPerCustomer,
			polls: polls{n: make(map[string]int)}, claiming: claiming{ids: make(map[string]struct{})}},
		runs: &runs{core: c, docs: cfg.Runs},
		cfg:  cfg, close: close}, nil
}

// Close ends every long poll in progress (they answer "nothing ready") so
// an HTTP server can shut down gracefully, and returns once the pulls of
// ready notifications in flight have ended (at most a second); what they
// bring is handed back to the consumer at once. Other calls are
// unaffected. Close is idempotent.
func (s *Service) Close() {
	s.close()
	s.cfg.Delivery.Close()
}

// Principal is who makes a request (service.Principal).
type Principal = service.Principal

// Operator is the principal of a server without an auth file.
var Operator = service.Operator

// invalid wraps a validation failure as aggregate.ErrInvalid.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", aggregate.ErrInvalid, fmt.Sprintf(format, args...))
}

// ScheduleRequest is a request for a new task (service.ScheduleRequest).
type ScheduleRequest = service.ScheduleRequest

// Schedule accepts a task. created is false when the customer's requestId
// was seen before; the existing task comes back then, whatever this
// request said. A task's id is derived from (customer, requestId) when a
// requestId is given, so racing retries land on one task.
func (s *Service) Schedule(ctx context.Context, p Principal, req ScheduleRequest) (st aggregate.State, created bool, err error) {
	return s.schedule(ctx, p, req, nil)
}

// schedule is Schedule, settling as settle does with later.
func (s *Service) schedule(ctx context.Context, p Principal, req ScheduleRequest, later *uint64) (st aggregate.State, created bool, err error) {
	spec, customerID, err := s.validate(p, req)
	if err != nil {
		return st, false, err
	}
	return s.create(ctx, p, customerID, spec, later)
}

// requestTaskID is the id of the task a customer's request id names:
// derived from both, so racing retries land on one task.
func requestTaskID(customerID, requestID string) string {
	return events.DeriveID("r", customerID, requestID)
}

// create schedules the task spec describes for customerID (whose id its
// RequestID names, when it has one): Schedule's work once the request is
// checked, shared with RetryTask. It settles as settle does with later.
func (s *Service) create(ctx context.Context, p Principal, customerID string, spec events.TaskSpec, later *uint64) (st aggregate.State, created bool, err error) {
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
		parent, err := s.cfg.Store.Load(ctx, spec.ParentID)
		if err != nil {
			return st, false, s.unavailable(err)
		}
		if !parent.Exists() || parent.CustomerID != customerID {
			return st, false, fmt.Errorf("%w: parent %s", aggregate.ErrNotFound, spec.ParentID)
		}
		if parent.Status.Terminal() {
			// A repeated requestId answers the child it created before the
			// parent ended (answered 200 with the existing task), not a conflict.
			if spec.RequestID != "" {
				if st, found, err := s.repeated(ctx, taskID, later); found || err != nil {
					return st, false, err
				}
			}
			return st, false, fmt.Errorf("%w: parent %s is %s", ErrParentTerminal, spec.ParentID, parent.Status)
		}
		if err := s.lineageRoom(spec.ParentID); err != nil {
			// As for a terminal parent: a repeat answers the child it made.
			if spec.RequestID != "" {
				if st, found, rerr := s.repeated(ctx, taskID, later); found || rerr != nil {
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
	if now := s.cfg.Store.Now(); s.cfg.Delivery.Publishes() && !spec.RunAt.After(now) && spec.Concurrency == nil {
		sc.DeliveryID, sc.NextAt = events.NewID(), now.Add(s.cfg.ReadyGrace)
	}
	var cmd aggregate.Command = sc
	if spec.ParentID == "" && s.cfg.Usage != nil {
		// A replay is not charged again: look before admitting.
		if spec.RequestID != "" {
			if st, found, err := s.repeated(ctx, taskID, later); found || err != nil {
				return st, false, err
			}
		}
		if reason := s.admit(ctx, customerID, spec); reason != "" {
			s.cfg.Metrics.Rejections.Inc()
			cmd = aggregate.Reject{TaskID: taskID, CustomerID: customerID, Spec: spec, Reason: reason}
		}
	}
	st, evs, err := s.cfg.Store.Execute(ctx, taskID, "", cmd)
	err = s.fromStore(err)
	if err == nil {
		crashpoint.Hit(crashpoint.Scheduled)
	}
	if errors.Is(err, aggregate.ErrExists) {
		st, _, err = s.repeated(ctx, taskID, later)
		return st, false, err
	}
	if err != nil {
		return st, false, err
	}
	if st.Version == 1 && st.Delivery.ID != "" {
		// The views take the release before anyone may claim the task: a
		// claim it is handed to (handoff) then folds its Claimed in at once
		// instead of waiting for the tail.
		if s.cfg.Views.ApplyOwn(evs) {
			evs = nil
		}
		var published []events.Event
		st, published = s.cfg.Delivery.PublishReleased(ctx, st)
		if evs = append(evs, published...); len(evs) == 0 {
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

// lineageRoom fails with ErrLineageLimit when a new child of parentID
// would be deeper than MaxLineageDepth or make its lineage larger than
// MaxLineageTasks. The counts come from the projections, so concurrent
// requests can overshoot by the number in flight; a parent the views do
// not hold yet (another process wrote it) is not checked.
func (s *Service) lineageRoom(parentID string) error {
	depth, size, ok := s.cfg.Views.Lineage(parentID)
	switch {
	case !ok:
	case s.cfg.MaxLineageDepth >= 0 && depth+1 > s.cfg.MaxLineageDepth:
		return fmt.Errorf("%w: a child of %s would be %d levels below its root, at most %d", ErrLineageLimit, parentID, depth+1, s.cfg.MaxLineageDepth)
	case s.cfg.MaxLineageTasks >= 0 && size+1 > s.cfg.MaxLineageTasks:
		return fmt.Errorf("%w: the lineage of %s has %d tasks, at most %d", ErrLineageLimit, parentID, size, s.cfg.MaxLineageTasks)
	}
	return nil
}

// repeated answers a repeated request id with the task it named (found),
// and a task admission rejected with the same rejection. It settles as
// settle does with later.
func (s *Service) repeated(ctx context.Context, taskID string, later *uint64) (st aggregate.State, found bool, err error) {
	if st, err = s.cfg.Store.Load(ctx, taskID); err != nil {
		return st, false, s.unavailable(err)
	}
	if !st.Exists() {
		return st, false, nil
	}
	if err := s.settle(ctx, st, nil, later); err != nil {
		return st, true, err
	}
	if st.Rejected {
		return st, true, &AdmissionError{Task: st}
	}
	return st, true, nil
}

func (s *Service) validate(p Principal, req ScheduleRequest) (events.TaskSpec, string, error) {
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
	now := s.cfg.Store.Now()
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
		Labels: req.Labels,
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
func (s *Service) checkQueues(customerID, queue string) error {
	max := s.cfg.MaxQueuesPerCustomer
	if max < 0 {
		return nil
	}
	if live, n := s.cfg.Views.CustomerQueue(customerID, queue); !live && n >= max {
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

// core is what every part of the service shares: the log, the
// projections' read-your-writes, how long a write waits for them, and the
// service's shutdown. Its methods are safe for concurrent use.
type core struct {
	store        Store
	applied      Applied
	writeTimeout time.Duration
	// closing ends long polls and streams when the process shuts down.
	closing context.Context
}

// settle makes the projections show st, the task after the caller's
// write appended evs, so the caller's next read (a list, a tree) sees it:
// at once where the views may fold evs in themselves (Views.ApplyOwn),
// else once the projections' tail has applied st. With a non-nil later
// it does not wait for the tail: it raises *later to st.LastSeq and
// returns nil, and the caller (a batch) waits once, with waitApplied, for
// the highest sequence its items need.
func (s *core) settle(ctx context.Context, st aggregate.State, evs []events.Event, later *uint64) error {
	if len(evs) > 0 && s.applied.ApplyOwn(evs) {
		return nil
	}
	if later != nil {
		*later = max(*later, st.LastSeq)
		return nil
	}
	return s.waitApplied(ctx, st.LastSeq)
}

// waitApplied waits, up to WriteTimeout, until the projections' tail has
// applied the event at seq; ErrUnavailable when it did not in time.
func (s *core) waitApplied(ctx context.Context, seq uint64) error {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	if err := s.applied.WaitFor(ctx, seq); err != nil {
		return s.unavailable(err)
	}
	return nil
}

func (s *core) unavailable(err error) error {
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// fromStore maps the store's failure to reach the log to ErrUnavailable
// (the caller may retry); the aggregate's decisions pass through.
func (s *core) fromStore(err error) error {
	if errors.Is(err, store.ErrUnavailable) {
		return s.unavailable(err)
	}
	return err
}

// errCatchingUp is why a listing is refused while the views catch up.
var errCatchingUp = errors.New("the projections are catching up with the log after a start (GET /readyz says when they are done); a listing now would miss tasks")

// caughtUp fails with ErrUnavailable until the views have caught up with
// the log: the listings read only the views, so before that they would
// leave out what the views have not applied yet, without saying so.
func (s *core) caughtUp() error {
	if !s.applied.CaughtUp() {
		return s.unavailable(errCatchingUp)
	}
	return nil
}

// Get returns a task as the log has it now.
func (s *Service) Get(ctx context.Context, p Principal, id string) (aggregate.State, error) {
	return s.get(ctx, p, id)
}

// get returns a task as the log has it now (Service.Get).
func (s *core) get(ctx context.Context, p Principal, id string) (aggregate.State, error) {
	if err := events.ValidID(id); err != nil {
		return aggregate.State{}, invalid("task id: %v", err)
	}
	st, err := s.store.Load(ctx, id)
	if err != nil {
		return st, s.unavailable(err)
	}
	if !p.Sees(st) {
		return aggregate.State{}, fmt.Errorf("%w: %s", aggregate.ErrNotFound, id)
	}
	return st, nil
}

// authorize fails with ErrNotFound unless p may see task id. A task's
// customer never changes, so the projections answer when they know the
// task; only a task they have not seen yet is read from the log.
func (s *core) authorize(ctx context.Context, p Principal, id string) error {
	if err := events.ValidID(id); err != nil {
		return invalid("task id: %v", err)
	}
	if p.IsOperator() {
		return nil // Execute answers ErrNotFound for a missing task
	}
	if st, ok := s.applied.Task(id); ok {
		if !p.Sees(st) {
			return fmt.Errorf("%w: %s", aggregate.ErrNotFound, id)
		}
		return nil
	}
	_, err := s.get(ctx, p, id)
	return err
}

// execute runs cmd on a task the principal may see, then settles it
// (settle, with later).
func (s *core) execute(ctx context.Context, p Principal, id, actor string, cmd aggregate.Command, later *uint64) (aggregate.State, error) {
	if err := s.authorize(ctx, p, id); err != nil {
		return aggregate.State{}, err
	}
	st, evs, err := s.store.Execute(ctx, id, actor, cmd)
	if err != nil {
		return st, s.fromStore(err)
	}
	return st, s.settle(ctx, st, evs, later)
}

// Cancel cancels a non-terminal task.
func (s *Service) Cancel(ctx context.Context, p Principal, id, reason string) (aggregate.State, error) {
	return s.execute(ctx, p, id, "", aggregate.Cancel{Reason: reason}, nil)
}

func validIDs(nameValues ...string) error {
	for i := 0; i+1 < len(nameValues); i += 2 {
		if err := events.ValidID(nameValues[i+1]); err != nil {
			return invalid("%s: %v", nameValues[i], err)
		}
	}
	return nil
}
