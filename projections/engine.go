package projections

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/events"
)

// Log is the log the engine folds, read in order: internal/eventlog's
// Log is the one a server passes. Its methods are safe for concurrent
// use.
type Log interface {
	// LastPositions returns the position of every part's last event, by
	// part (0 for an empty part): what Run catches up to before it is
	// ready. It must read the messages themselves: after a block file
	// lost its tail, a stream's state may name a sequence whose message
	// is gone, and the engine would wait for it forever.
	LastPositions(ctx context.Context) ([]events.Position, error)
	// FirstSeq returns the first stream sequence part's stream holds
	// (past 1 once an epoch of its slot was removed).
	FirstSeq(ctx context.Context, part int) (uint64, error)
	// Tail calls fn, on the calling goroutine, with every message of
	// part from stream sequence from in order, then with each one
	// stored later, until ctx ends, fn fails or the read ends, and
	// returns why. A failed read is passed to fn as err and the read
	// goes on. heartbeat is the idle heartbeat of its consumer.
	Tail(ctx context.Context, part int, from uint64, heartbeat time.Duration, fn func(pos events.Position, data []byte, err error) error) error
}

// Config configures an Engine. Log is required by Run and Rebuild; an
// engine without it only folds the events given to Apply (offline tools).
type Config struct {
	Log Log
	// Shards says how many streams the log is spread over (docs/DESIGN.md,
	// "Sharded log"); the engine follows every one. Default one. It is
	// the layout of Log.
	Shards events.Shards
	Logger zerolog.Logger
	// Snapshots, if set, is where the engine loads its state from on
	// start (then catches up from the snapshot's sequence) and writes a
	// snapshot every SnapshotEvery events (default 100,000) or
	// SnapshotInterval (default 5m), whichever comes first.
	Snapshots        SnapshotStore
	SnapshotEvery    uint64
	SnapshotInterval time.Duration
	// AfterSnapshot, if set, is called after every snapshot written, with
	// the positions it covers, by shard (with one shard: the sequence; the
	// node saves the log's chain heads there).
	AfterSnapshot func(ctx context.Context, applied []events.Position)
	// Retain is how many tasks of finished lineages the projections keep
	// for listing (default DefaultRetain; negative keeps all). Older
	// ones are evicted, oldest finished first; the log keeps them.
	Retain int
}

// Engine is the fold loop: it consumes the log in order from its applied
// positions and folds every event into its Views, which it embeds, so an
// Engine answers their queries too. Reads are safe for concurrent use
// with Run.
type Engine struct {
	Views // what the fold writes and every query reads

	cfg Config

	// waiters are WaitFor calls, each woken once its sequence is applied
	// (not on every event: with many writers in flight that would wake
	// them all thousands of times a second).
	waitMu  sync.Mutex
	waiters []waiter

	// owned are the sequences ApplyOwn folded in that the tail has not
	// reached yet: it skips them without decoding. Each says whether its
	// event changed the timer queues, so passing it wakes the alarm again.
	ownMu sync.Mutex
	owned map[events.Position]bool

	// applied is the vector of positions applied, by shard: the last
	// event's of each; wanted, by shard, the highest a caller waited for.
	applied []position
	wanted  []position
	ready   chan struct{} // closed once caughtUp is first set
	kick    chan struct{}
	bad     atomic.Uint64
	missing atomic.Uint64 // sequences the tail skipped: holes in the log

	policy       snapshotPolicy // owned by Run's goroutine
	snapshots    sync.WaitGroup
	snapshotBusy atomic.Bool
}

// New returns an Engine that will read cfg.Log once Run starts.
func New(cfg Config) (*Engine, error) {
	if cfg.Snapshots != nil && cfg.Log == nil {
		return nil, errors.New("projections: Config.Snapshots needs Config.Log")
	}
	if cfg.SnapshotEvery == 0 {
		cfg.SnapshotEvery = 100_000
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = 5 * time.Minute
	}
	if cfg.Retain == 0 {
		cfg.Retain = DefaultRetain
	}
	return &Engine{cfg: cfg, Views: Views{shards: cfg.Shards, v: newViews(cfg.Retain, cfg.Shards), queuedSig: make(map[string]chan struct{})},
		kick: make(chan struct{}, 1), ready: make(chan struct{}), owned: make(map[events.Position]bool),
		applied: make([]position, cfg.Shards.N()), wanted: make([]position, cfg.Shards.N())}, nil
}

