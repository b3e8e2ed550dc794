// Package reactors holds the parts of taskledger that act on events: the
// scheduler's alarm (releases, ready deliveries, timeouts and child reports
// driven by the projection's timer queues) and the executor worker.
//
// Every action a reactor takes is a command decided again by the aggregate
// on the task's current state and appended with the task's last sequence.
// A duplicated action (two scheduler processes, a retry after a crash), a
// stale one (decided on a projection that lags the log) or a late one (the
// task moved on) therefore appends nothing: Decide answers ErrStale,
// ErrTerminal or an equivalent, and the reactor drops it.
package reactors

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

// Store executes commands against the log.
type Store interface {
	Execute(ctx context.Context, taskID, actor string, cmd aggregate.Command) (aggregate.State, []events.Event, error)
	// ExecuteSeen is Execute for a command chosen from the task as it
	// stood at sequence seen.
	ExecuteSeen(ctx context.Context, taskID, actor string, cmd aggregate.Command, seen events.Position) (aggregate.State, []events.Event, error)
	// Load returns a task as the log has it now.
	Load(ctx context.Context, taskID string) (aggregate.State, error)
	// ExecuteKey decides a concurrency key's command and appends its
	// event under the key's last sequence.
	ExecuteKey(ctx context.Context, cmd aggregate.KeyCommand) (aggregate.KeyState, []events.Event, error)
}

// Projection is what the alarm reads.
type Projection interface {
	Due(t projections.Timer, now time.Time, limit int, skip func(taskID string) bool) []aggregate.State
	// Next returns when the alarm, at now, next has work in timer queue
	// t by the rule Due (DueSchedules for Fire) applies with the same
	// skip: never after the earliest item Due would hand out, and at or
	// before now only if Due at now hands one out. The alarm sleeps until
	// then.
	Next(t projections.Timer, now time.Time, skip func(taskID string) bool) (time.Time, bool)
	TimersChanged() <-chan struct{}
	// Covers reports whether the projection has applied the event at
	// position pos.
	Covers(pos events.Position) bool
	// WaitFor returns once the projection has applied seq, or ctx ends.
	WaitFor(ctx context.Context, seq events.Position) error
	// Postpone moves a task's due time in timer queue t, if it is there.
	Postpone(t projections.Timer, taskID string, due time.Time)
	// DueOf returns a task's due time in timer queue t now, false if the
	// queue does not hold it.
	DueOf(t projections.Timer, taskID string) (time.Time, bool)
	// Waiters returns up to limit tasks due at now waiting for a slot of
	// a customer's concurrency key, first due first.
	Waiters(customerID, key string, now time.Time, limit int) []aggregate.State
	// DueSchedules returns up to limit schedules of the Fire queue due at
	// or before now, skipping the keys skip reports.
	DueSchedules(now time.Time, limit int, skip func(key string) bool) []projections.ScheduleDue
	// Schedule returns a customer's schedule as the projections hold it.
	Schedule(customerID, scheduleID string) (projections.Schedule, bool)
	// TerminalAncestor returns the nearest ancestor of a task that has
	// ended, as far as the projections hold them; found is false for none.
	TerminalAncestor(id string) (ancestorID string, status aggregate.Status, found bool)
}

// Firer fires schedules (the scheduler service).
type Firer interface {
	// FireSchedule does what is due of a customer's schedule: schedules
	// the task of its last run if the log lacks it (a crash after the
	// fire), else fires, skips or passes over its due instant. It returns
	// the last sequence it appended or read and, when the log had nothing
	// due, the log's next due instant (zero otherwise); errors are the
	// store's and the aggregate's.
	FireSchedule(ctx context.Context, customerID, scheduleID string) (seq events.Position, notBefore time.Time, err error)
}

// Publisher publishes ready notifications.
type Publisher interface {
	// PublishReady publishes the notification of s's current delivery
	// with message id msgID, waits for the stream's acknowledgement and
	// returns the ready stream sequence it is stored at.
	PublishReady(ctx context.Context, s aggregate.State, msgID string) (uint64, error)
	// ReadyStored reports whether the ready stream still holds the
	// notification of s's delivery at s.Delivery.ReadySeq.
	ReadyStored(ctx context.Context, s aggregate.State) (bool, error)
}

// Partitions says which timer items this process acts on: those of the
// timer partitions it holds a lease on (internal/lease.Leases).
type Partitions interface {
	// Owns returns a test of whether this process acts, now, on the item
	// of a key: a task's id, or a schedule's projections.ScheduleKey.
	Owns() func(key string) bool
	// Changed is signalled when the partitions held change.
	Changed() <-chan struct{}
}

