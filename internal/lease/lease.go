package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// The defaults and bounds of Config.
const (
	DefaultPartitions = 16
	MaxPartitions     = 1024
	DefaultTTL        = 5 * time.Second
)

// Bucket is the key-value bucket of a stream's leases.
func Bucket(stream string) string { return stream + "_LEASES" }

// Partition returns the partition of key (a task id, or a schedule's
// projections.ScheduleKey) among n: FNV-1a of the key, mod n. Every
// process, and every version, must compute the same.
func Partition(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// Config configures Leases. JS, Bucket and Instance are required; zero
// values elsewhere mean the defaults.
type Config struct {
	JS     jetstream.JetStream
	Bucket string // e.g. Bucket(stream)
	// Partitions is how many partitions the timer work is split into;
	// default DefaultPartitions, at most MaxPartitions. Every process of
	// a bucket must agree: Open refuses a count the bucket does not hold.
	Partitions int
	// TTL is how long a lease lives on the server after it was last
	// written; default DefaultTTL. The bucket's TTL, set by the process
	// that created it, wins over this one (Open logs when they differ).
	TTL      time.Duration
	Replicas int // of the bucket; default 1
	// Instance names this process in the bucket: unique among the
	// processes that run at once. A key-value key's characters only
	// (letters, digits, '-', '_', '=').
	Instance string
	// Name is shown beside Instance in the bucket (the node's actor name).
	Name   string
	Logger zerolog.Logger
}

// Leases holds this process's leases. Run takes and renews them; Owns and
// Owned say which partitions it holds now. Its methods are safe for
// concurrent use.
type Leases struct {
	cfg    Config
	kv     jetstream.KeyValue
	ttl    time.Duration // the bucket's
	margin time.Duration // a lease is given up this long before it could expire
	// until is when each partition's lease stops being this process's
	// (on the monotonic clock; zero: not held). Run replaces it whole.
	until   atomic.Pointer[[]time.Time]
	changed chan struct{}

	revs []uint64 // the revision of each lease held; Run's goroutine only
}

// partitionsMeta is the bucket metadata that records the partition count.
const partitionsMeta = "taskledger_partitions"

// member is the value of a process's member key, for an operator
// reading the bucket.
type member struct {
	Name string `json:"name,omitempty"`
}

// Open opens (creating if needed) the bucket of cfg and returns Leases
// that hold nothing yet. It refuses a bucket made for another partition
// count.
func Open(ctx context.Context, cfg Config) (*Leases, error) {
	switch {
	case cfg.JS == nil:
		return nil, errors.New("lease: Config.JS is required")
	case cfg.Bucket == "":
		return nil, errors.New("lease: Config.Bucket is required")
	case cfg.Instance == "" || strings.ContainsFunc(cfg.Instance, badKeyRune):
		return nil, fmt.Errorf("lease: Config.Instance %q: want letters, digits, '-', '_' or '='", cfg.Instance)
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.Partitions < 0 || cfg.Partitions > MaxPartitions {
		return nil, fmt.Errorf("lease: %d partitions: want 1 to %d", cfg.Partitions, MaxPartitions)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	kv, ttl, err := openBucket(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if ttl != cfg.TTL {
		cfg.Logger.Warn().Dur("bucket", ttl).Dur("configured", cfg.TTL).Str("bucket", cfg.Bucket).
			Msg("the lease bucket's TTL differs from this process's; the bucket's holds")
	}
	l := &Leases{cfg: cfg, kv: kv, ttl: ttl, margin: ttl / 5, changed: make(chan struct{}, 1), revs: make([]uint64, cfg.Partitions)}
	none := make([]time.Time, cfg.Partitions)
	l.until.Store(&none)
	return l, nil
}

// openBucket opens the bucket of cfg, creating it if it is missing, and
// returns its TTL; it refuses a bucket of another partition count.
func openBucket(ctx context.Context, cfg Config) (jetstream.KeyValue, time.Duration, error) {
	// Memory storage: a lease outlives no server restart, and a restarted
	// server has no stale owners to wait for.
	kv, err := cfg.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: cfg.Bucket, Description: "taskledger timer partition leases", History: 1, TTL: cfg.TTL,
		Storage: jetstream.MemoryStorage, Replicas: cfg.Replicas,
		Metadata: map[string]string{partitionsMeta: strconv.Itoa(cfg.Partitions)},
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = cfg.JS.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("lease: bucket %s: %w", cfg.Bucket, err)
	}
	status, err := kv.Status(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("lease: bucket %s: %w", cfg.Bucket, err)
	}
	var meta map[string]string
	if s, ok := status.(*jetstream.KeyValueBucketStatus); ok {
		meta = s.StreamInfo().Config.Metadata
	}
	if p := meta[partitionsMeta]; p != strconv.Itoa(cfg.Partitions) {
		return nil, 0, fmt.Errorf("lease: bucket %s splits the timers into %q partitions, not %d: start every process with the same count (to change it, stop them all and delete the bucket)",
			cfg.Bucket, p, cfg.Partitions)
	}
	if status.TTL() <= 0 {
		return nil, 0, fmt.Errorf("lease: bucket %s has no TTL", cfg.Bucket)
	}
	return kv, status.TTL(), nil
}

func badKeyRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '=')
}

// Partitions returns the partition count.
func (l *Leases) Partitions() int { return l.cfg.Partitions }

// Instance returns the name this process holds its leases under.
func (l *Leases) Instance() string { return l.cfg.Instance }

// TTL returns the leases' TTL (the bucket's).
func (l *Leases) TTL() time.Duration { return l.ttl }

// Owns returns a test of whether this process holds, now, the partition
// of a key (a task id or a schedule key): a snapshot, true only for
// leases that stay valid at least until the call. It holds nothing
// while the NATS connection is down.
func (l *Leases) Owns() func(key string) bool {
	until, now := *l.until.Load(), time.Now()
	if !l.connected() {
		return func(string) bool { return false }
	}
	return func(key string) bool { return now.Before(until[Partition(key, len(until))]) }
}

// Owned returns the partitions this process holds now, in order.
func (l *Leases) Owned() []int {
	out := []int{}
	if !l.connected() {
		return out
	}
	now := time.Now()
	for i, u := range *l.until.Load() {
		if now.Before(u) {
			out = append(out, i)
		}
	}
	return out
}

// Changed is signalled after Run took or gave up a partition, renewed a
// lapsed lease, or found the NATS connection back (or gone).
func (l *Leases) Changed() <-chan struct{} { return l.changed }

func (l *Leases) connected() bool {
	nc := l.cfg.JS.Conn()
	return nc == nil || nc.IsConnected()
}

// Run takes, renews and gives back leases every quarter of the TTL until
// ctx ends, then gives back every lease it holds and returns nil. Failed
// writes are logged and retried the next round; a lease that could not be
// renewed stops being this process's a fifth of the TTL before the server
// could let it expire (counted from when its last renewal was sent).
func (l *Leases) Run(ctx context.Context) error {
	tick := time.NewTicker(l.ttl / 4)
	defer tick.Stop()
	failing, connected := false, l.connected()
	for {
		// Logged when rounds start failing and when they work again,
		// not once a round.
		switch err := l.round(ctx); {
		case err != nil && !failing && ctx.Err() == nil:
			l.cfg.Logger.Warn().Err(err).Str("bucket", l.cfg.Bucket).Msg("lease round failed; leases not renewed lapse (retried every quarter TTL)")
			failing = true
		case err == nil && failing:
			l.cfg.Logger.Info().Str("bucket", l.cfg.Bucket).Ints("owned", l.Owned()).Msg("lease rounds work again")
			failing = false
		}
		// Owns holds nothing while the connection is down: an alarm that
		// slept through it must hear that it is back.
		if c := l.connected(); c != connected {
			connected = c
			l.signal()
		}
		select {
		case <-ctx.Done():
			stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl/4)
			defer cancel()
			l.release(stop)
			return nil
		case <-tick.C:
		}
	}
}