// position is an events.Position safe for concurrent use.
type position struct{ v atomic.Uint64 }

func (p *position) Load() events.Position     { return events.Position(p.v.Load()) }
func (p *position) Store(pos events.Position) { p.v.Store(uint64(pos)) }
func (p *position) CompareAndSwap(old, pos events.Position) bool {
	return p.v.CompareAndSwap(uint64(old), uint64(pos))
}

// skipRemoved moves the applied position of every part whose stream
// starts past the next sequence to apply to just before its first one:
// the stream of an epoch slot whose epoch was removed starts after the
// removed events (eventlog.RemoveEpoch), which are not missing.
func (e *Engine) skipRemoved(ctx context.Context) error {
	firsts, err := e.firstSeqs(ctx)
	if err != nil {
		return err
	}
	for i, first := range firsts {
		if seq := e.applied[i].Load().Seq(e.cfg.Shards); first > seq+1 {
			e.applied[i].Store(e.cfg.Shards.Position(i, first-1))
		}
	}
	return nil
}

// firstSeqs returns, by part, the first sequence of its stream (0 or 1
// unless the part's epoch slot had an epoch removed); nil without epochs.
func (e *Engine) firstSeqs(ctx context.Context) ([]uint64, error) {
	if e.cfg.Shards.Slots == 0 {
		return nil, nil
	}
	firsts := make([]uint64, e.cfg.Shards.N())
	for i := range firsts {
		var err error
		if firsts[i], err = e.cfg.Log.FirstSeq(ctx, i); err != nil {
			return nil, err
		}
	}
	return firsts, nil
}

// foldsRemoved returns "" when a snapshot at applied folded every event
// of each removed epoch (eventlog.RemoveEpoch), else why not: its position
// in a part is before the removed events' end, so the events between,
// the ends of that epoch's tasks among them, are in no stream any more
// and the snapshot's tasks would stay as it saw them (open, with their
// timers). A rebuild from the log holds none of them.
func (e *Engine) foldsRemoved(ctx context.Context, applied []events.Position) (string, error) {
	firsts, err := e.firstSeqs(ctx)
	if err != nil {
		return "", err
	}
	for i, first := range firsts[:min(len(firsts), len(applied))] {
		if seq := applied[i].Seq(e.cfg.Shards); first > seq+1 {
			return fmt.Sprintf("part %d is at sequence %d, and its stream starts at %d after an epoch was removed", i, seq, first), nil
		}
	}
	return "", nil
}

