// Package store is the repository of tasks, concurrency keys and
// schedules over the log: it loads one by replaying its subject (with a
// cache of states), decides commands with the aggregate, appends the
// events with the subject's last sequence as the expected one, and on a
// conflict catches up and decides again. It is the only writer of the
// log. The log itself, its streams, layout, append pipeline and readers,
// is internal/eventlog; the store opens it (Open) and calls it. Runs, the
// latest run state of each task, are a key-value bucket beside the log.
package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// TypeHeader carries the event type so consumers can skip an event
// without decoding it.
const TypeHeader = "Tl-Type"

// ErrUnavailable is returned (wrapped) by Execute when the log could not
// be read or written: no stream leader during an election, a lost
// connection, a timeout. An append that failed this way may still have
// landed; the caller may retry the command, which the aggregate decides
// again.
var ErrUnavailable = errors.New("store: log unavailable")

// ErrSealed is returned (wrapped) by Execute when the event would go in
// a sealed epoch's stream (docs/DESIGN.md, "Epochs"), which takes no
// write: a mailbox cursor moved on a task whose epoch ended. Nothing was
// written. It wraps aggregate.ErrTerminal (every task of a sealed epoch
// has ended), so a caller that meets it otherwise answers 409 terminal.
var ErrSealed = fmt.Errorf("store: the task's epoch is sealed: %w", aggregate.ErrTerminal)

// Config configures a Store. The zero value of every field means its
// default.
type Config struct {
	Stream   string          // event stream name; default events.DefaultStream
	Subjects events.Subjects // default events.DefaultSubjects
	// Shards is the number of event streams the log is spread over
	// (internal/eventlog, "Sharded log"); default 1, the unsharded log. It
	// is fixed when the log is created: Open refuses another one with
	// eventlog.ErrShardsMismatch.
	Shards int
	// EpochSlots, if above 0, gives the log epochs (internal/eventlog,
	// "Epochs"): its tasks live in EpochSlots sets of Shards streams, one
	// epoch of EpochPeriod to a set. Fixed when the log is created, like
	// Shards; 0, the default, keeps every task in the shards' streams.
	EpochSlots      int
	EpochPeriod     time.Duration
	Replicas        int           // stream replicas; default 1
	DuplicateWindow time.Duration // server-side dedupe of retried appends; default 2m
	MaxRetries      int           // reload-and-redecide rounds on a conflict; default 32
	// CacheSize is how many live (not terminal) tasks' states are
	// cached, and an eighth of it how many finished ones (the most
	// recent); default 65536, -1 disables the cache.
	CacheSize int
	Actor     string // actor of events this node decides; default "scheduler"
	Now       func() time.Time
	// Locate, if set, returns the customer and the root of a task when
	// they are known (from the projections), so a load reads the task's
	// exact subject in its shard instead of matching every customer's
	// (several times faster) in every shard.
	// It also returns the position of the task's first event, whose part
	// holds all of them.
	Locate func(taskID string) (customerID, rootID string, first events.Position, ok bool)
	// ReadTimeout bounds one read when the caller's context has no
	// deadline; default 10s.
	ReadTimeout time.Duration
	// MaxEventBytes, if above 0, is the event stream's maximum message
	// size: an encoded event (with its headers) larger than this, or than
	// the NATS server's max payload, fails with aggregate.ErrTooLarge.
	// 0 leaves only the server's max payload (1 MiB by default).
	MaxEventBytes int32
	// WriteTimeout bounds one append, retries included: a log that does
	// not acknowledge within it (a full disk: nats-server then stores
	// nothing and answers nothing) fails the append as unavailable;
	// default 5s.
	WriteTimeout time.Duration
	// Chain, if set, keys the log's hash chain: every event appended is
	// encoded with it (events.Keyring.AppendEncode), so it names the
	// signing key and ends with its HMAC. Nil appends unkeyed events, as
	// before the chain was keyed (tests, benchmarks). UseChain sets it
	// after Open.
	Chain *events.Keyring
}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = events.DefaultStream
	}
	if c.Subjects.Root == "" {
		c.Subjects = events.DefaultSubjects
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 32
	}
	if c.CacheSize == 0 {
		c.CacheSize = 1 << 16
	}
	if c.Actor == "" {
		c.Actor = "scheduler"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 10 * time.Second
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 5 * time.Second
	}
	return c
}