// AlarmConfig configures an Alarm. Store, Projection and Publisher are
// required; zero values elsewhere mean the defaults.
type AlarmConfig struct {
	Store      Store
	Projection Projection
	Publisher  Publisher
	// Handoff, if set, is offered each task the alarm releases (and the
	// events that released it) before its notification is published. It
	// returns true when it took over the delivery: a claimer waiting in
	// this process took it (it then needs neither the notification nor
	// ReadyPublished), or it holds it for the next such claimer and
	// publishes it itself should none come. Should that claim fail, the
	// Deliver queue publishes the delivery after ReadyGrace, as after a
	// crash.
	Handoff func(s aggregate.State, released []events.Event) bool
	// Schedules, if set, fires the due schedules of the Fire timer queue;
	// without it schedules do not fire.
	Schedules Firer
	// Partitions, if set, limits the alarm to the items of the
	// partitions this process holds; nil: it acts on every item.
	Partitions Partitions

	Batch       int // due items taken per queue per round; default 64
	Concurrency int // actions in flight; default 128 (a burst of due items is acted on together: the appends pipeline)
	// DeliveryBudget is how long after its first attempt a ready
	// notification may keep failing to publish before DeliveryExhausted
	// fails the task; default 24h.
	DeliveryBudget time.Duration
	// MaxDeliveryAttempts, if positive, also gives up after that many
	// attempts; default 0: the budget alone decides.
	MaxDeliveryAttempts int
	RetryBase           time.Duration // first delivery retry delay; default 100ms
	RetryMax            time.Duration // longest delivery retry delay; default 5m
	// RepublishAfter is how long a queued task's notification waits after
	// its last publish before the alarm checks that the ready stream
	// still holds it, and publishes it again with the same token if not;
	// then again every RepublishAfter. Default 1m.
	RepublishAfter time.Duration
	ErrorBackoff   time.Duration // wait before retrying an action that failed, on the process's clock (not Now); default 1s
	// ReadyGrace is how long after a release the Deliver queue leaves
	// the notification to the release's own publish (and its retries)
	// before it acts itself: the path after a crash; default
	// events.DefaultReadyGrace.
	ReadyGrace time.Duration
	Logger     zerolog.Logger
	// Repeats logs the failures that are retried. The node passes one
	// that logs the first of a kind in full, then counts
	// (internal/ratelog), so a broken log or ready stream does not write
	// a line per task per retry; default: each is logged on Logger.
	Repeats Repeater
	// Crash, if set, is called at each of the alarm's interruption points
	// with its name (CrashSlotAcquired, …): a crash test's build of the
	// node kills the process there (internal/crashpoint).
	Crash func(point string)
	Now   func() time.Time
	// Observe, if set, is called after each action with its timer queue,
	// the lateness against the due time, and the outcome.
	Observe func(t projections.Timer, late time.Duration, err error)
	// Exhausted, if set, is called for each delivery the alarm gave up on
	// (after its DeliveryExhausted was appended), with the task before it.
	Exhausted func(s aggregate.State)
}