// Run consumes the log until ctx ends, then returns nil. It returns
// earlier only if the stream cannot be read.
func (e *Engine) Run(ctx context.Context) error {
	if e.cfg.Log == nil {
		return errors.New("projections: Config.Log is required to Run")
	}
	target, err := e.cfg.Log.LastPositions(ctx)
	if err != nil {
		return fmt.Errorf("projections: %w", err)
	}
	if e.Applied() == 0 && e.cfg.Snapshots != nil {
		e.restoreSnapshot(ctx, target)
	}
	if err := e.skipRemoved(ctx); err != nil {
		return fmt.Errorf("projections: %w", err)
	}
	defer e.snapshots.Wait()
	e.policy = snapshotPolicy{every: e.cfg.SnapshotEvery, interval: e.cfg.SnapshotInterval, lastSeq: e.Applied(), lastAt: time.Now()}
	if e.coversAll(target) {
		e.markCaughtUp()
	}
	for _, pos := range target {
		e.want(pos)
	}
	var tails sync.WaitGroup
	defer tails.Wait()
	t := e.follow(e.nextSeqs(), e.isOwned)
	defer func() { t.stop(&tails) }()
	watch := time.NewTicker(time.Second)
	defer watch.Stop()
	progressAt, ended := time.Now(), false
	var batch []tailMsg
	e.withPositions(e.cfg.Logger.Info(), "targets", target).Uint64("from", e.Applied()+1).Uint64("target", e.cfg.Shards.SumSeqs(target)).Msg("projections catching up")
	for {
		var m tailMsg
		select {
		case <-ctx.Done():
			return nil
		case <-watch.C:
			stalled := e.behind() && time.Since(progressAt) > stallTimeout
			if ended || stalled {
				e.cfg.Logger.Warn().Uint64("applied", e.Applied()).Bool("stalled", stalled).Msg("projections: following the log with a new consumer")
				t.stop(&tails)
				t, progressAt, ended = e.follow(e.nextSeqs(), e.isOwned), time.Now(), false
			}
			continue
		case m = <-t.next:
		}
		// What else the tail has read already is applied with it, under
		// one hold of the views' lock: with a lock round per event, a
		// burst of appends had every writer, claim and release queue
		// behind the tail event by event.
		batch = append(batch[:0], m)
		for len(batch) < tailBatch && m.err == nil && len(t.next) > 0 {
			m = <-t.next
			batch = append(batch, m)
		}
		if m.err != nil {
			batch = batch[:len(batch)-1]
		}
		if len(batch) > 0 {
			progressAt = time.Now()
			if !e.applyTail(batch) {
				// A rebuild swapped the views in after the tail skipped
				// an event ApplyOwn folded in: the fresh views need it,
				// so read it again.
				t.stop(&tails)
				t, ended = e.follow(e.nextSeqs(), e.isOwned), false
				continue
			}
		}
		if m.err != nil {
			if ctx.Err() != nil {
				return nil
			}
			ended = m.ended
			e.cfg.Logger.Warn().Err(m.err).Msg("projections: read")
			continue
		}
		if !e.caughtUp.Load() && e.coversAll(target) {
			e.markCaughtUp()
			e.cfg.Logger.Info().Uint64("applied", e.Applied()).Msg("projections caught up")
		}
		if applied := e.Applied(); e.cfg.Snapshots != nil && e.policy.due(applied, time.Now()) && !e.snapshotBusy.Load() {
			e.policy.lastSeq, e.policy.lastAt = applied, time.Now()
			e.snapshotBusy.Store(true)
			e.snapshots.Add(1)
			go func() {
				defer e.snapshots.Done()
				defer e.snapshotBusy.Store(false)
				if err := e.SaveSnapshot(context.WithoutCancel(ctx)); err != nil {
					e.cfg.Logger.Warn().Err(err).Msg("projection snapshot not written")
				}
			}()
		}
	}
}

func (e *Engine) markCaughtUp() {
	if !e.caughtUp.Swap(true) {
		close(e.ready)
	}
}

// Missing returns how many sequences the engine found missing while it
// followed the log (not counting those before a restored snapshot).
func (e *Engine) Missing() uint64 { return e.missing.Load() }

// Ready is closed once the engine has applied every event the stream held
// when Run started: the projections then hold every timer and task the log
// had, and the alarm may start.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// want records that a caller waits for the event at position pos to be
// applied.
func (e *Engine) want(pos events.Position) {
	shard := pos.Part(e.cfg.Shards)
	for {
		w := e.wanted[shard].Load()
		if pos <= w || e.wanted[shard].CompareAndSwap(w, pos) {
			return
		}
	}
}

// behind reports whether a caller waits for an event not applied yet.
func (e *Engine) behind() bool {
	for i := range e.wanted {
		if e.wanted[i].Load() > e.applied[i].Load() {
			return true
		}
	}
	return false
}

// Covers reports whether the engine has applied the event at position
// pos (and every earlier one of its shard). Safe for concurrent use.
func (e *Engine) Covers(pos events.Position) bool {
	shard := pos.Part(e.cfg.Shards)
	return e.applied[shard].Load() >= pos
}