func memberKey(instance string) string { return "m." + instance }
func partitionKey(i int) string        { return "p." + strconv.Itoa(i) }

// round heartbeats this process's member key, renews its leases, gives
// back those beyond its share (ceil(partitions / live members)) and takes
// free ones up to it.
func (l *Leases) round(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.ttl/4)
	defer cancel()
	me, err := json.Marshal(member{Name: l.cfg.Name})
	if err != nil {
		return err
	}
	if _, err := l.kv.Put(ctx, memberKey(l.cfg.Instance), me); err != nil {
		return errors.Join(fmt.Errorf("heartbeat: %w", err), l.reopen(ctx))
	}
	entries, err := l.entries(ctx)
	if err != nil {
		return err
	}
	members := 0
	var free, mine []int
	for k := range entries {
		if strings.HasPrefix(k, "m.") {
			members++
		}
	}
	for i := range l.cfg.Partitions {
		switch e, ok := entries[partitionKey(i)]; {
		case !ok:
			free = append(free, i)
		case string(e.Value()) == l.cfg.Instance:
			mine = append(mine, i)
		}
	}
	share := (l.cfg.Partitions + members - 1) / max(members, 1)
	until := slices.Clone(*l.until.Load())
	held := func(i int, sent time.Time, rev uint64) {
		until[i], l.revs[i] = sent.Add(l.ttl-l.margin), rev
	}
	lost := func(i int) { until[i], l.revs[i] = time.Time{}, 0 }
	// The bucket is the truth: a partition it does not show as this
	// process's is not (it expired, or was taken).
	for i := range until {
		if !slices.Contains(mine, i) {
			lost(i)
		}
	}
	// Those beyond the share are given back, the rest renewed first, by
	// the revision the bucket shows (a lease whose write answer was lost
	// is renewed too).
	var extras []int
	if len(mine) > share {
		mine, extras = mine[:share], mine[share:]
		for _, i := range extras {
			lost(i) // stop acting on them before they are free
		}
	}
	var errs []error
	var mu sync.Mutex // errs; each write sets only its own partition's until and revs
	fail := func(what string, i int, err error) {
		mu.Lock()
		errs = append(errs, fmt.Errorf("%s %s: %w", what, partitionKey(i), err))
		mu.Unlock()
	}
	// The writes of a round go out at once: a round takes one round trip,
	// not one per partition.
	var wg sync.WaitGroup
	for _, i := range mine {
		wg.Go(func() {
			sent := time.Now()
			rev, err := l.kv.Update(ctx, partitionKey(i), []byte(l.cfg.Instance), entries[partitionKey(i)].Revision())
			switch {
			case err == nil:
				held(i, sent, rev)
			case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
				lost(i) // it expired (and may have been taken since)
			default:
				fail("renew", i, err)
			}
		})
	}
	wg.Wait()
	l.publish(slices.Clone(until)) // published slices are never written
	for _, i := range extras {
		wg.Go(func() {
			if err := l.kv.Delete(ctx, partitionKey(i), jetstream.LastRevision(entries[partitionKey(i)].Revision())); err != nil {
				fail("give back", i, err)
			}
		})
	}
	// Take free ones up to the share, from a random one on: processes
	// starting together then seldom race for the same key.
	off := rand.N(len(free) + 1)
	for j := range min(len(free), max(share-len(mine), 0)) {
		i := free[(off+j)%len(free)]
		wg.Go(func() {
			sent := time.Now()
			rev, err := l.kv.Create(ctx, partitionKey(i), []byte(l.cfg.Instance))
			switch {
			case err == nil:
				held(i, sent, rev)
			case errors.Is(err, jetstream.ErrKeyExists): // another process took it first
			default:
				fail("take", i, err)
			}
		})
	}
	wg.Wait()
	l.publish(until)
	return errors.Join(errs...)
}