// Store loads and changes tasks. It is safe for concurrent use by any
// number of goroutines and processes: every append is guarded by the
// task's last sequence, so no lock outside JetStream is relied upon.
type Store struct {
	cfg    Config
	js     jetstream.JetStream
	shards events.Shards
	parts  []eventlog.Part // by shard
	pipe   *eventlog.Pipeline

	mu    sync.Mutex
	cache *taskCache                    // task states: live ones, and the last finished ones
	keys  map[string]aggregate.KeyState // concurrency keys by key id, at most CacheSize

	// turns serialize this process's commands on one task, so two of
	// them do not race each other's append and pay a conflict and a
	// catch-up read. Other processes still race; the OCC check alone
	// decides between them.
	turnsMu sync.Mutex
	turns   map[string]*turn

	loads   atomic.Uint64                   // commands' states read from the log (CommandLoads)
	failing atomic.Pointer[writeFailure]    // nil while appends succeed
	epochs  atomic.Pointer[eventlog.Epochs] // nil without epochs
	chain   atomic.Pointer[events.Keyring]  // Config.Chain, or UseChain's; nil: unkeyed

	conflictsMu sync.Mutex
	conflicts   map[events.Type]uint64 // appends refused for a wrong expected sequence, by event type
}

// writeFailure is the first failed append since the last one that
// succeeded.
type writeFailure struct {
	since time.Time
	err   error
}

// turn is one task's lock and how many commands hold or wait for it.
type turn struct {
	sync.Mutex
	users int
}

// take waits for taskID's turn and returns its release.
func (s *Store) take(taskID string) func() {
	s.turnsMu.Lock()
	t := s.turns[taskID]
	if t == nil {
		t = &turn{}
		s.turns[taskID] = t
	}
	t.users++
	s.turnsMu.Unlock()
	t.Lock()
	return func() {
		t.Unlock()
		s.turnsMu.Lock()
		if t.users--; t.users == 0 {
			delete(s.turns, taskID)
		}
		s.turnsMu.Unlock()
	}
}

// Open creates the event streams (one per shard), or updates them to this
// configuration, and returns a Store on them. It fails with an error
// wrapping eventlog.ErrShardsMismatch when the log has another layout.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	// Appends are pipelined: every caller's message goes out at once on
	// the one connection, each with its own expected subject sequence,
	// and each caller waits for its own ack. The server checks every
	// message's sequence on its own, so OCC is per message as before.
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("store: jetstream: %w", err)
	}
	if cfg.Shards < 1 || cfg.Shards > eventlog.MaxShards {
		return nil, fmt.Errorf("store: %d shards: want 1 to %d", cfg.Shards, eventlog.MaxShards)
	}
	if cfg.EpochSlots < 0 || cfg.EpochSlots == 1 || cfg.EpochSlots > eventlog.MaxEpochSlots || cfg.EpochSlots > 0 && cfg.EpochPeriod < eventlog.MinEpochPeriod {
		return nil, fmt.Errorf("store: %d epoch slots of %s: want 0, or 2 to %d slots of at least %s", cfg.EpochSlots, cfg.EpochPeriod, eventlog.MaxEpochSlots, eventlog.MinEpochPeriod)
	}
	if cfg.EpochSlots == 0 {
		cfg.EpochPeriod = 0
	}
	shards := events.Shards{K: cfg.Shards, Slots: cfg.EpochSlots}
	if err := eventlog.AgreeLayout(ctx, js, cfg.Stream, eventlog.Layout{Shards: cfg.Shards, Slots: cfg.EpochSlots, Period: cfg.EpochPeriod}, cfg.Replicas, cfg.Now()); err != nil {
		return nil, err
	}
	st := &Store{cfg: cfg, js: js, shards: shards, cache: newTaskCache(cfg.CacheSize),
		keys: make(map[string]aggregate.KeyState), turns: make(map[string]*turn)}
	st.chain.Store(cfg.Chain)
	if err := st.RefreshEpochs(ctx); err != nil {
		return nil, err
	}
	for i := range shards.N() {
		p, err := eventlog.OpenPart(ctx, nc, js, eventlog.StreamConfig{Stream: cfg.Stream, Subjects: cfg.Subjects, Replicas: cfg.Replicas, DuplicateWindow: cfg.DuplicateWindow, MaxEventBytes: cfg.MaxEventBytes}, shards, i, st.Epochs())
		if err != nil {
			st.closeParts()
			return nil, err
		}
		st.parts = append(st.parts, p)
	}
	if st.pipe, err = eventlog.NewPipeline(nc, maxPipelined, cfg.WriteTimeout); err != nil {
		st.closeParts()
		return nil, err
	}
	return st, nil
}

func (s *Store) closeParts() error {
	var errs []error
	for _, p := range s.parts {
		errs = append(errs, p.Get.Close())
	}
	return errors.Join(errs...)
}

// Close releases the Store's subscriptions. It does not close the
// connection.
func (s *Store) Close() error { return errors.Join(s.pipe.Close(), s.closeParts()) }