func (c AlarmConfig) withDefaults() AlarmConfig {
	if c.Batch <= 0 {
		c.Batch = 64
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 128
	}
	if c.DeliveryBudget <= 0 {
		c.DeliveryBudget = DefaultDeliveryBudget
	}
	if c.RetryBase <= 0 {
		c.RetryBase = DefaultRetryBase
	}
	if c.RetryMax <= 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.RepublishAfter <= 0 {
		c.RepublishAfter = DefaultRepublishAfter
	}
	if c.ErrorBackoff <= 0 {
		c.ErrorBackoff = time.Second
	}
	if c.ReadyGrace <= 0 {
		c.ReadyGrace = events.DefaultReadyGrace
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Repeats == nil {
		c.Repeats = logEach{c.Logger}
	}
	if c.Crash == nil {
		c.Crash = func(string) {}
	}
	return c
}

// Repeater logs failures of a kind (key) that repeat; internal/ratelog's
// Limiter is one. It must be safe for concurrent use.
type Repeater interface {
	Log(level zerolog.Level, key, msg string, fill func(*zerolog.Event))
}

// logEach is the default Repeater: it logs every failure.
type logEach struct{ log zerolog.Logger }

func (l logEach) Log(level zerolog.Level, _, msg string, fill func(*zerolog.Event)) {
	e := l.log.WithLevel(level)
	if fill != nil {
		fill(e)
	}
	e.Msg(msg)
}

// The alarm's interruption points, as AlarmConfig.Crash names them; the
// names are internal/crashpoint's.
const (
	CrashSlotAcquired   = "slot-acquired"   // a key's SlotAcquired appended, the task not yet released
	CrashReleased       = "released"        // DeliveryPending appended, ready not yet published
	CrashPublished      = "published"       // ready published, ReadyPublished not yet appended
	CrashRetryScheduled = "retry-scheduled" // RetryScheduled appended for a timed-out attempt
)

// The alarm's delivery defaults: a ready stream outage of up to a day
// delays deliveries (by at most RetryMax after it ends) but fails none.
const (
	DefaultDeliveryBudget = 24 * time.Hour
	DefaultRetryBase      = 100 * time.Millisecond
	DefaultRetryMax       = 5 * time.Minute
	DefaultRepublishAfter = time.Minute
)

// Alarm keeps one timer armed for the earliest due item across the timer
// queues and, when it fires, runs the due releases, deliveries, timeouts,
// child reports and checks of queued notifications in bounded batches
// that take turns across customers: with Partitions, only the items of
// the partitions held.
type Alarm struct {
	cfg   AlarmConfig
	store Store
	proj  Projection
	pub   Publisher

	// inflight is owned by Run's goroutine: actions dispatched and not
	// yet visible in the projection, so they are not dispatched twice.
	inflight map[key]flight
	done     chan result
	// started is when Run started or the partitions held last changed,
	// in Config.Now's unix nanoseconds: no heartbeat is missed before one
	// interval after it (renewals are not in the log, nor in another
	// process's projections, so after a restart or a takeover the last
	// one is unknown).
	started atomic.Int64
}

type key struct {
	timer projections.Timer
	task  string
}

// flight says until when a dispatched item is skipped: while running, then
// until the projection applied untilSeq, or until retryAt (on the
// process's clock, not Config.Now) after a failure,
// or for as long as the process runs once parked (a permanent failure).
// A schedule the log had nothing due of is skipped until notDue.until,
// unless the projections' schedule changes first.
type flight struct {
	running  bool
	parked   bool
	untilSeq events.Position
	retryAt  time.Time
	notDue   *notDue
}

// notDue is a fire the log found early: the schedule (customerID, id), as
// the log had it at seq, has nothing due until until.
type notDue struct {
	customerID, id string
	seq            events.Position
	until          time.Time
}

type result struct {
	key key
	flight
}

// NewAlarm returns an Alarm; Run starts it.
func NewAlarm(cfg AlarmConfig) (*Alarm, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("reactors: AlarmConfig.Store is required")
	case cfg.Projection == nil:
		return nil, errors.New("reactors: AlarmConfig.Projection is required")
	case cfg.Publisher == nil:
		return nil, errors.New("reactors: AlarmConfig.Publisher is required")
	}
	cfg = cfg.withDefaults()
	return &Alarm{cfg: cfg, store: cfg.Store, proj: cfg.Projection, pub: cfg.Publisher,
		inflight: make(map[key]flight), done: make(chan result, 64)}, nil
}

// Run fires due items until ctx ends, then waits for actions in flight and
// returns nil.
func (a *Alarm) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, a.cfg.Concurrency)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sk := a.newSkipper()
	a.started.Store(a.cfg.Now().UnixNano())
	for {
		// now is the clock the due times are on (Config.Now); wall is the
		// process's own, for the pause after a failed action: a clock that
		// stands still or jumps must not hold a retry back.
		now, wall := a.cfg.Now(), time.Now()
		sk.now, sk.wall, sk.owns = now, wall, a.owns()
		a.settle(now, wall)
		dispatched := 0
		dispatch := func(k key, act func() flight) {
			sem <- struct{}{}
			a.inflight[k] = flight{running: true}
			dispatched++
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := result{key: k, flight: act()}
				<-sem
				a.awaitApplied(ctx, r.untilSeq)
				a.done <- r
			}()
		}
		for t := range projections.NumTimers {
			// Ask only for as many items as there are free slots: the
			// rest wait for the next round, which a finished action
			// starts. Only this goroutine fills sem, so a free slot
			// stays free until it is taken here.
			free := min(cap(sem)-len(sem), a.cfg.Batch)
			if free == 0 {
				break
			}
			sk.timer = t
			skip := sk.skip
			if t == projections.Fire {
				if a.cfg.Schedules != nil {
					for _, d := range a.proj.DueSchedules(now, free, skip) {
						dispatch(key{t, projections.ScheduleKey(d.CustomerID, d.ID)}, func() flight { return a.fire(ctx, d) })
					}
				}
				continue
			}
			for _, s := range a.proj.Due(t, now.Add(-a.delay(t)), free, skip) {
				dispatch(key{t, s.TaskID}, func() flight { return a.act(ctx, t, s) })
			}
		}
		timer.Reset(a.wait(sk, dispatched, len(sem) == cap(sem)))
		select {
		case <-ctx.Done():
			go func() { // drain results so actions in flight can finish
				for range a.done {
				}
			}()
			wg.Wait()
			close(a.done)
			return nil
		case r := <-a.done:
			a.inflight[r.key] = r.flight
		case <-a.proj.TimersChanged():
		case <-a.partitionsChanged():
			a.started.Store(a.cfg.Now().UnixNano())
		case <-timer.C:
		}
	}
}