// coversAll reports whether the engine has applied every position of
// last, by shard.
func (e *Engine) coversAll(last []events.Position) bool {
	for _, pos := range last {
		if !e.Covers(pos) {
			return false
		}
	}
	return true
}

// setApplied moves the applied position of pos's shard to pos.
func (e *Engine) setApplied(pos events.Position) {
	shard := pos.Part(e.cfg.Shards)
	e.applied[shard].Store(pos)
}

// setPositions sets the applied position of every shard from ps, by
// shard: an empty shard's 0 stays in its own place (setApplied would
// route 0 to shard 0).
func (e *Engine) setPositions(ps []events.Position) {
	for i, pos := range ps {
		e.applied[i].Store(pos)
	}
}

// nextSeqs returns, by shard, the stream sequence after the last applied.
func (e *Engine) nextSeqs() []uint64 {
	next := make([]uint64, len(e.applied))
	for i := range e.applied {
		next[i] = e.applied[i].Load().Seq(e.cfg.Shards) + 1
	}
	return next
}

// restoreSnapshot loads the stored snapshot if it is valid; a missing or
// bad one (checksum, format, another number of shards, ahead of a
// stream's last position in last) is logged and ignored, and the engine
// rebuilds from the log.
func (e *Engine) restoreSnapshot(ctx context.Context, last []events.Position) {
	data, ok, err := e.cfg.Snapshots.Load(ctx)
	if err != nil || !ok {
		e.cfg.Logger.Info().Err(err).Msg("no projection snapshot; rebuilding from the log")
		return
	}
	applied, b, err := decodeSnapshot(data, last)
	if err != nil {
		e.cfg.Logger.Warn().Err(err).Msg("projection snapshot ignored; rebuilding from the log")
		return
	}
	why, err := e.foldsRemoved(ctx, applied)
	if err != nil || why != "" {
		e.cfg.Logger.Warn().Err(err).Str("reason", why).Msg("projection snapshot ignored: it predates the end of a removed epoch; rebuilding from the log")
		return
	}
	v := restore(b, e.cfg.Retain, e.cfg.Shards)
	e.mu.Lock()
	e.v = v
	e.setPositions(applied)
	e.mu.Unlock()
	// Logged before the wake, which can make the server ready.
	e.cfg.Logger.Info().Uint64("applied", e.Applied()).Int("tasks", len(b.Tasks)).Msg("projection snapshot loaded")
	e.wake()
}

// SaveSnapshot writes a snapshot of the projections at the applied
// sequence to the configured store.
func (e *Engine) SaveSnapshot(ctx context.Context) error {
	if e.cfg.Snapshots == nil {
		return errors.New("projections: no snapshot store configured")
	}
	// The views' lock stops every write: it is held only to copy the task
	// records, not to build the States (which took 250-400 ms for 100,000
	// tasks, the whole pipeline waiting).
	e.mu.RLock()
	f, applied := e.v.freeze(), e.Positions()
	e.mu.RUnlock()
	b := f.body()
	data, err := encodeSnapshot(applied, b)
	if err != nil {
		return err
	}
	if err := e.cfg.Snapshots.Save(ctx, data); err != nil {
		return err
	}
	e.withPositions(e.cfg.Logger.Info(), "positions", applied).Uint64("applied", e.cfg.Shards.SumSeqs(applied)).Int("tasks", len(b.Tasks)).Int("bytes", len(data)).Msg("projection snapshot written")
	if e.cfg.AfterSnapshot != nil {
		e.cfg.AfterSnapshot(ctx, applied)
	}
	return nil
}

// RebuildTo folds the log up to the positions last (by shard) into an
// engine that is not running (an offline rebuild) and marks it caught up
// there.
func (e *Engine) RebuildTo(ctx context.Context, last []events.Position, progress func(seq, last uint64)) error {
	e.setPositions(last)
	if err := e.Rebuild(ctx, progress); err != nil {
		return err
	}
	e.markCaughtUp()
	return nil
}