// JetStream returns the JetStream context the store appends with.
func (s *Store) JetStream() jetstream.JetStream { return s.js }

// Stream returns the event stream of shard 0: the only one when the log
// is not sharded.
func (s *Store) Stream() jetstream.Stream { return s.parts[0].Stream }

// Shards returns how the log is sharded.
func (s *Store) Shards() events.Shards { return s.shards }

// Subjects returns the subjects the store writes.
func (s *Store) Subjects() events.Subjects { return s.cfg.Subjects }

// Log returns a reader of the store's whole stream.
func (s *Store) Log() eventlog.Log {
	return eventlog.Log{JS: s.js, Stream: s.cfg.Stream, Subjects: s.cfg.Subjects, Shards: s.shards}
}

// Lineage returns the events of the lineage root heads, in log order
// (Log.Lineage).
func (s *Store) Lineage(ctx context.Context, root aggregate.State) ([]events.Event, error) {
	return s.Log().Lineage(ctx, root)
}

// CustomerEvents calls fn for every event of a customer's tasks stored at
// or after since, in log order, and quarantine for every message there
// that does not decode (Log.Customer).
func (s *Store) CustomerEvents(ctx context.Context, customerID string, since time.Time, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error {
	return s.Log().Customer(ctx, customerID, since, fn, quarantine)
}

// Now returns the store's clock reading.
func (s *Store) Now() time.Time { return s.cfg.Now() }

// History returns every event of the task in log order, each with its
// stream sequence. A task with no events returns an empty slice. When the
// task's subject holds a message that does not decode, History fails
// with an error wrapping its *events.CorruptError (the first such) and
// still returns every event that did decode.
func (s *Store) History(ctx context.Context, taskID string) ([]events.Event, error) {
	var evs []events.Event
	err := s.replay(ctx, taskID, func(ev events.Event) { evs = append(evs, ev) })
	return evs, err
}

// Load returns the task's current state, replayed from the log (not from
// the cache). A task with no events is the zero State, not an error. A
// task whose subject holds a message that does not decode fails with its
// *events.CorruptError, as History does. On a
// replicated stream, History and Load also ask the stream leader, so they
// see every append acknowledged before the call (a follower answering the
// direct get may lag).
func (s *Store) Load(ctx context.Context, taskID string) (aggregate.State, error) {
	var st aggregate.State
	err := s.replay(ctx, taskID, func(ev events.Event) { st = aggregate.Apply(st, ev) })
	return st, err
}

// replay calls fn for each event of the task. Where the projections know
// the task (Locate) it reads the task's exact subject in its shard;
// otherwise it matches the task id in every shard in turn, up to the
// first that holds it (docs/DESIGN.md, "Sharded log").
func (s *Store) replay(ctx context.Context, taskID string, fn func(events.Event)) error {
	if s.cfg.Locate != nil {
		if customerID, _, first, ok := s.cfg.Locate(taskID); ok {
			i, _ := s.shards.Split(first)
			return s.readSubject(ctx, i, s.parts[i].Subjects.Event(customerID, taskID), 0, fn)
		}
	}
	for _, i := range s.taskParts() {
		found := false
		err := s.readSubject(ctx, i, s.parts[i].Subjects.Task(taskID), 0, func(ev events.Event) { found = true; fn(ev) })
		if err != nil || found {
			return err
		}
	}
	return nil
}

// taskParts returns the parts that may hold tasks: every part without
// epochs, else those of every slot (Epochs.SlotsToRead).
func (s *Store) taskParts() []int {
	if s.shards.Slots == 0 {
		return s.shards.SlotParts(-1) // the shards
	}
	var parts []int
	for _, slot := range s.Epochs().SlotsToRead() {
		parts = append(parts, s.shards.SlotParts(slot)...)
	}
	return parts
}

// readSubject calls fn for each event stored on subject of shard i at or
// after stream sequence from, within ReadTimeout unless ctx has a
// deadline; on a replicated stream it asks the leader (see Load). Each
// event's Seq is its position. A message that does not decode is
// quarantined: skipped, the read goes on, and once it is done the first
// such message comes back as a *events.CorruptError, so the subject
// answers a clear error naming it instead of ending the read there.
func (s *Store) readSubject(ctx context.Context, i int, subject string, from uint64, fn func(events.Event)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.ReadTimeout)
		defer cancel()
	}
	get := s.parts[i].Get
	fetch := get.Fetch
	if s.cfg.Replicas > 1 {
		fetch = get.FetchCurrent
	}
	var corrupt *events.CorruptError
	err := fetch(ctx, subject, from, func(seq uint64, data []byte) error {
		pos := s.shards.Position(i, seq)
		ev, err := events.DecodeHashed(data, pos)
		if err != nil {
			if corrupt == nil {
				corrupt = &events.CorruptError{Pos: pos, Subject: subject, Err: err}
			}
			return nil
		}
		fn(ev)
		return nil
	})
	if err == nil && corrupt != nil {
		err = fmt.Errorf("store: %w", corrupt)
	}
	return err
}

