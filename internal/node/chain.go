package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/replay"
)

// The keyed chain at start (events/doc.go, "Keyed chain"): find or make
// the key file, and check the events the saved chain heads do not cover.

// ErrChainKeyMissing is returned by New when the log holds keyed events
// and the chain key file does not exist: signing with a new key would
// leave every earlier event unverifiable, so the process refuses to
// start until the file is restored (or --chain-key-file names it).
var ErrChainKeyMissing = errors.New("node: the log is keyed and its chain key file is missing")

// chainCheckTimeout bounds the keyed chain's check at shutdown, before
// the chain head is saved (without it finished, the head is not).
const chainCheckTimeout = 30 * time.Second

// maxChainReports is how many chain violations the start-up check logs
// one by one; the rest are counted.
const maxChainReports = 10

// openChain returns the key file at path and its keyring, after
// agreeing with the log on the keys (eventlog.AgreeChainKeys: the log's
// metadata records each key's fingerprint), and whether it created the
// file. A missing file is created when the log has no keyed event and
// records no key: a new log is keyed from its first event, an older one
// from the sequence each stream takes next (its earlier unkeyed events
// verify by their hash links, as before). Otherwise it returns an error
// wrapping ErrChainKeyMissing; a file whose key of some id is not the
// log's key of that id, one wrapping eventlog.ErrChainKeyMismatch.
func openChain(ctx context.Context, log eventlog.Log, path string, now time.Time, logger zerolog.Logger) (chainkey.File, *events.Keyring, bool, error) {
	js := log.JS
	f, err := chainkey.Load(path)
	created := false
	switch {
	case errors.Is(err, chainkey.ErrNoFile):
		if f, err = createChain(ctx, log, path, now); err != nil {
			return f, nil, false, err
		}
		created = true
	case err != nil:
		return f, nil, false, err
	}
	keys, err := f.Keyring()
	if err != nil {
		return f, nil, false, err
	}
	missing, err := eventlog.AgreeChainKeys(ctx, js, log.Stream, keys.Fingerprints())
	if err != nil {
		if created {
			os.Remove(path) // never used: another process keyed the log first
		}
		if errors.Is(err, eventlog.ErrChainKeyMismatch) {
			return f, nil, false, fmt.Errorf("%w; %s is not this log's key file (another log's, or another process made its own at the same first start): use the log's (docs/operations.md, \"Chain key\")", err, path)
		}
		return f, nil, false, err
	}
	if len(missing) > 0 {
		logger.Warn().Str("file", path).Interface("keys", missing).Msg("the log has chain keys this key file does not hold (rotated elsewhere): copy the log's key file here, or their events report unknown_key")
	}
	return f, keys, created, nil
}

// createChain creates the key file at path for a log that has no keyed
// event and records no chain key; otherwise it returns an error wrapping
// ErrChainKeyMissing.
func createChain(ctx context.Context, log eventlog.Log, path string, now time.Time) (chainkey.File, error) {
	missing := func(what string) error {
		return fmt.Errorf("%w: %s, and %s does not exist: restore the key file from its backup, or name it with --chain-key-file (docs/operations.md, \"Chain key\")", ErrChainKeyMissing, what, path)
	}
	recorded, err := eventlog.ChainKeys(ctx, log.JS, log.Stream)
	if err != nil {
		return chainkey.File{}, err
	}
	if len(recorded) > 0 {
		ids := slices.Sorted(maps.Keys(recorded))
		return chainkey.File{}, missing(fmt.Sprintf("the log records chain keys %v", ids))
	}
	last, err := log.LastPositions(ctx)
	if err != nil {
		return chainkey.File{}, err
	}
	keyedFrom := map[string]uint64{}
	for i, pos := range last {
		seq := pos.Seq(log.Shards)
		if seq == 0 {
			continue
		}
		name := log.Shards.Stream(log.Stream, i)
		first, err := log.FirstSeq(ctx, i)
		if err != nil {
			return chainkey.File{}, err
		}
		if seq >= first { // else a removed epoch's stream, empty since
			h, err := log.Message(ctx, pos)
			if err != nil {
				return chainkey.File{}, err
			}
			if ev, err := events.Decode(h); err == nil && ev.Key != 0 {
				return chainkey.File{}, missing(fmt.Sprintf("the last event of stream %s (sequence %d) is signed with chain key %d", name, seq, ev.Key))
			}
		}
		keyedFrom[name] = seq + 1
	}
	return chainkey.Create(path, keyedFrom, now)
}