// reopen opens the bucket again, creating it if it is gone (a memory
// stream does not outlive a NATS server or JetStream restart, such as
// the embedded server's storage recovery), for the next round.
func (l *Leases) reopen(ctx context.Context) error {
	// Its own time: the failed write may have used up the round's.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl/4)
	defer cancel()
	cfg := l.cfg
	cfg.TTL = l.ttl
	kv, ttl, err := openBucket(ctx, cfg)
	switch {
	case err != nil:
		return err
	case ttl != l.ttl:
		return fmt.Errorf("lease: bucket %s was made again with a TTL of %s, not %s: restart this process", l.cfg.Bucket, ttl, l.ttl)
	}
	l.kv = kv
	return nil
}

// entries reads the bucket's live keys (deleted and expired ones left out).
func (l *Leases) entries(ctx context.Context) (map[string]jetstream.KeyValueEntry, error) {
	w, err := l.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	defer w.Stop()
	out := map[string]jetstream.KeyValueEntry{}
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read leases: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("read leases: watcher closed")
			}
			if e == nil { // the initial values are in
				return out, nil
			}
			out[e.Key()] = e
		}
	}
}

// publish makes until the leases Owns and Owned see, and signals Changed
// when a partition became held or stopped being held (a lapsed lease
// renewed included).
func (l *Leases) publish(until []time.Time) {
	old, now := *l.until.Load(), time.Now()
	l.until.Store(&until)
	for i := range until {
		if now.Before(until[i]) != now.Before(old[i]) {
			l.signal()
			return
		}
	}
}

func (l *Leases) signal() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// release gives back every lease held and the member key: at the
// revisions the bucket shows (a write the end of Run's context cut off
// may have landed), or, if it cannot be read, at those last known.
func (l *Leases) release(ctx context.Context) {
	l.publish(make([]time.Time, l.cfg.Partitions))
	if entries, err := l.entries(ctx); err == nil {
		for i := range l.revs {
			if e, ok := entries[partitionKey(i)]; ok && string(e.Value()) == l.cfg.Instance {
				l.revs[i] = e.Revision()
			}
		}
	}
	for i, rev := range l.revs {
		if rev != 0 {
			l.kv.Delete(ctx, partitionKey(i), jetstream.LastRevision(rev))
			l.revs[i] = 0
		}
	}
	l.kv.Delete(ctx, memberKey(l.cfg.Instance))
}