// Event returns the event stored at position pos.
func (s *Store) Event(ctx context.Context, pos events.Position) (events.Event, error) {
	i, seq := s.shards.Split(pos)
	msg, err := s.parts[i].Stream.GetMsg(ctx, seq)
	if err != nil {
		return events.Event{}, fmt.Errorf("store: get seq %d of shard %d: %w", seq, i, err)
	}
	ev, err := events.DecodeAt(msg.Data, pos)
	if err != nil {
		return events.Event{}, fmt.Errorf("store: %w", &events.CorruptError{Pos: pos, Subject: msg.Subject, At: msg.Time, Err: err})
	}
	return ev, nil
}

// Execute decides cmd against the task's state and appends the resulting
// events with the task's last sequence as the expected one. actor names
// the caller in each event the aggregate did not name itself (a claim's
// holder, see aggregate.Decide); "" is the store's Config.Actor. On a conflict
// it reloads and decides again, up to MaxRetries times. It returns the
// state after the append and the appended events (none when the command
// was already satisfied). Decide's errors come back wrapped (test them
// with errors.Is); ErrConflict only when every retry lost.
//
// A state from the cache is trusted only to append: the append's OCC
// check proves it current. A rejection decided on cached state is decided
// again on a fresh load before it is returned.
func (s *Store) Execute(ctx context.Context, taskID, actor string, cmd aggregate.Command) (aggregate.State, []events.Event, error) {
	return s.ExecuteSeen(ctx, taskID, actor, cmd, math.MaxUint64)
}

// ExecuteSeen is Execute for a caller that chose cmd from the task as it
// stood at sequence seen (a reactor acting on a projected state): a
// rejection decided on a cached state at least that new is returned as it
// is, without a fresh load, since a fresher view would only show the task
// further along. The caller acts again when its own view moves on.
func (s *Store) ExecuteSeen(ctx context.Context, taskID, actor string, cmd aggregate.Command, seen events.Position) (aggregate.State, []events.Event, error) {
	if actor == "" {
		actor = s.cfg.Actor
	}
	defer s.take(taskID)()
	fresh := false
	var pinned *aggregate.State // a state caught up after a conflict
	for attempt := 0; ; attempt++ {
		var st aggregate.State
		var cached bool
		var err error
		if pinned != nil {
			st, pinned = *pinned, nil
		} else if st, cached, err = s.state(ctx, taskID, fresh, cmd); err != nil {
			return st, nil, fmt.Errorf("%w: load task %s: %w", ErrUnavailable, taskID, err)
		}
		evs, err := aggregate.Decide(st, cmd, s.cfg.Now())
		if err != nil || len(evs) == 0 {
			if cached && st.LastSeq < seen {
				fresh = true
				continue
			}
			return st, nil, err
		}
		next, err := s.append(ctx, st, evs, actor)
		if errors.Is(err, aggregate.ErrConflict) && attempt < s.cfg.MaxRetries {
			// Another writer got there first. Read only what it appended
			// and decide again; if the event there is our own (a retried
			// publish whose first attempt landed: nats-server checks the
			// expected sequence before its dedupe window), we are done.
			caught, seq, cerr := s.catchUp(ctx, st, evs[0])
			switch {
			case cerr != nil:
				fresh = true
			case seq > 0 && len(evs) == 1:
				evs[0].Seq = seq
				s.remember(caught)
				return caught, evs, nil
			default:
				pinned = &caught
			}
			continue
		}
		if err != nil {
			return next, nil, fmt.Errorf("store: %T on task %s: %w", cmd, taskID, err)
		}
		return next, evs, nil
	}
}