// awaitApplied returns once the projection has applied seq (or ctx ends):
// the item is skipped until then, and the event at seq may change no
// timer queue (a ReadyPublished), so nothing else would wake the alarm
// when it is applied. Its result, sent after this, does. The action's
// slot is free meanwhile; the item stays in flight.
func (a *Alarm) awaitApplied(ctx context.Context, seq events.Position) {
	if !a.proj.Covers(seq) {
		a.proj.WaitFor(ctx, seq) // an error is ctx's end: Run is stopping
	}
}

// wait is how long to sleep before the next round when nothing else wakes
// the alarm: until the earliest item it would act on (Projection.Next, by
// the rule Due applies: items in flight and due waiters on a full key must
// not hide a later one), or until a failed action may be retried. Items in
// flight leave the queue through the projection, and a key's freed slot
// is an event; both wake the alarm, so there is no polling interval.
func (a *Alarm) wait(sk *skipper, dispatched int, full bool) time.Duration {
	now, wall := sk.now, sk.wall
	switch {
	case full:
		return time.Hour // nothing can start before an action ends, which wakes the alarm
	case dispatched > 0:
		return 0
	}
	d := time.Hour
	for t := range projections.NumTimers {
		if t == projections.Fire && a.cfg.Schedules == nil {
			continue
		}
		sk.timer = t
		if next, ok := a.proj.Next(t, now.Add(-a.delay(t)), sk.skip); ok {
			d = min(d, max(next.Add(a.delay(t)).Sub(now), 0))
		}
	}
	for _, f := range a.inflight {
		if !f.running && f.retryAt.After(wall) {
			d = min(d, f.retryAt.Sub(wall))
		}
		if f.waiting(now) {
			d = min(d, f.notDue.until.Sub(now))
		}
	}
	return d
}

// delay is how long after its due time in the projection an item of
// timer queue t is acted on: a queued notification is checked
// RepublishAfter after its last publish, everything else at once.
func (a *Alarm) delay(t projections.Timer) time.Duration {
	if t == projections.Republish {
		return a.cfg.RepublishAfter
	}
	return 0
}

// owns is Partitions.Owns, or true for every item without Partitions.
func (a *Alarm) owns() func(key string) bool {
	if a.cfg.Partitions == nil {
		return func(string) bool { return true }
	}
	return a.cfg.Partitions.Owns()
}

// partitionsChanged is Partitions.Changed; nil (never ready) without.
func (a *Alarm) partitionsChanged() <-chan struct{} {
	if a.cfg.Partitions == nil {
		return nil
	}
	return a.cfg.Partitions.Changed()
}

// skipper is Alarm.skip for one timer queue at one reading of the clocks,
// and the partitions held, as one func value: Run keeps one and sets its
// fields before each query, so asking the projection costs no allocation
// a round. It is owned by Run's goroutine.
type skipper struct {
	timer     projections.Timer
	now, wall time.Time
	owns      func(key string) bool
	skip      func(taskID string) bool
}

func (a *Alarm) newSkipper() *skipper {
	sk := &skipper{}
	sk.skip = func(id string) bool { return !sk.owns(id) || a.skip(key{sk.timer, id}, sk.now, sk.wall) }
	return sk
}

func (a *Alarm) skip(k key, now, wall time.Time) bool {
	f, ok := a.inflight[k]
	return ok && (f.running || f.parked || !a.proj.Covers(f.untilSeq) || wall.Before(f.retryAt) || f.waiting(now))
}

// waiting reports whether f is a fire the log found early, until its
// next instant.
func (f flight) waiting(now time.Time) bool { return f.notDue != nil && now.Before(f.notDue.until) }