// chainCheck is the keyed chain's check of a running node: what it has
// checked so far and what it found. Every event is checked once: those
// after the saved chain heads at start (New), the others before a head
// moves past them (after each projection snapshot, and at shutdown). Safe
// for concurrent use.
type chainCheck struct {
	mu    sync.Mutex
	next  []uint64 // by part, the first stream sequence not checked yet
	rule  *replay.Chain
	bad   int              // events found so far
	first replay.Violation // the first found
	// saved keeps what was found (chainObject) across restarts: a head
	// saved past a forged event would otherwise hide it from the next
	// start's check. Nil without snapshots (each start checks all).
	saved projections.SnapshotStore
	// found is the warning of what was found, nil: nothing; count the
	// number of events found (bad, readable without mu).
	found atomic.Pointer[string]
	count atomic.Int64
}

// errChainScanned ends a scan at its last position.
var errChainScanned = errors.New("node: chain scanned")

// check checks every event of every part from c.next up to until (by
// part; nil: each stream's end now), records what it finds and moves
// c.next past it.
func (c *chainCheck) check(ctx context.Context, log eventlog.Log, logger zerolog.Logger, until []events.Position) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var to map[int]uint64 // by part, the last sequence to check; nil: every part to its end
	if until != nil {
		to = map[int]uint64{}
		for _, pos := range until {
			if pos > 0 {
				to[pos.Part(log.Shards)] = pos.Seq(log.Shards)
			}
		}
	}
	before := c.bad
	for i := range c.next {
		last, ok := to[i]
		if to != nil && (!ok || last < c.next[i]) {
			continue
		}
		o := eventlog.ReadOptions{Shards: []int{i}, From: log.Shards.Position(i, c.next[i])}
		err := log.Read(ctx, o, func(m eventlog.Message) error {
			part, seq := log.Shards.Split(m.Pos)
			if to != nil && seq > last {
				return errChainScanned
			}
			c.next[part] = seq + 1
			ev, err := events.Decode(m.Data)
			if err != nil {
				return nil // not the chain's to say: replay verify and the projections report it
			}
			kind, detail := c.rule.Check(part, seq, ev, m.Data)
			if kind == "" {
				return nil
			}
			if c.bad++; c.bad == 1 {
				c.first = replay.Violation{Seq: m.Pos, TaskID: ev.TaskID, Kind: kind, Detail: detail}
			}
			if c.bad <= maxChainReports {
				logger.Error().Uint64("seq", uint64(m.Pos)).Str("task", ev.TaskID).Str("kind", kind).Msg(detail)
			}
			return nil
		})
		if err != nil && !errors.Is(err, errChainScanned) {
			return err
		}
	}
	if c.bad == before {
		return nil
	}
	logger.Error().Int("events", c.bad).Uint64("seq", uint64(c.first.Seq)).Msg(c.warn())
	if c.saved != nil {
		b, err := json.Marshal(chainFindings{Events: c.bad, First: c.first})
		if err == nil {
			err = c.saved.Save(ctx, b)
		}
		if err != nil {
			return fmt.Errorf("node: save the keyed chain's findings: %w", err)
		}
	}
	return nil
}

// chainObject is the object of the snapshot bucket that keeps what the
// keyed chain's checks found (chainFindings as JSON).
const chainObject = "chainforged"

// chainFindings is what the keyed chain's checks found so far.
type chainFindings struct {
	Events int              `json:"events"`
	First  replay.Violation `json:"first"`
}