// catchUp applies to st the events stored after it on ev's subject and
// reports the sequence at which ev itself was stored, or 0. It reads them
// one by one: after a conflict there are only a few.
func (s *Store) catchUp(ctx context.Context, st aggregate.State, ev events.Event) (aggregate.State, events.Position, error) {
	i, err := s.partOf(ctx, st, ev)
	if err != nil {
		return st, 0, err
	}
	subject := s.parts[i].Subjects.Event(ev.CustomerID, ev.TaskID)
	dg := s.parts[i].Get
	get := dg.NextMsg
	if s.cfg.Replicas > 1 { // ask the leader: a follower may lag
		get = func(ctx context.Context, subject string, from uint64) (uint64, []byte, bool, error) {
			return dg.LeaderGet(ctx, eventlog.LeaderGetRequest{Seq: from, NextFor: subject})
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.ReadTimeout)
		defer cancel()
	}
	var landed events.Position
	_, last := s.shards.Split(st.LastSeq)
	for from := last + 1; ; {
		seq, data, ok, err := get(ctx, subject, from)
		if err != nil || !ok {
			return st, landed, err
		}
		pos := s.shards.Position(i, seq)
		e, err := events.DecodeHashed(data, pos)
		if err != nil {
			return st, landed, fmt.Errorf("store: task %s: %w", ev.TaskID, &events.CorruptError{Pos: pos, Subject: subject, Err: err})
		}
		if e.ID == ev.ID {
			landed = pos
		}
		st, from = aggregate.Apply(st, e), seq+1
	}
}

// state returns the task's state from the cache (cached is true) or the
// log. A command that creates a task is first decided on the empty state
// without a read: its append expects no earlier event, so if the task
// exists after all the append conflicts and the command is decided again
// (with epochs, only if it is in the same epoch: so there it reads first).
func (s *Store) state(ctx context.Context, taskID string, fresh bool, cmd aggregate.Command) (st aggregate.State, cached bool, err error) {
	if !fresh && s.cfg.CacheSize > 0 {
		s.mu.Lock()
		st, ok := s.cache.get(taskID)
		s.mu.Unlock()
		if ok {
			return st, true, nil
		}
	}
	customerID, rootID, creation := creates(cmd)
	if !fresh && creation {
		if s.shards.Slots == 0 {
			return aggregate.State{}, true, nil
		}
		// With epochs the task may be in another epoch's streams, where
		// its creation's append would not conflict: read it there.
		st, err = s.loadCreated(ctx, taskID, customerID, rootID)
	} else {
		st, err = s.Load(ctx, taskID)
	}
	s.loads.Add(1)
	if err != nil {
		s.forget(taskID)
	} else if st.Exists() {
		s.remember(st)
	}
	return st, false, err
}

// loadCreated returns the state of task taskID of customerID rooted at
// rootID from the epoch slot that holds it, if one does: one direct get
// per slot, in the root's shard (every slot: see Epochs.SlotsToRead).
func (s *Store) loadCreated(ctx context.Context, taskID, customerID, rootID string) (aggregate.State, error) {
	var st aggregate.State
	for _, slot := range s.Epochs().SlotsToRead() {
		part := s.shards.Part(slot, s.shards.Of(customerID, rootID))
		err := s.readSubject(ctx, part, s.parts[part].Subjects.Event(customerID, taskID), 0, func(ev events.Event) { st = aggregate.Apply(st, ev) })
		if err != nil || st.Exists() {
			return st, err
		}
	}
	return st, nil
}

func (s *Store) remember(st aggregate.State) {
	if s.cfg.CacheSize <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache.put(st)
}

func (s *Store) forget(taskID string) {
	s.mu.Lock()
	s.cache.drop(taskID)
	s.mu.Unlock()
}

// append writes evs in order after st.LastSeq and returns the state with
// them applied. Each event gets a fresh id that a retried publish reuses,
// so the server drops a duplicate of an append that did land, and links
// to the hash of the task's previous event: the state carries it, so the
// chain costs no read.
func (s *Store) append(ctx context.Context, st aggregate.State, evs []events.Event, actor string) (aggregate.State, error) {
	for i := range evs {
		ev := &evs[i]
		ev.ID, ev.Prev = events.NewID(), st.LastHash
		if ev.Actor == "" { // the aggregate names a claim's holder itself
			ev.Actor = actor
		}
		part, err := s.partOf(ctx, st, *ev)
		if err == nil {
			err = s.publish(ctx, ev, part, st.LastSeq)
		}
		if err != nil {
			s.forget(ev.TaskID)
			return st, err
		}
		st = aggregate.Apply(st, *ev)
	}
	s.remember(st)
	return st, nil
}

// publishAttempts bounds how often one append is retried after a transport
// failure (the same message id each time, so at most one lands).
const publishAttempts = 4

// maxPipelined is how many appends await their acks at once in the append
// pipeline (a further one waits for room, within the write timeout). An
// ack not back within the write timeout fails its append as unavailable
// (it may have landed).
const maxPipelined = 4096

// UseChain keys the appends from now on with chain (Config.Chain): a
// process that needs the open log to find its chain keys (node.New) opens
// the store, then calls it before anything appends. It is safe for
// concurrent use.
func (s *Store) UseChain(chain *events.Keyring) { s.chain.Store(chain) }