// Rebuild folds the whole log into fresh projections side by side with the
// live ones, which keep serving, and swaps them in atomically once they
// have caught up. progress, if set, is called with the sequence reached.
func (e *Engine) Rebuild(ctx context.Context, progress func(seq, last uint64)) error {
	fresh := newViews(e.cfg.Retain, e.cfg.Shards)
	var tails sync.WaitGroup
	defer tails.Wait()
	t := e.follow(nil, nil)
	defer t.stop(&tails)
	reached := make([]events.Position, e.cfg.Shards.N()) // by shard, the position folded
	var seq uint64                                       // events folded
	// behind reports whether fresh lacks an event the live views applied.
	behind := func() bool {
		for i := range reached {
			if reached[i] < e.applied[i].Load() {
				return true
			}
		}
		return false
	}
	// next applies the following event to fresh.
	next := func() error {
		var m tailMsg
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m = <-t.next:
		}
		if m.err != nil {
			return fmt.Errorf("projections: rebuild read: %w", m.err)
		}
		if reached[m.pos.Part(e.cfg.Shards)], seq = m.pos, seq+1; m.bad == nil {
			fresh.apply(m.ev)
		} else {
			fresh.quarantine.add(m.pos, m.bad)
		}
		if progress != nil && seq%50000 == 0 {
			progress(seq, e.Applied())
		}
		return nil
	}
	for behind() {
		if err := next(); err != nil {
			return err
		}
	}
	// Catch up the last few events with the live engine paused, then swap.
	e.mu.Lock()
	defer e.wake() // after the unlock: the swap may move the positions
	defer e.mu.Unlock()
	for behind() {
		if err := next(); err != nil {
			return err
		}
	}
	e.v = fresh
	// On a sharded log the fresh views may have read a shard past the
	// live position while another shard caught up: those events are in
	// them, so the live tail must skip them (it skips covered positions).
	for i, p := range reached {
		if p > e.applied[i].Load() {
			e.applied[i].Store(p)
		}
	}
	// What ApplyOwn folded into the old views beyond the applied
	// sequence the fresh ones get from the tail (which reads again what
	// it skipped and had not handed over yet: passOwned).
	e.ownMu.Lock()
	clear(e.owned)
	e.ownMu.Unlock()
	if progress != nil {
		progress(seq, seq)
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
	e.cfg.Logger.Info().Uint64("applied", e.Applied()).Int("tasks", len(fresh.tasks)).Msg("projections rebuilt and swapped in")
	return nil
}

// Apply folds the event stored at position pos into the projections.
// Events that do not decode are counted and skipped (the verifier
// reports them); the applied position still advances. Offline tools may
// call Apply; Run folds the events its tail decoded.
func (e *Engine) Apply(pos events.Position, data []byte) {
	e.apply(decode(data, pos))
}

// decode decodes the event stored at position pos. A schedule's event also gets
// its Hash, so the schedule's state in the views carries its chain's
// last hash, and a fire decided on it can be appended without reading
// the log (store.ExecuteScheduleOn).
func decode(data []byte, pos events.Position) (events.Event, error) {
	ev, err := events.DecodeAt(data, pos)
	if err == nil && events.IsSchedule(ev.Type()) {
		ev.Hash = events.HashOf(data)
	}
	return ev, err
}

// apply folds ev, which is at ev.Seq; bad says why it did not decode. An
// event ApplyOwn folded in already changes nothing again (views.apply
// skips what a task record holds).
func (e *Engine) apply(ev events.Event, bad error) {
	e.mu.Lock()
	kick, customer, queue := e.fold(ev, bad)
	e.mu.Unlock()
	e.after(true, kick)
	if customer != "" {
		e.signalQueued(customer, queue)
	}
}