// settle forgets flights whose effect the projection has applied, and
// early fires whose schedule the projections have changed since.
func (a *Alarm) settle(now, wall time.Time) {
	for k, f := range a.inflight {
		applied := a.proj.Covers(f.untilSeq)
		if f.waiting(now) && applied {
			if sc, ok := a.proj.Schedule(f.notDue.customerID, f.notDue.id); ok && sc.State.LastSeq == f.notDue.seq {
				continue
			}
			f.notDue = nil
			a.inflight[k] = f
		}
		if !f.running && !f.parked && applied && !wall.Before(f.retryAt) && !f.waiting(now) {
			delete(a.inflight, k)
		}
	}
}

// act runs one due item and says how long to skip it afterwards.
func (a *Alarm) act(ctx context.Context, t projections.Timer, s aggregate.State) flight {
	var cmd aggregate.Command
	switch t {
	case projections.Release:
		return a.release(ctx, s)
	case projections.Free:
		return a.free(ctx, s)
	case projections.Deliver:
		st, err := a.deliverNow(ctx, s)
		return a.outcome(t, s, st, err)
	case projections.Expire:
		if s.Claim.HeartbeatSeconds > 0 && a.cfg.Now().Before(s.Deadline) {
			return a.expireClaim(ctx, s)
		}
		cmd = aggregate.TimeOut{}
	case projections.Report:
		return a.report(ctx, s)
	case projections.Republish:
		return a.republish(ctx, s)
	}
	st, _, err := a.store.ExecuteSeen(ctx, s.TaskID, "", cmd, s.LastSeq)
	if err == nil && t == projections.Expire && st.Status == aggregate.StatusScheduled {
		a.cfg.Crash(CrashRetryScheduled)
	}
	return a.outcome(t, s, st, err)
}

// expireClaim ends a running claim whose heartbeat is due before its
// deadline: ClaimLost (reason heartbeat), unless a renewal moved its due
// time later meanwhile, or less than one interval has passed since the
// alarm started. The projections hold the renewals this process took
// (projections.Engine.Renew); after a restart (or a rebuild) they are
// gone, and the claim's heartbeat is due one interval after the later of
// the claim and the alarm's start (or its last change of partitions), so
// a restart or a takeover never ends a live claim whose executor keeps
// heartbeating.
func (a *Alarm) expireClaim(ctx context.Context, s aggregate.State) flight {
	now, interval := a.cfg.Now(), time.Duration(s.Claim.HeartbeatSeconds)*time.Second
	if grace := time.Unix(0, a.started.Load()).Add(interval); now.Before(grace) {
		a.proj.Postpone(projections.Expire, s.TaskID, grace)
		return flight{}
	}
	if due, ok := a.proj.DueOf(projections.Expire, s.TaskID); ok && now.Before(due) {
		return flight{} // renewed since Due handed it out
	}
	cmd := aggregate.LoseClaim{DeliveryID: s.Claim.DeliveryID, Reason: events.ClaimLostHeartbeat}
	st, _, err := a.store.ExecuteSeen(ctx, s.TaskID, "", cmd, s.LastSeq)
	if err == nil {
		a.cfg.Logger.Info().Str("task", s.TaskID).Str("executor", s.Claim.ExecutorID).Str("delivery", s.Claim.DeliveryID).
			Int("heartbeatSeconds", s.Claim.HeartbeatSeconds).Msg("claim lost: heartbeat missed")
	}
	if errors.Is(err, aggregate.ErrClaimLost) || errors.Is(err, aggregate.ErrTokenMismatch) {
		err = fmt.Errorf("%w: %w", aggregate.ErrStale, err) // the claim ended otherwise meanwhile
	}
	return a.outcome(projections.Expire, s, st, err)
}

// deliverNow publishes the notification of s's pending delivery and
// records what happened: ReadyPublished, a retry later, or, past the
// budget, DeliveryExhausted.
func (a *Alarm) deliverNow(ctx context.Context, s aggregate.State) (aggregate.State, error) {
	cmd := a.deliver(ctx, s)
	st, _, err := a.store.ExecuteSeen(ctx, s.TaskID, "", cmd, s.LastSeq)
	if ex, ok := cmd.(aggregate.ExhaustDelivery); ok && err == nil {
		a.exhausted(s, ex.Reason)
	}
	return st, err
}

// fire fires a due schedule through the Firer, with the outcomes of any
// other action. When the log had nothing due yet, the schedule is skipped
// until the log's next instant rather than fired again at once (unless
// the projections' schedule changes meanwhile: an update may bring it
// forward).
func (a *Alarm) fire(ctx context.Context, d projections.ScheduleDue) flight {
	seq, notBefore, err := a.cfg.Schedules.FireSchedule(ctx, d.CustomerID, d.ID)
	s := aggregate.State{TaskID: d.ID, CustomerID: d.CustomerID}
	f := a.settled(projections.Fire, d.Due, s, max(seq, d.Seq), err)
	if err == nil && !notBefore.IsZero() {
		// seq is the schedule's last event in the log: the projections
		// hold the log's state once their schedule is at it.
		f.notDue = &notDue{customerID: d.CustomerID, id: d.ID, seq: max(seq, d.Seq), until: notBefore}
	}
	return f
}