// Pipeline is the store's append pipeline, for publishing other messages
// through it (a ready notification, say) at its cost: one acknowledged
// publish each, none retried. It is safe for concurrent use.
func (s *Store) Pipeline() *eventlog.Pipeline { return s.pipe }

// MaxEventBytes is the largest message the log takes now: the NATS
// server's max payload, or the stream's maximum message size when that is
// smaller. An event's headers count against it.
func (s *Store) MaxEventBytes() int64 {
	n := s.js.Conn().MaxPayload()
	if m := int64(s.cfg.MaxEventBytes); m > 0 && (n <= 0 || m < n) {
		n = m
	}
	return n
}

// taskRoot returns the root of the task st is the state of, or, before
// its first event, the root ev (its creation) names.
func taskRoot(st aggregate.State, ev events.Event) string {
	if st.Spec.RootID != "" {
		return st.Spec.RootID
	}
	return events.CreationRoot(ev)
}

// partOf returns the part ev goes in: a key's or a schedule's shard, the
// part of the task st already holds, or for its first event, the part a
// new task starts in (with epochs, see creationPart).
func (s *Store) partOf(ctx context.Context, st aggregate.State, ev events.Event) (int, error) {
	switch {
	case s.shards.Slots == 0 || events.IsSchedule(ev.Type()) || events.KeyEvent(ev.Type()):
		return s.shards.OfEvent(ev, taskRoot(st, ev)), nil
	case st.LastSeq > 0:
		part, _ := s.shards.Split(st.LastSeq)
		return part, nil
	}
	return s.creationPart(ctx, ev.CustomerID, ev.TaskID, taskRoot(st, ev))
}

// publish appends ev in part shard after position expected and sets its
// Seq (its position) and Hash. Within the
// write timeout it retries what may be transient; past it, or when the
// retries are spent, it fails as ErrUnavailable and marks writes failing
// (WriteError) until an append or a Probe succeeds.
func (s *Store) publish(ctx context.Context, ev *events.Event, shard int, expected events.Position) error {
	if i, _ := s.shards.Split(expected); expected > 0 && i != shard {
		return fmt.Errorf("store: append %s: expected position %d is in part %d, the event's part is %d", ev.Type(), expected, i, shard)
	}
	am := appendMsgs.Get().(*appendMsg)
	defer am.release() // the pipeline keeps no message past its publish
	var data []byte
	var err error
	if chain := s.chain.Load(); chain != nil {
		ev.Key = chain.Signer() // as a read of the stored bytes would say
		data, err = chain.AppendEncode(am.data[:0], *ev)
	} else {
		data, err = events.AppendEncode(am.data[:0], *ev)
	}
	if err != nil {
		return err
	}
	_, expectedSeq := s.shards.Split(expected)
	s.fillMsg(am, ev, s.parts[shard].Subjects, data, expectedSeq)
	msg := &am.msg
	tooLarge := func() error {
		return fmt.Errorf("%w: the %s event is %d bytes, and the log takes at most %d bytes a message (headers included)",
			aggregate.ErrTooLarge, ev.Type(), len(data), s.MaxEventBytes())
	}
	if int64(len(data)) > s.MaxEventBytes() {
		return tooLarge()
	}
	// The first attempt is bounded by the pipeline's ack timeout, which is
	// the write timeout; retries (rare) by a deadline of their own.
	deadline := time.Now().Add(s.cfg.WriteTimeout)
	wctx := ctx
	for attempt := 1; ; attempt++ {
		seq, err := s.pipe.Publish(wctx, msg)
		if err == nil {
			ev.Seq, ev.Hash = s.shards.Position(shard, seq), events.HashOf(data)
			s.wrote()
			return nil
		}
		if eventlog.IsConflict(err) {
			s.wrote() // the log answered: it takes writes
			s.conflicted(ev.Type())
			return fmt.Errorf("%w: %v", aggregate.ErrConflict, err)
		}
		// Within a header's length of the limit: the client (max
		// payload) or the server (max message size) refuses it.
		var apiErr *jetstream.APIError
		if errors.Is(err, nats.ErrMaxPayload) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
			return tooLarge()
		}
		// A transport failure, or a replicated stream still storing an
		// earlier attempt of this message id, is retried with the same
		// message: a copy of an attempt that landed is refused (a
		// conflict, or on a replicated stream a duplicate).
		if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamSealed {
			return fmt.Errorf("%w: append %s: %v", ErrSealed, ev.Type(), err)
		}
		if errors.As(err, &apiErr) && apiErr.ErrorCode != errCodeDuplicateInProcess && apiErr.Code != 503 &&
			apiErr.ErrorCode != errCodeAccountResources {
			return fmt.Errorf("append %s: %w", ev.Type(), err)
		}
		late := func() bool { return errors.Is(err, eventlog.ErrAckTimeout) || !time.Now().Before(deadline) }
		if attempt < publishAttempts && !late() {
			if wctx == ctx {
				var cancel context.CancelFunc
				wctx, cancel = context.WithDeadline(ctx, deadline)
				defer cancel()
			}
			select {
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
				continue
			case <-wctx.Done():
			}
		}
		if ctx.Err() == nil { // the log failed, not the caller
			if late() {
				err = fmt.Errorf("not acknowledged within the write timeout (%s): %w", s.cfg.WriteTimeout, err)
			}
			s.writeFailed(err)
		}
		return fmt.Errorf("%w: append %s: %w", ErrUnavailable, ev.Type(), err)
	}
}

