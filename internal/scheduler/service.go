package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/delivery"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/internal/service"
)

// Errors the service adds to the aggregate's: internal/service's, named
// here too.
var (
	ErrParentTerminal = service.ErrParentTerminal
	ErrUnavailable    = service.ErrUnavailable
	ErrLineageLimit   = service.ErrLineageLimit
	ErrTooManyPolls   = service.ErrTooManyPolls
	ErrOperatorOnly   = service.ErrOperatorOnly
	ErrCorruptEvent   = service.ErrCorruptEvent
)

// ErrAncestorTerminal and ErrRequestIDConflict are service's.
var (
	ErrAncestorTerminal  = service.ErrAncestorTerminal
	ErrRequestIDConflict = service.ErrRequestIDConflict
)

// Store is the log as the service uses it.
type Store interface {
	Execute(ctx context.Context, taskID, actor string, cmd aggregate.Command) (aggregate.State, []events.Event, error)
	// ExecuteSeen is Execute for a command chosen from the task as it
	// stood at sequence seen.
	ExecuteSeen(ctx context.Context, taskID, actor string, cmd aggregate.Command, seen events.Position) (aggregate.State, []events.Event, error)
	Load(ctx context.Context, taskID string) (aggregate.State, error)
	History(ctx context.Context, taskID string) ([]events.Event, error)
	Event(ctx context.Context, pos events.Position) (events.Event, error)
	// Lineage returns the events of the lineage root heads, in log order.
	Lineage(ctx context.Context, root aggregate.State) ([]events.Event, error)
	// CustomerEvents calls fn for every event of a customer's tasks
	// stored at or after since, in log order, and quarantine for every
	// message there that does not decode.
	CustomerEvents(ctx context.Context, customerID string, since time.Time, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error
	// KeyHistory returns every event of a concurrency key in log order.
	KeyHistory(ctx context.Context, customerID, key string) ([]events.Event, error)
	// Follow calls fn for every event stored after the positions after
	// (by shard) on one of the subjects filters gives for a shard's
	// subjects (none: all), and quarantine for every message there that
	// does not decode, then for each later one, until ctx ends or fn or
	// quarantine fails.
	Follow(ctx context.Context, filters func(events.Subjects) []string, after []events.Position, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error
	// LastSeq returns the sum of the shards' last stream sequences: the
	// log's last sequence when it has one shard (0 when empty).
	LastSeq(ctx context.Context) (uint64, error)
	// LastPositions returns the position of every shard's last event.
	LastPositions(ctx context.Context) ([]events.Position, error)
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

// Delivery is the ready queue as the service uses it (delivery.Queues).
type Delivery interface {
	// Dispatcher returns queue's dispatcher, on the queue's ready
	// consumer, which it creates (again) when needed; the error is the
	// ready stream's.
	Dispatcher(ctx context.Context, queue string) (*delivery.Dispatcher, error)
	// Publishes reports whether Release publishes what no claimer here
	// takes: only then does Schedule release a task itself. It is asked
	// once, by New.
	Publishes() bool
	// Release hands st, just released, to a claimer waiting in this
	// process, or else has its notification published and recorded
	// (ReadyPublished) without the caller waiting for either. A failure
	// is left to the alarm.
	Release(st aggregate.State)
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
	// once in its TaskScheduled and hands it to Delivery.Release, which
	// gives it to a claimer waiting here or publishes its ready
	// notification (and records ReadyPublished) while Schedule answers,
	// instead of leaving both to the alarm: a write and two alarm hops
	// fewer. Otherwise the alarm releases and publishes every
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
	// Now is the service's clock, read once a request; default
	// Store.Now. It must agree with the store's.
	Now func() time.Time
	// AckWait is how long a notification the default Delivery hands a
	// claimer stays invisible to other claimers while it claims.
	AckWait time.Duration
	// Renewed, if set, is told of each heartbeat Heartbeat renewed in
	// this process's projections, for the other processes' (the node
	// announces it on events.Subjects.Heartbeats). It must not block.
	Renewed func(taskID, deliveryID string)
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

// Service is the service layer: a façade over its parts by noun, each
// holding only what it needs, whose methods it exports as its own (the
// package doc, "Parts"). It is safe for concurrent use.
type Service struct {
	*tasks
	*claims
	*schedules
	*runs
	*feed
	delivery Delivery // closed by Close
	close    context.CancelFunc
	// repeats logs what the reads and claims pass over again and again
	// (quarantined messages), once an interval; closed by Close.
	repeats *ratelog.Limiter
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
	if cfg.Now == nil {
		cfg.Now = cfg.Store.Now
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
	c := &core{store: cfg.Store, applied: cfg.Views, now: cfg.Now, writeTimeout: cfg.WriteTimeout, closing: closing}
	repeats := ratelog.New(cfg.Logger, 0)
	f := &feed{core: c, views: cfg.Views, schedules: cfg.Schedules, skipped: cfg.Metrics.QuarantineSkips, repeats: repeats}
	t := &tasks{core: c, views: cfg.Views, delivery: cfg.Delivery, publishes: cfg.Delivery.Publishes(), readyGrace: cfg.ReadyGrace,
		usage: cfg.Usage, admission: cfg.Admission, metrics: cfg.Metrics, logger: cfg.Logger,
		maxLineageTasks: cfg.MaxLineageTasks, maxLineageDepth: cfg.MaxLineageDepth, maxQueues: cfg.MaxQueuesPerCustomer, feed: f}
	return &Service{
		tasks: t, feed: f,
		claims: &claims{core: c, views: cfg.Views, delivery: cfg.Delivery, maxPolls: cfg.MaxPollsPerCustomer, renewed: cfg.Renewed,
			wrongTenant: cfg.Metrics.WrongTenantClaims, logger: cfg.Logger, repeats: repeats,
			polls: polls{n: make(map[string]int)}, claiming: claiming{ids: make(map[string]struct{})}},
		schedules: &schedules{core: c, log: cfg.ScheduleStore, views: cfg.Schedules, tasks: t, maxSchedules: cfg.MaxSchedules},
		runs:      &runs{core: c, docs: cfg.Runs},
		delivery:  cfg.Delivery, close: close, repeats: repeats,
	}, nil
}

// Close ends every long poll in progress (they answer "nothing ready") so
// an HTTP server can shut down gracefully, and returns once the pulls of
// ready notifications in flight have ended (at most a second); what they
// bring is handed back to the consumer at once. Other calls are
// unaffected. Close is idempotent.
func (s *Service) Close() {
	s.close()
	s.delivery.Close()
	s.repeats.Close()
}

// Principal is who makes a request (service.Principal).
type Principal = service.Principal

// Operator is the principal of a server without an auth file.
var Operator = service.Operator

// invalid wraps a validation failure as aggregate.ErrInvalid.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", aggregate.ErrInvalid, fmt.Sprintf(format, args...))
}

func validIDs(nameValues ...string) error {
	for i := 0; i+1 < len(nameValues); i += 2 {
		if err := events.ValidID(nameValues[i+1]); err != nil {
			return invalid("%s: %v", nameValues[i], err)
		}
	}
	return nil
}