func (a *Alarm) outcome(t projections.Timer, s, st aggregate.State, err error) flight {
	var due time.Time
	switch t {
	case projections.Release:
		due = s.DueAt()
	case projections.Deliver:
		due = s.Delivery.NextAt
	case projections.Expire:
		due = s.ExpiresAt()
	case projections.Report:
		due = s.CompletedAt
	case projections.Republish:
		due = s.Delivery.NextAt.Add(a.cfg.RepublishAfter)
	case projections.Free:
		due = projections.FreeAt(s)
	}
	return a.settled(t, due, s, st.LastSeq, err)
}

// observe reports an action on an item of timer queue t due at due that
// ended with err (AlarmConfig.Observe).
func (a *Alarm) observe(t projections.Timer, due time.Time, err error) {
	if a.cfg.Observe != nil {
		a.cfg.Observe(t, a.cfg.Now().Sub(due), err)
	}
}

// settled is what follows an action on item s of timer queue t, due at
// due, that ended with err after the log reached seq for it.
func (a *Alarm) settled(t projections.Timer, due time.Time, s aggregate.State, seq events.Position, err error) flight {
	a.observe(t, due, err)
	switch {
	case err == nil:
		// Skip until the projection has seen the event, which moves the
		// task out of this queue or to a later due time.
		return flight{untilSeq: seq}
	case IsSettled(err):
		// The projection lagged the log; it will drop the item once it has
		// seen what the decision saw. The pause is a safety net only.
		return flight{untilSeq: seq, retryAt: time.Now().Add(a.cfg.ErrorBackoff)}
	case IsPermanent(err):
		// Retrying cannot help: the item stays parked (in its timer queue,
		// not acted on) until this process restarts. Observe counts it.
		a.cfg.Logger.Error().Err(err).Str("task", s.TaskID).Stringer("timer", t).Msg("alarm action failed for good; not retried")
		return flight{parked: true}
	default:
		a.warn("alarm "+t.String()+" failed; will retry", s, err)
		return flight{retryAt: time.Now().Add(a.cfg.ErrorBackoff)}
	}
}

// warn logs a failure the alarm retries, through Repeats: msg is the
// kind, so one line stands for every task that fails the same way.
func (a *Alarm) warn(msg string, s aggregate.State, err error) {
	a.cfg.Repeats.Log(zerolog.WarnLevel, msg, msg, func(e *zerolog.Event) {
		e.Err(err).Str("task", s.TaskID).Int("attempt", s.Delivery.Attempt)
	})
}

// IsSettled reports whether err says an action is no longer needed: the
// task moved on, is terminal or is gone.
func IsSettled(err error) bool {
	return errors.Is(err, aggregate.ErrStale) || errors.Is(err, aggregate.ErrTerminal) ||
		errors.Is(err, aggregate.ErrNotFound)
}

// IsPermanent reports whether err says an action can never succeed as it
// is: the aggregate refused its arguments, the log cannot take the event
// it makes, or the task holds a message on the log that does not decode
// (an *events.CorruptError: quarantined). Retrying it would loop forever.
func IsPermanent(err error) bool {
	_, corrupt := errors.AsType[*events.CorruptError](err)
	return errors.Is(err, aggregate.ErrInvalid) || errors.Is(err, aggregate.ErrTooLarge) || corrupt
}

// deliver publishes the ready notification and returns the command that
// records the outcome: published, retry later with backoff, or exhausted
// once the delivery budget (or MaxDeliveryAttempts) is spent. A retry is
// never due after the budget ends.
func (a *Alarm) deliver(ctx context.Context, s aggregate.State) aggregate.Command {
	seq, err := a.pub.PublishReady(ctx, s, s.Delivery.ID)
	if err == nil {
		a.cfg.Crash(CrashPublished)
		return aggregate.MarkReadyPublished{DeliveryID: s.Delivery.ID, ReadySeq: seq}
	}
	a.warn("ready publish failed; will retry", s, err)
	now := a.cfg.Now()
	since := s.Delivery.FirstAt
	if since.IsZero() { // a delivery from a snapshot older than FirstAt
		since = s.CreatedAt
	}
	end := since.Add(a.cfg.DeliveryBudget)
	if !now.Before(end) || a.cfg.MaxDeliveryAttempts > 0 && s.Delivery.Attempt >= a.cfg.MaxDeliveryAttempts {
		return aggregate.ExhaustDelivery{DeliveryID: s.Delivery.ID, Reason: fmt.Sprintf(
			"ready notification not published after %d attempts in %s: %v", s.Delivery.Attempt, now.Sub(since).Round(time.Millisecond), err)}
	}
	next := now.Add(a.backoff(s.Delivery.Attempt))
	if next.After(end) {
		next = end
	}
	return aggregate.RetryDelivery{DeliveryID: s.Delivery.ID, NextAt: next, Error: err.Error()}
}