// fillMsg makes m the append of ev, encoded as data, after stream
// sequence expected: its subject among subjects (events.Subjects.Of: the
// task's, the concurrency key's or the schedule's), the TypeHeader and
// the expected subject sequence header JetStream checks, in one map.
//
// Only a replicated stream's appends carry the event id as their message
// id. A single server checks the expected sequence first, so a retried
// append whose first attempt landed is refused as a conflict, and the
// store finds its own event (catchUp): a message id would only cost the
// server its dedupe map. A replicated stream checks the message id first
// and answers a retry that comes while the first attempt is still being
// replicated with "duplicate in process" (retried) and one after it with
// the first attempt's sequence; without the id that retry would be a
// conflict that finds nothing yet, and the command decided again.
func (s *Store) fillMsg(m *appendMsg, ev *events.Event, subjects events.Subjects, data []byte, expected uint64) {
	m.data, m.msg.Subject, m.msg.Data = data, subjects.Of(*ev), data
	m.vals = [3]string{string(ev.Type()), strconv.FormatUint(expected, 10), ev.ID}
	// Writing a key the map holds allocates nothing.
	m.msg.Header[TypeHeader] = m.vals[0:1:1]
	m.msg.Header[jetstream.ExpectedLastSubjSeqHeader] = m.vals[1:2:2]
	if s.cfg.Replicas > 1 {
		m.msg.Header[jetstream.MsgIDHeader] = m.vals[2:3:3]
	} else {
		delete(m.msg.Header, jetstream.MsgIDHeader) // a pooled message may have had one
	}
}

// appendMsg is an append's message, reused once its publish returned: its
// encoded event's buffer, its header map and their values.
type appendMsg struct {
	msg  nats.Msg
	data []byte    // msg.Data, kept for the next append to encode into
	vals [3]string // the values of msg.Header
}

// maxPooledEvent is the largest encoded event whose buffer is reused: a
// rare large one would otherwise keep its memory in the pool.
const maxPooledEvent = 16 << 10

var appendMsgs = sync.Pool{New: func() any { return &appendMsg{msg: nats.Msg{Header: make(nats.Header, 3)}} }}

// release returns m for reuse; the event's bytes are reused too, so
// nothing may keep them.
func (m *appendMsg) release() {
	if cap(m.data) > maxPooledEvent {
		m.data = nil
	}
	m.msg.Data, m.vals = nil, [3]string{}
	appendMsgs.Put(m)
}

// wrote records that the log took a write.
func (s *Store) wrote() {
	if s.failing.Load() != nil {
		s.failing.Store(nil)
	}
}

// writeFailed records a failed append; the first since the last success
// is kept, so the reason and its time stay stable while writes fail.
func (s *Store) writeFailed(err error) {
	s.failing.CompareAndSwap(nil, &writeFailure{since: s.cfg.Now(), err: err})
}

// WriteError returns nil while the log takes writes, and otherwise an
// error wrapping ErrUnavailable that says since when appends fail and
// why: the last append failed as unavailable (not acknowledged within the
// write timeout, or refused by the server) and none has succeeded since.
// It is safe for concurrent use.
func (s *Store) WriteError() error {
	f := s.failing.Load()
	if f == nil {
		return nil
	}
	return fmt.Errorf("%w: writes failing since %s: %v", ErrUnavailable, f.since.UTC().Format(time.RFC3339), f.err)
}

// CommandLoads returns how many times this store read a task from the
// log to decide a command on it: the task was not in the cache, or a
// rejection decided on the cached state was checked against the log.
// A new task's creation, decided without a read, does not count. With
// every live task cached it stays near 0 however long the log is
// (docs/performance.md, "Growth"). It is safe for concurrent use.
func (s *Store) CommandLoads() uint64 { return s.loads.Load() }

