package delivery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/ready"
)

// Log is the task log as Queues uses it: it records that a released
// delivery's notification was published (aggregate.MarkReadyPublished).
type Log interface {
	// ExecuteSeen executes cmd on the task as it stood at sequence seen.
	ExecuteSeen(ctx context.Context, taskID, actor string, cmd aggregate.Command, seen events.Position) (aggregate.State, []events.Event, error)
}

// Views is the projections as Queues uses them.
type Views interface {
	// ApplyOwn folds events just appended into the views ahead of their
	// tail, and reports whether all of them are in.
	ApplyOwn(evs []events.Event) bool
}

// Config configures Queues. JS is required; zero values elsewhere mean the
// defaults.
type Config struct {
	JS       jetstream.JetStream
	Stream   string          // the ready stream; default events.ReadyStreamName(events.DefaultStream)
	Subjects events.Subjects // default events.DefaultSubjects
	// AckWait is how long a notification a claimer took stays invisible
	// to other claimers; default ready.DefaultAckWait.
	AckWait time.Duration
	// Idle is how long the server keeps a queue's ready consumer without
	// a pull; default ready.ConsumerIdle.
	Idle time.Duration
	// Publisher, if set, publishes the released deliveries no claimer
	// here takes (Release, and HoldOrHandoff once a hold ends);
	// Log then records them. Without it Queues only hands deliveries off
	// and the alarm publishes the rest.
	Publisher *Publisher
	Log       Log
	// Views, if set, takes the events that released a delivery before it
	// is handed off, so that the claim folds its own Claimed in at once.
	Views Views
	// ReadyGrace bounds a publish's wait for the ready stream: past
	// it the alarm publishes anyway. Default events.DefaultReadyGrace.
	ReadyGrace time.Duration
	// WriteTimeout bounds the record of a published delivery
	// (ReadyPublished); default 10s.
	WriteTimeout time.Duration
	Logger       zerolog.Logger
	// Handed, if set, is called for each delivery handed to a claimer
	// without a notification.
	Handed func()
}

// Queues is the ready queue of this process: one Dispatcher per queue,
// each on the queue's durable pull consumer of the ready stream (which
// every claimer of the queue in any process shares), the handoff of
// released deliveries to the claimers waiting here, and the publish of
// those nobody here takes. It is safe for concurrent use.
type Queues struct {
	cfg Config
	mu  sync.Mutex // serializes creating and renewing dispatchers
	// m maps a queue to its *Dispatcher. It is read without mu, by every
	// release (handoff): mu is held across a call to the server.
	m     sync.Map
	ready struct {
		mu     sync.Mutex
		stream jetstream.Stream // nil until first needed
	}
	// The publishers of released deliveries (Release): releases is nil
	// without a Publisher; stop ends them.
	releases chan aggregate.State
	stop     context.CancelFunc
	stopping context.Context
	wg       sync.WaitGroup
}

// The publishers of Release: how many publish at once, and how many
// released deliveries may wait for them before Release publishes in its
// caller's goroutine.
const (
	releasePublishers = 16
	releaseBacklog    = 4096
)