// exhausted logs and counts a delivery the alarm gave up on.
func (a *Alarm) exhausted(s aggregate.State, reason string) {
	a.cfg.Logger.Error().Str("task", s.TaskID).Str("customer", s.CustomerID).Str("queue", s.Spec.Queue).
		Str("delivery", s.Delivery.ID).Int("attempts", s.Delivery.Attempt).Str("reason", reason).
		Msg("delivery exhausted; the task failed")
	if a.cfg.Exhausted != nil {
		a.cfg.Exhausted(s)
	}
}

// backoff is exponential in the attempt with full jitter on its upper half.
func (a *Alarm) backoff(attempt int) time.Duration {
	d := a.cfg.RetryBase << min(attempt-1, 20)
	if d <= 0 || d > a.cfg.RetryMax {
		d = a.cfg.RetryMax
	}
	return d/2 + rand.N(d/2+1)
}

// republish checks the notification of a task queued for RepublishAfter
// since its last publish. One the ready stream still holds is live
// (waiting for a claimer, or taken by one and redelivered after its ack
// wait) and is checked again RepublishAfter later. One that is gone, or
// whose sequence is unknown, is published again with the same token and
// a message id of its own (the ready stream would drop a copy under the
// delivery id as a duplicate), and ReadyRepublished records where.
//
// Before publishing the task is read from the log: the projection may lag
// a claim, and it does not keep the spec's signal, which the notification
// carries.
func (a *Alarm) republish(ctx context.Context, s aggregate.State) flight {
	// Checked again RepublishAfter from now: the item's due time moves
	// (no event), so live notifications cost nothing until then.
	later := func() flight {
		a.proj.Postpone(projections.Republish, s.TaskID, a.cfg.Now())
		return flight{}
	}
	if live, err := a.live(ctx, s); live || err != nil {
		return later()
	}
	fresh, err := a.store.Load(ctx, s.TaskID)
	if err != nil {
		return a.outcome(projections.Republish, s, s, err)
	}
	if fresh.Status != aggregate.StatusQueued || fresh.Delivery.ID != s.Delivery.ID {
		return a.outcome(projections.Republish, s, fresh, fmt.Errorf("%w: task is %s", aggregate.ErrStale, fresh.Status))
	}
	if fresh.Delivery.ReadySeq != s.Delivery.ReadySeq {
		if live, err := a.live(ctx, fresh); live || err != nil {
			return later()
		}
	}
	seq, err := a.pub.PublishReady(ctx, fresh, fresh.Delivery.ID+"-"+strconv.Itoa(fresh.Version))
	if err != nil {
		a.warn("ready republish failed; will retry", s, err)
		return later()
	}
	cmd := aggregate.RepublishReady{DeliveryID: fresh.Delivery.ID, LostSeq: fresh.Delivery.ReadySeq, ReadySeq: seq}
	st, _, err := a.store.ExecuteSeen(ctx, s.TaskID, "", cmd, fresh.LastSeq)
	if err == nil {
		a.cfg.Logger.Info().Str("task", s.TaskID).Str("delivery", fresh.Delivery.ID).Uint64("readySeq", seq).
			Msg("ready notification was lost; published again")
	}
	return a.outcome(projections.Republish, s, st, err)
}

// live reports whether the ready stream holds s's notification; false
// when its sequence is unknown. A failed check is logged.
func (a *Alarm) live(ctx context.Context, s aggregate.State) (bool, error) {
	if s.Delivery.ReadySeq == 0 {
		return false, nil
	}
	stored, err := a.pub.ReadyStored(ctx, s)
	if err != nil {
		a.warn("ready notification check failed; will check again", s, err)
	}
	return stored, err
}