// Conflicts returns, by the type of the event refused, how many appends
// of this store the log refused because the subject's last sequence was
// not the expected one: another writer (a process acting on the same
// timer, a claim racing the scheduling process's ReadyPublished) appended
// first, or a retried publish whose first attempt had landed. Each
// refused append counts once, whether Execute then decided again or gave
// up. The map is the caller's. It is safe for concurrent use.
func (s *Store) Conflicts() map[events.Type]uint64 {
	s.conflictsMu.Lock()
	defer s.conflictsMu.Unlock()
	return maps.Clone(s.conflicts)
}

// conflicted counts a refused append of an event of type typ.
func (s *Store) conflicted(typ events.Type) {
	s.conflictsMu.Lock()
	defer s.conflictsMu.Unlock()
	if s.conflicts == nil {
		s.conflicts = map[events.Type]uint64{}
	}
	s.conflicts[typ]++
}

// ProbeStream is the stream Probe writes to: one message, replaced by each
// probe, so its size stays constant.
func ProbeStream(stream string) string { return stream + "_PROBE" }

// Probe checks that the log takes writes without writing an event: it
// appends to the probe stream within the write timeout. A success clears
// WriteError; a failure is returned (wrapping ErrUnavailable) and leaves
// it set. Meant to be called while WriteError is set, so readiness
// recovers without waiting for a client's write.
func (s *Store) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	subject := s.cfg.Subjects.Root + ".probe"
	_, err := s.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: ProbeStream(s.cfg.Stream), Description: "taskledger write probe", Subjects: []string{subject},
		Storage: jetstream.FileStorage, Replicas: s.cfg.Replicas, MaxMsgs: 1, Discard: jetstream.DiscardOld,
	})
	if err == nil {
		_, err = s.js.Publish(ctx, subject, []byte(s.cfg.Actor))
	}
	if err != nil {
		return fmt.Errorf("%w: write probe: %w", ErrUnavailable, err)
	}
	s.wrote()
	return nil
}

// errCodeAccountResources is JetStream's answer when the account's storage
// limit is reached: the log does not take writes, as on a full disk.
const errCodeAccountResources jetstream.ErrorCode = 10002

// errCodeStreamSealed is JetStream's answer to a write to a sealed stream
// (JSStreamSealedErr).
const errCodeStreamSealed jetstream.ErrorCode = 10109

// errCodeDuplicateInProcess is a replicated stream's answer to a message
// id whose first copy is still being stored (JSStreamDuplicateMessageConflict).
const errCodeDuplicateInProcess jetstream.ErrorCode = 10158

// creates reports whether cmd makes a new task, and the customer and
// root of the task it makes.
func creates(cmd aggregate.Command) (customerID, rootID string, ok bool) {
	switch c := cmd.(type) {
	case aggregate.Schedule:
		return c.CustomerID, c.Spec.RootID, true
	case aggregate.Reject:
		return c.CustomerID, c.Spec.RootID, true
	}
	return "", "", false
}

// Config returns the store's configuration with its defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Follow calls fn for every event stored after the positions after on one
// of the subjects filters gives, and quarantine for every message there
// that does not decode, then for each later one, until ctx ends or fn or
// quarantine fails (Log.Follow).
func (s *Store) Follow(ctx context.Context, filters func(events.Subjects) []string, after []events.Position, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error {
	return s.Log().Follow(ctx, filters, after, fn, quarantine)
}

// LastSeq returns the sum of the shards' last stream sequences: with one
// shard, its last sequence (0 for an empty log). It counts what the log
// holds, as projections.Engine.Applied counts what it applied.
func (s *Store) LastSeq(ctx context.Context) (uint64, error) {
	last, err := s.LastPositions(ctx)
	return s.shards.SumSeqs(last), err
}

// LastPositions returns the position of every shard's last event, by
// shard, 0 for an empty shard.
func (s *Store) LastPositions(ctx context.Context) ([]events.Position, error) {
	last := make([]events.Position, len(s.parts))
	for i := range last {
		var err error
		if last[i], err = s.lastOf(ctx, i); err != nil {
			return nil, err
		}
	}
	return last, nil
}

// lastOf returns the position of shard i's last event from its stream's
// state. An epoch slot's stream is deleted and created again while its
// epoch is removed (RemoveEpoch): for that moment it holds nothing.
func (s *Store) lastOf(ctx context.Context, i int) (events.Position, error) {
	info, err := s.parts[i].Stream.Info(ctx)
	if _, slot := s.shards.SlotOf(i); slot && errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: stream info: %w", err)
	}
	return s.shards.Position(i, info.State.LastSeq), nil
}