// fold applies ev (or counts it, undecodable) and moves the applied
// position to it, with e.mu held. It reports whether the timer queues
// changed and the customer and queue of a task it made queued.
func (e *Engine) fold(ev events.Event, bad error) (kick bool, customer, queue string) {
	if bad != nil {
		e.bad.Add(1)
		e.v.quarantine.add(ev.Seq, bad)
		e.cfg.Logger.Error().Err(bad).Uint64("seq", uint64(ev.Seq)).Msg("projections: undecodable event skipped (quarantined)")
	} else {
		kick = e.v.apply(ev)
	}
	customer, queue = e.queuedBy(ev)
	e.setApplied(ev.Seq) // under mu: a snapshot pairs views and positions
	e.ownMu.Lock()
	delete(e.owned, ev.Seq) // folded in by ApplyOwn after the tail looked
	e.ownMu.Unlock()
	return kick, customer, queue
}

// applyTail applies what the tail read, in order, under one hold of
// e.mu, then wakes what the events concern once. An event ApplyOwn
// folded in moves the applied position over it without decoding, and if
// it changed the timer queues it wakes the alarm again: the alarm skips
// an item until Applied reaches the sequence its action appended, and
// ApplyOwn's wake came before that. applyTail reports false, and applies
// nothing from there on, when the views no longer hold such an event (a
// rebuild swapped in fresh views since the tail looked): the tail must
// read again from the applied position.
func (e *Engine) applyTail(batch []tailMsg) bool {
	type signal struct{ customer, queue string }
	var signals []signal
	kick, applied, ok := false, false, true
	e.mu.Lock()
	for _, m := range batch {
		if e.Covers(m.pos) {
			continue
		}
		shard, seq := e.cfg.Shards.Split(m.pos)
		from := e.applied[shard].Load().Seq(e.cfg.Shards) + 1
		if m.owned {
			e.ownMu.Lock()
			changed, held := e.owned[m.pos]
			delete(e.owned, m.pos)
			e.ownMu.Unlock()
			if !held {
				ok = false
				break
			}
			e.setApplied(m.pos)
			kick = changed || kick
		}
		if seq > from {
			// The event stream denies deletes: a skipped sequence is a
			// message the server dropped or someone removed.
			e.missing.Add(seq - from)
			e.cfg.Logger.Warn().Int("shard", shard).Uint64("from", from).Uint64("to", seq-1).Msg("projections: sequences missing from the log; run taskledger replay verify")
		}
		applied = true
		if !m.owned {
			changed, customer, queue := e.fold(m.ev, m.bad)
			kick = changed || kick
			if customer != "" {
				signals = append(signals, signal{customer, queue})
			}
		}
	}
	e.mu.Unlock()
	e.after(applied, kick)
	for _, sg := range signals {
		e.signalQueued(sg.customer, sg.queue)
	}
	return ok
}

// queuedBy returns the customer and queue of the task ev made queued, if
// it is a ReadyPublished of a task the views hold.
func (e *Engine) queuedBy(ev events.Event) (customer, queue string) {
	if _, ok := ev.Data.(events.ReadyPublished); ok {
		if t := e.v.tasks[ev.TaskID]; t != nil {
			customer, queue = t.customer, t.queue
		}
	}
	return customer, queue
}