// report appends a terminal child's result to its parent's mailbox under a
// message id fixed by the child, so a repeated report is a no-op. A report
// the log refuses for good (a store whose events are capped below a
// mailbox message) is sent once more bare, status only, so the parent
// still hears.
func (a *Alarm) report(ctx context.Context, child aggregate.State) flight {
	msg := ChildResultMessage(child)
	st, _, err := a.store.Execute(ctx, child.Spec.ParentID, "", aggregate.AppendMail{Message: msg})
	if IsPermanent(err) {
		a.cfg.Logger.Warn().Err(err).Str("task", child.TaskID).Msg("child report refused; reporting the status alone")
		msg = childResultMessage(events.ChildResult{TaskID: child.TaskID, Status: string(child.Status), Truncated: true})
		st, _, err = a.store.Execute(ctx, child.Spec.ParentID, "", aggregate.AppendMail{Message: msg})
	}
	return a.outcome(projections.Report, child, st, err)
}

// release releases a due task. A task with a concurrency key first takes
// a slot of it for its attempt (or finds it holds one: a release a crash
// interrupted), and is released only at that attempt; while the key is
// full it stays scheduled, and is tried again when the projections show a
// slot free. A task one of whose ancestors has ended is not released but
// canceled (CancelForAncestor), before it takes a slot.
func (a *Alarm) release(ctx context.Context, s aggregate.State) flight {
	if id, status, found := a.proj.TerminalAncestor(s.TaskID); found {
		st, _, err := a.store.ExecuteSeen(ctx, s.TaskID, "", aggregate.CancelForAncestor{}, s.LastSeq)
		if err == nil {
			a.cfg.Logger.Debug().Str("task", s.TaskID).Str("ancestor", id).Str("status", string(status)).
				Msg("ancestor ended; the task is canceled instead of released")
		}
		return a.outcome(projections.Release, s, st, err)
	}
	cmd := aggregate.ReleaseDue{DeliveryID: events.NewID()}
	if c := s.Spec.Concurrency; c != nil {
		cmd.Attempt = s.Attempt()
		k, _, err := a.store.ExecuteKey(ctx, aggregate.AcquireSlot{CustomerID: s.CustomerID, Key: c.Key, TaskID: s.TaskID, Limit: c.Limit, Attempt: cmd.Attempt})
		if errors.Is(err, aggregate.ErrKeyFull) {
			// The projection lagged another acquisition; once it has
			// seen it, the key's room decides again.
			return flight{untilSeq: k.LastSeq}
		}
		if err != nil {
			return a.outcome(projections.Release, s, aggregate.State{LastSeq: k.LastSeq}, err)
		}
		a.cfg.Crash(CrashSlotAcquired)
	}
	// The notification is published here, at once (or the delivery
	// handed to a claimer waiting here), rather than by the Deliver queue
	// once the projections have seen the release; the Deliver queue, due
	// ReadyGrace later, is the path after a crash.
	cmd.NextAt = a.cfg.Now().Add(a.cfg.ReadyGrace)
	st, evs, err := a.store.ExecuteSeen(ctx, s.TaskID, "", cmd, s.LastSeq)
	if err != nil {
		return a.outcome(projections.Release, s, st, err)
	}
	a.cfg.Crash(CrashReleased)
	if a.cfg.Handoff != nil && a.cfg.Handoff(st, evs) {
		return a.outcome(projections.Release, s, st, nil)
	}
	if next, err := a.deliverNow(ctx, st); err == nil {
		st = next
	}
	return a.outcome(projections.Release, s, st, nil)
}

// free releases the slot of a terminal task that holds one of its
// concurrency key (or of one whose release failed after it acquired its
// slot: canceled in between), or of a retried task that holds the slot of
// an earlier attempt (never one taken for its current attempt). A task
// that holds none any more (another process freed it) appends nothing.
// Having freed the slot, it hands it to the first waiter at once rather
// than after the projections have seen it free; the Release queue would
// release that task too (a second attempt then appends nothing).
func (a *Alarm) free(ctx context.Context, s aggregate.State) flight {
	cmd := aggregate.ReleaseSlot{CustomerID: s.CustomerID, Key: s.Spec.Concurrency.Key, TaskID: s.TaskID, Status: s.Status}
	if s.Status != "" && !s.Status.Terminal() {
		cmd.Before = s.Attempt()
	}
	k, evs, err := a.store.ExecuteKey(ctx, cmd)
	if err == nil && len(evs) > 0 {
		// Whichever partition the waiter is in: the slot is this
		// process's to hand on, and its owner's release then appends
		// nothing.
		for _, w := range a.proj.Waiters(s.CustomerID, cmd.Key, a.cfg.Now(), 1) {
			a.release(ctx, w)
		}
	}
	return a.outcome(projections.Free, s, aggregate.State{LastSeq: k.LastSeq}, err)
}