// New returns the Queues cfg describes; it fails when cfg.JS is nil, or
// cfg.Publisher is set without cfg.Log.
func New(cfg Config) (*Queues, error) {
	switch {
	case cfg.JS == nil:
		return nil, errors.New("delivery: Config.JS is required")
	case cfg.Publisher != nil && cfg.Log == nil:
		return nil, errors.New("delivery: Config.Log is required with a Publisher")
	}
	if cfg.Stream == "" {
		cfg.Stream = events.ReadyStreamName(events.DefaultStream)
	}
	if cfg.Subjects.Root == "" {
		cfg.Subjects = events.DefaultSubjects
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = ready.DefaultAckWait
	}
	if cfg.Idle <= 0 {
		cfg.Idle = ready.ConsumerIdle
	}
	if cfg.ReadyGrace <= 0 {
		cfg.ReadyGrace = events.DefaultReadyGrace
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	q := &Queues{cfg: cfg}
	q.stopping, q.stop = context.WithCancel(context.Background())
	if cfg.Publisher != nil {
		q.releases = make(chan aggregate.State, releaseBacklog)
		q.wg.Add(releasePublishers)
		for range releasePublishers {
			go q.publishReleases()
		}
	}
	return q, nil
}

// lookup returns queue's dispatcher, nil when it has none yet.
func (q *Queues) lookup(queue string) *Dispatcher {
	if d, ok := q.m.Load(queue); ok {
		return d.(*Dispatcher)
	}
	return nil
}

// all returns every dispatcher.
func (q *Queues) all() []*Dispatcher {
	var out []*Dispatcher
	for _, d := range q.m.Range {
		out = append(out, d.(*Dispatcher))
	}
	return out
}

// Dispatcher returns queue's dispatcher. It creates the queue's consumer
// (ready.ConsumerConfig) the first time, and again when the dispatcher
// has not pulled for half of Config.Idle: the server may have deleted the
// idle consumer, or be about to. ctx bounds that call; its error comes
// back wrapped.
func (q *Queues) Dispatcher(ctx context.Context, queue string) (*Dispatcher, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.lookup(queue)
	ok := d != nil
	if ok && !d.idleFor(q.cfg.Idle/2) {
		return d, nil
	}
	cc := ready.ConsumerConfig(q.cfg.Subjects, queue, q.cfg.AckWait)
	cc.InactiveThreshold = q.cfg.Idle
	c, err := q.cfg.JS.CreateOrUpdateConsumer(ctx, q.cfg.Stream, cc)
	if err != nil {
		return nil, fmt.Errorf("ready consumer for %s: %w", queue, err)
	}
	if ok {
		d.setConsumer(c)
		return d, nil
	}
	d = newDispatcher(c, q.cfg.Logger)
	d.handed = q.cfg.Handed
	q.m.Store(queue, d)
	return d, nil
}

// Waiting returns how many claimers wait on queue in this process, or on
// every queue for "".
func (q *Queues) Waiting(queue string) int {
	var ds []*Dispatcher
	if queue == "" {
		ds = q.all()
	} else if d := q.lookup(queue); d != nil {
		ds = []*Dispatcher{d}
	}
	n := 0
	for _, d := range ds {
		d.mu.Lock()
		n += d.waiters.Len()
		d.mu.Unlock()
	}
	return n
}

// Close starts no more pulls and returns once the pulls of ready
// notifications in flight have ended (at most a second); what they bring,
// and every parked notification, is handed back to the consumer at once.
// Held deliveries, and released ones not yet published (Release), are
// dropped: the alarm publishes them after its grace. Close is idempotent.
func (q *Queues) Close() {
	q.stop()
	q.wg.Wait()
	for _, d := range q.all() {
		d.stop()
	}
}

// Publishes reports whether Release publishes what no claimer here takes
// (Config.Publisher is set).
func (q *Queues) Publishes() bool { return q.cfg.Publisher != nil }

// HoldOrHandoff is the handoff for the alarm's releases
// (reactors.AlarmConfig.Handoff): it gives st's delivery to a claimer
// waiting here, or, when no claimer may take it now but claimers of its
// queue were waiting a moment ago (busy claiming a burst), holds it for
// the next one for up to holdFor and then publishes it (and records
// ReadyPublished), as the alarm would have. It reports whether st was
// handed off or held: either way the caller publishes nothing. evs are
// the events that released st (see handoff).
func (q *Queues) HoldOrHandoff(st aggregate.State, evs []events.Event) bool {
	var publish func()
	if q.Publishes() {
		publish = func() {
			q.publishReleased(st)
		}
	}
	return q.handoff(st, evs, publish)
}

// handoff gives the delivery of st, a task just released and not yet
// published, to a claimer of its queue waiting in this process that may
// claim it, and reports whether one took it. The claim then needs no
// ready notification and no ReadyPublished: two writes fewer. A task
// nobody here waits for is published as before. A claimer waits only
// while the queue has nothing for it here, so a task handed off at once
// overtakes nothing this process holds.
//
// evs are the events that released st, if the views may not hold them
// yet: they are folded in first (ApplyOwn), so that the claim folds its
// own Claimed in at once rather than waiting for the tail. publish, if
// set, lets the dispatcher hold the delivery (see HoldOrHandoff).
func (q *Queues) handoff(st aggregate.State, evs []events.Event, publish func()) bool {
	d := q.lookup(st.Spec.Queue)
	if d == nil {
		return false
	}
	if len(evs) > 0 && q.cfg.Views != nil {
		q.cfg.Views.ApplyOwn(evs)
	}
	return d.handoff(notification(st), publish)
}

// Release hands st, a task its TaskScheduled released (and the views
// already hold), to a claimer waiting here, or else has its ready
// notification published and recorded (ReadyPublished) as the alarm
// would. It does not wait for the publish: Release's publishers do it,
// unless releaseBacklog deliveries already wait for them, when the caller
// publishes itself (so a burst slows its writers down rather than growing
// without bound). A failure, a shutdown first, or Queues without a
// Publisher, is left to the alarm: the task waits in its delivery queue
// until the grace ends, and a notification published twice is dropped by
// the ready stream (same message id) or stale for its claim.
func (q *Queues) Release(st aggregate.State) {
	crashpoint.Hit(crashpoint.Released)
	if q.handoff(st, nil, nil) || q.releases == nil {
		return
	}
	select {
	case q.releases <- st:
	default:
		q.publishReleased(st)
	}
}

// publishReleases publishes what Release queues until Close.
func (q *Queues) publishReleases() {
	defer q.wg.Done()
	for {
		select {
		case st := <-q.releases:
			q.publishReleased(st)
		case <-q.stopping.Done():
			return
		}
	}
}

// publishReleased publishes the ready notification of st, a released task
// nobody here took, records it (ReadyPublished) and folds that into the
// views. A claim that got there first makes ReadyPublished stale, which
// needs no write. Past the grace the alarm publishes anyway: the publish
// waits no longer than that.
func (q *Queues) publishReleased(st aggregate.State) {
	pctx, cancel := context.WithTimeout(q.stopping, q.cfg.ReadyGrace)
	seq, err := q.cfg.Publisher.PublishReady(pctx, st, st.Delivery.ID)
	cancel()
	if err != nil {
		return
	}
	crashpoint.Hit(crashpoint.Published)
	ctx, cancel := context.WithTimeout(q.stopping, q.cfg.WriteTimeout)
	defer cancel()
	cmd := aggregate.MarkReadyPublished{DeliveryID: st.Delivery.ID, ReadySeq: seq}
	if _, evs, err := q.cfg.Log.ExecuteSeen(ctx, st.TaskID, "", cmd, st.LastSeq); err == nil && q.cfg.Views != nil {
		q.cfg.Views.ApplyOwn(evs)
	}
}

// Drop deletes the ready notification of a task claimed without it; a
// failure only leaves a stale notification, which its claimer
// acknowledges.
func (q *Queues) Drop(ctx context.Context, st aggregate.State) {
	if st.Delivery.ReadySeq == 0 {
		return
	}
	rs, err := q.readyStream(ctx)
	if err == nil {
		err = rs.DeleteMsg(ctx, st.Delivery.ReadySeq)
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		q.cfg.Logger.Debug().Err(err).Str("task", st.TaskID).Msg("stale ready notification not deleted")
	}
}

// readyStream returns the ready stream's handle, looked up once.
func (q *Queues) readyStream(ctx context.Context) (jetstream.Stream, error) {
	q.ready.mu.Lock()
	defer q.ready.mu.Unlock()
	if q.ready.stream == nil {
		rs, err := q.cfg.JS.Stream(ctx, q.cfg.Stream)
		if err != nil {
			return nil, err
		}
		q.ready.stream = rs
	}
	return q.ready.stream, nil
}