// after wakes what applied events concern: WaitFor callers (applied
// says events were applied) and, when the timer queues changed (kick),
// the alarm.
func (e *Engine) after(applied, kick bool) {
	if applied {
		e.wake()
	}
	if kick {
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
}

// isOwned reports whether ApplyOwn folded in the event at position pos
// before the tail reached it.
func (e *Engine) isOwned(pos events.Position) bool {
	e.ownMu.Lock()
	defer e.ownMu.Unlock()
	_, ok := e.owned[pos]
	return ok
}

// ApplyOwn folds into the projections, ahead of the tail, events the
// caller has just appended (in order, each with the Seq and Hash its ack
// gave), so the caller's next read sees them without waiting for the
// tail's round trip, and reports whether all of them are in the views
// now. An event is folded in only when that cannot change what the log's
// order gives: its task is in the views exactly at the event before it
// (or, for a root task's TaskScheduled, not there yet), and the event
// neither creates a child, ends a task nor appends mail (lineage order,
// reports and retention follow the log's order across tasks). Others
// wait for the tail, and so does every event after one that waits:
// ApplyOwn reports false, and the caller waits with WaitFor. The tail
// skips what ApplyOwn folded in, without decoding it; Applied still moves
// only with the tail. Safe for concurrent use with Run.
func (e *Engine) ApplyOwn(evs []events.Event) bool {
	all, kick := true, false
	var customer, queue string
	e.mu.Lock()
	for _, ev := range evs {
		if e.Covers(ev.Seq) || e.v.holds(ev) {
			continue // the tail was first, or a call before this one
		}
		if !e.v.ownable(ev) {
			all = false
			break
		}
		ev.At = unnanos(nanos(ev.At)) // as the tail decodes it: no monotonic reading, local
		changed := e.v.apply(ev)
		kick = changed || kick
		if c, q := e.queuedBy(ev); c != "" {
			customer, queue = c, q
		}
		e.ownMu.Lock()
		e.owned[ev.Seq] = changed
		e.ownMu.Unlock()
	}
	e.mu.Unlock()
	e.after(false, kick)
	if customer != "" {
		e.signalQueued(customer, queue)
	}
	return all
}

// Applied returns the stream sequence of the last event applied; with
// several shards, the sum of every shard's (a count that grows with each
// event applied, for statistics: wait with WaitFor or Covers).
func (e *Engine) Applied() uint64 {
	var n uint64
	for i := range e.applied {
		n += e.applied[i].Load().Seq(e.cfg.Shards)
	}
	return n
}

// withPositions adds positions to a log line under key when the log has
// several shards (with one, the line's sequences say it all).
func (e *Engine) withPositions(ev *zerolog.Event, key string, positions []events.Position) *zerolog.Event {
	if e.cfg.Shards.N() > 1 {
		ps := make([]uint64, len(positions))
		for i, pos := range positions {
			ps[i] = uint64(pos)
		}
		ev = ev.Uints64(key, ps)
	}
	return ev
}

// Positions returns the applied position of every shard, by shard.
func (e *Engine) Positions() []events.Position {
	out := make([]events.Position, len(e.applied))
	for i := range e.applied {
		out[i] = e.applied[i].Load()
	}
	return out
}

// CaughtUp reports whether the engine has applied everything the stream
// held when Run started.
func (e *Engine) CaughtUp() bool { return e.caughtUp.Load() }

// Undecodable counts events skipped because they did not decode.
func (e *Engine) Undecodable() uint64 { return e.bad.Load() }

// TimersChanged receives a value after an applied event put a task into a
// timer queue or moved its due time, freed a slot of a concurrency key, or
// ended a task waiting for one: whatever may give the alarm work sooner
// than it planned. One value may stand for several.
func (e *Engine) TimersChanged() <-chan struct{} { return e.kick }

type waiter struct {
	pos events.Position
	ch  chan struct{}
}

// wake wakes the waiters whose position the engine has applied.
func (e *Engine) wake() {
	e.waitMu.Lock()
	defer e.waitMu.Unlock()
	kept := e.waiters[:0]
	for _, w := range e.waiters {
		if e.Covers(w.pos) {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	clear(e.waiters[len(kept):])
	e.waiters = kept
}

// WaitFor blocks until the event at position pos has been applied (its
// shard's component of the applied vector has reached it) or ctx ends.
func (e *Engine) WaitFor(ctx context.Context, pos events.Position) error {
	if e.Covers(pos) {
		return nil
	}
	e.want(pos)
	ch := make(chan struct{})
	e.waitMu.Lock()
	if e.Covers(pos) {
		e.waitMu.Unlock()
		return nil
	}
	e.waiters = append(e.waiters, waiter{pos: pos, ch: ch})
	e.waitMu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		e.waitMu.Lock()
		for i, w := range e.waiters {
			if w.ch == ch {
				e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
				break
			}
		}
		e.waitMu.Unlock()
		return fmt.Errorf("projections: waiting for seq %d (applied %v): %w", pos, e.Positions(), ctx.Err())
	}
}