// warn sets and returns the warning of what was found; c.mu is held.
func (c *chainCheck) warn() string {
	c.count.Store(int64(c.bad))
	warning := fmt.Sprintf("%d events of the log are not vouched for by its chain key (the first at sequence %d, task %s: %s): forged or changed; run taskledger replay verify", c.bad, c.first.Seq, c.first.TaskID, c.first.Kind)
	c.found.Store(&warning)
	return warning
}

// load takes up what earlier checks found and saved.
func (c *chainCheck) load(ctx context.Context) error {
	if c.saved == nil {
		return nil
	}
	b, ok, err := c.saved.Load(ctx)
	if err != nil || !ok {
		return err
	}
	var f chainFindings
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("node: the keyed chain's findings: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.Events > 0 {
		c.bad, c.first = f.Events, f.First
		c.warn()
	}
	return nil
}

// warning returns what the checks found, or "".
func (c *chainCheck) warning() string {
	if c == nil {
		return ""
	}
	if w := c.found.Load(); w != nil {
		return *w
	}
	return ""
}

// newChainCheck returns the check of log under f and keys, starting
// after the saved chain heads heads (a keyed node checks the events up to
// a head before it saves it: checkChainBefore), or at a stream's start
// where none was saved, and never before a stream's first keyed sequence
// (the unkeyed events before it are the hash links' to vouch for, as
// before keying).
func newChainCheck(log eventlog.Log, f chainkey.File, keys *events.Keyring, heads []eventlog.Head, saved projections.SnapshotStore) *chainCheck {
	next := make([]uint64, log.Shards.N())
	for _, h := range heads {
		part, seq := log.Shards.Split(h.Pos)
		next[part] = seq + 1
	}
	parts := f.Parts(log.Stream, log.Shards)
	for part, keyedFrom := range parts {
		next[part] = max(next[part], keyedFrom)
	}
	return &chainCheck{next: next, rule: replay.NewChain(keys, parts), saved: saved}
}

// checkChainAtStart takes up what earlier checks found and checks the
// events after the saved chain heads; what it finds (an event not keyed
// where it must be, a MAC that does not verify) is logged and becomes the
// warning LogWarning adds. It warns rather than refuses: one forged
// message must not keep the scheduler down (the projections apply what
// they read; replay verify names every violation).
func (n *Node) checkChainAtStart(ctx context.Context) {
	heads, err := LoadHeads(ctx, n.Store.JetStream(), n.cfg.Stream)
	if err != nil { // then every keyed event is checked
		n.cfg.Logger.Warn().Err(err).Msg("chain heads not read: the keyed chain's check reads the whole log")
		heads = nil
	}
	n.chain = newChainCheck(n.Store.Log(), n.chainFile, n.chainKeys, heads, n.chainSaved)
	if err := n.chain.load(ctx); err != nil {
		n.cfg.Logger.Warn().Err(err).Msg("keyed chain's earlier findings not read")
	}
	if err := n.chain.check(ctx, n.Store.Log(), n.cfg.Logger, nil); err != nil {
		n.cfg.Logger.Warn().Err(err).Msg("keyed chain not checked")
	}
}

// checkChainBefore checks the events up to the positions a chain head is
// about to be saved at (by part), so that no event ends up behind a head
// unchecked. An error (the log could not be read) means the head must
// not be saved: the one before it stays, and a later check starts there.
func (n *Node) checkChainBefore(ctx context.Context, positions []events.Position) error {
	if n.chain == nil {
		return nil
	}
	if err := n.chain.check(ctx, n.Store.Log(), n.cfg.Logger, positions); err != nil {
		return fmt.Errorf("keyed chain not checked: %w", err)
	}
	return nil
}

// registerChainMetrics reports what the keyed chain's checks found.
func registerChainMetrics(reg prometheus.Registerer, c *chainCheck) {
	if c == nil {
		return
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "taskledger_chain_unverified_events",
		Help: "Events of the log its chain key does not vouch for (forged or changed), found by this process's checks or kept from earlier ones; replay verify names them.",
	}, func() float64 { return float64(c.count.Load()) }))
}
