// Package node wires one scheduler process: the store, the projection
// engine, the alarm reactor, the service and the HTTP handler, all on one
// NATS connection.
package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/chainkey"
	"github.com/taskledger/taskledger/internal/crashpoint"
	"github.com/taskledger/taskledger/internal/delivery"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/lease"
	"github.com/taskledger/taskledger/internal/natsapi"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/projections"
	"github.com/taskledger/taskledger/reactors"
)

// Config configures a Node. NC is required; zero values elsewhere mean
// the defaults.
type Config struct {
	NC          *nats.Conn
	Stream      string          // default events.DefaultStream
	ReadyStream string          // default Stream + "_READY"
	Subjects    events.Subjects // default tl.evt.>, tl.ready.>
	Replicas    int             // default 1
	// Shards is the number of event streams the log is spread over
	// (store.Config.Shards); default 1.
	Shards int
	// EpochSlots and EpochPeriod give a new log epochs
	// (store.Config.EpochSlots); EpochRetain is how many whole periods
	// after its own an epoch's streams stay unsealed at least (default
	// 1; then they are sealed once its lineages have ended); EpochCheck how often the node advances and
	// seals epochs (default the period ÷ 10, between 100 ms and 1 min).
	EpochSlots  int
	EpochPeriod time.Duration
	EpochRetain int
	EpochCheck  time.Duration
	Name        string // actor name of this node's events; default "scheduler"
	Tokens      map[string]string
	TokenNames  map[string]string // httpapi.ServerConfig.TokenNames
	MaxInFlight int               // API requests served at once; default 1024, -1 no limit
	// Streams bounds the live event streams (httpapi.StreamLimits).
	Streams   httpapi.StreamLimits
	Admission scheduler.Admission
	Limits    scheduler.Limits // per-customer polls and queues, lineage bounds, queue expiry
	Alarm     reactors.AlarmConfig
	// ReadyJSON publishes ready notifications as JSON, for NATS consumers
	// that read only JSON; default msgpack (delivery.Publisher.JSON).
	ReadyJSON bool
	Logger    zerolog.Logger
	Registry  *prometheus.Registry // default a new one with runtime and projection metrics
	Now       func() time.Time
	// NoSnapshots turns projection snapshots off: every start rebuilds
	// the projections from the log.
	NoSnapshots      bool
	SnapshotEvery    uint64        // default 100,000 events
	SnapshotInterval time.Duration // default 5m
	// Retain is how many tasks of finished lineages the projections keep
	// for listing; default projections.DefaultRetain, negative all.
	Retain int
	// MaxEventBytes, if above 0, caps the event stream's message size
	// below the NATS server's max payload (store.Config.MaxEventBytes).
	MaxEventBytes int32
	// HTTP bounds the API server's connections; BodyTimeout its request
	// bodies (httpapi.DefaultBodyTimeout, -1 none).
	HTTP          httpapi.Limits
	BodyTimeout   time.Duration
	MaxBodyMemory int64 // bytes of request bodies held at once; httpapi.DefaultMaxBodyMemory, -1 none
	// Middleware, if set, wraps the API handler (Handler, and what Server
	// serves): request logging, say, or a test's contract checks.
	Middleware func(http.Handler) http.Handler
	// LogRepeatInterval is how often a repeated error is summarized in
	// the log instead of logged again; default ratelog.DefaultInterval.
	LogRepeatInterval time.Duration
	// WriteTimeout bounds one append (store.Config.WriteTimeout); default
	// 5s.
	WriteTimeout time.Duration
	// StorageRetry is how often the node checks StorageError and, while
	// appends or the server's storage fail, calls RecoverStorage and
	// probes the log; default 5s.
	StorageRetry time.Duration
	// StorageError and RecoverStorage, if set, are the embedded server's
	// health check and JetStream restart (broker.Embedded.StorageError,
	// RestartJetStream): nats-server keeps a stream's first write error
	// (a full disk) and refuses its writes until the stream is reopened.
	StorageError   func() error
	RecoverStorage func() error
	// Durable, if set, is the embedded server's group commit
	// (broker.Embedded, serve --durability fsync): the answer to every
	// API request that may write waits for its Sync
	// (httpapi.ServerConfig.Durable), and its work is in the metrics.
	// Nil: answers go out once the log acknowledged the writes.
	Durable Committer
	// Partitions splits the alarm's timer work into this many partitions,
	// each acted on by the process that holds its lease; default
	// lease.DefaultPartitions. Every process of a stream must agree.
	Partitions int
	// LeaseTTL is how long a partition's lease lives unrenewed; default
	// lease.DefaultTTL (the lease bucket's, once it exists, wins).
	LeaseTTL time.Duration
	// NoLeases makes the alarm act on every timer item and hold no lease:
	// correct beside processes that hold leases (OCC decides), only
	// wasteful.
	NoLeases bool
	// NoNATSAPI turns off the API over NATS (internal/natsapi), served by
	// default on NC under Subjects.Root for the executors that connect to
	// the NATS client port.
	NoNATSAPI bool
	// NATSAPIConn, if set, is the connection the API over NATS is served
	// on instead of NC: its own socket, so requests and answers do not
	// queue behind the log's appends and acknowledgements on NC's.
	NATSAPIConn *nats.Conn
	// NATSMaxRequests bounds the API requests over NATS served at once
	// (natsapi.Config.MaxRequests); default natsapi.DefaultMaxRequests.
	NATSMaxRequests int
	// ChainKeyFile, if set, keys the log's chain (events/doc.go, "Keyed
	// chain") with the keys of this file (internal/chainkey): every event
	// this process appends is signed with its newest key, and New checks
	// the events after the saved chain heads against it (a warning on
	// /readyz when one is forged). A missing file is created, with a fresh
	// key, unless the log records a chain key or holds keyed events: then
	// New fails with ErrChainKeyMissing. A file whose key is not the one
	// the log records for its id fails with eventlog.ErrChainKeyMismatch.
	// Empty: events are appended unkeyed (tests).
	ChainKeyFile string
	// AllowEmptyLog lets New start on a log whose streams hold no event
	// though its saved chain head says they held some (a deleted or
	// purged stream: eventlog.ErrLogEmpty), as a log that lost its tail:
	// with a warning in /readyz. Without it New refuses such a log
	// (serve --allow-empty-log).
	AllowEmptyLog bool

	// cursorKey seals customers' stream resume tokens
	// (httpapi.ServerConfig.CursorKey); New reads it from the log.
	cursorKey []byte
}

// Committer makes acknowledged writes durable in shared fsyncs.
type Committer interface {
	Sync(ctx context.Context) error
	CommitStats() broker.CommitStats
}

var _ Committer = (*broker.Embedded)(nil)

// Leases are the alarm's partitions and what the API shows of them.
var (
	_ reactors.Partitions     = (*lease.Leases)(nil)
	_ httpapi.TimerPartitions = (*lease.Leases)(nil)
)

// SnapshotBucket is the object store bucket of a stream's projection
// snapshots.
func SnapshotBucket(stream string) string { return stream + "_SNAPSHOTS" }

// Node is one running scheduler process.
type Node struct {
	cfg     Config
	Store   *store.Store
	Engine  *projections.Engine
	Service *scheduler.Service
	Handler http.Handler
	// Server serves Handler within Config.HTTP; Serve it on a listener.
	Server *httpapi.Server
	// Leases holds this process's timer partitions; nil with NoLeases.
	Leases   *lease.Leases
	alarm    *reactors.Alarm
	natsAPI  *natsapi.Service // nil with NoNATSAPI
	errorLog *ratelog.Limiter
	heads    projections.SnapshotStore // nil without snapshots
	// logWarning says why the log does not hold its saved chain head;
	// set by New, read-only after.
	logWarning string
	// chainFile and chainKeys are the keyed chain's, and chain its check
	// (chain.go); nil keys and chain without ChainKeyFile.
	chainFile  chainkey.File
	chainKeys  *events.Keyring
	chainSaved projections.SnapshotStore // nil without snapshots
	chain      *chainCheck
	serverErr  atomic.Pointer[error] // the last StorageError; nil: none
}

// New opens the streams and builds the parts. Run starts them.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.NC == nil {
		return nil, errors.New("node: Config.NC is required")
	}
	if cfg.Stream == "" {
		cfg.Stream = events.DefaultStream
	}
	if cfg.ReadyStream == "" {
		cfg.ReadyStream = events.ReadyStreamName(cfg.Stream)
	}
	if cfg.Subjects.Root == "" {
		cfg.Subjects = events.DefaultSubjects
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.EpochRetain <= 0 {
		cfg.EpochRetain = 1
	}
	if cfg.StorageRetry <= 0 {
		cfg.StorageRetry = 5 * time.Second
	}
	var eng *projections.Engine
	locate := func(taskID string) (string, string, events.Position, bool) {
		s, ok := eng.Task(taskID)
		return s.CustomerID, s.Spec.RootID, s.FirstSeq, ok
	}
	st, err := store.Open(ctx, cfg.NC, store.Config{
		Stream: cfg.Stream, Subjects: cfg.Subjects, Replicas: cfg.Replicas, Shards: cfg.Shards, Actor: cfg.Name, Now: cfg.Now, Locate: locate,
		EpochSlots: cfg.EpochSlots, EpochPeriod: cfg.EpochPeriod,
		MaxEventBytes: cfg.MaxEventBytes, WriteTimeout: cfg.WriteTimeout,
	})
	if err != nil {
		return nil, err
	}
	logWarning, err := checkHead(ctx, cfg, st)
	if err != nil {
		st.Close()
		return nil, err
	}
	var chain chainkey.File
	var keys *events.Keyring
	if cfg.ChainKeyFile != "" {
		var created bool
		chain, keys, created, err = openChain(ctx, st.Log(), cfg.ChainKeyFile, cfg.Now(), cfg.Logger)
		if err != nil {
			st.Close()
			return nil, err
		}
		st.UseChain(keys)
		if created {
			cfg.Logger.Warn().Str("file", cfg.ChainKeyFile).Msg("created the log's chain key: back it up apart from the log (docs/operations.md, \"Chain key\"); without it the log's events cannot be verified")
		}
	}
	ready, err := delivery.EnsureStream(ctx, st.JetStream(), cfg.ReadyStream, cfg.Subjects, cfg.Replicas)
	if err != nil {
		st.Close()
		return nil, err
	}
	runs, err := store.OpenRuns(ctx, st.JetStream(), store.RunsConfig{
		Stream: cfg.Stream, Replicas: cfg.Replicas, Timeout: cfg.WriteTimeout,
	})
	if err != nil {
		st.Close()
		return nil, err
	}
	if cfg.cursorKey, err = eventlog.CursorKey(ctx, st.JetStream(), cfg.Stream); err != nil {
		st.Close()
		return nil, err
	}
	pcfg := projections.Config{
		Log: st.Log(), Shards: st.Shards(), Logger: cfg.Logger,
		SnapshotEvery: cfg.SnapshotEvery, SnapshotInterval: cfg.SnapshotInterval, Retain: cfg.Retain,
	}
	var heads projections.SnapshotStore
	var self *Node // set once built, before anything runs
	var chainSaved projections.SnapshotStore
	if !cfg.NoSnapshots {
		snaps, err := projections.OpenObjectSnapshots(ctx, st.JetStream(), SnapshotBucket(cfg.Stream), "projections", cfg.Replicas)
		if err == nil {
			heads, err = projections.OpenObjectSnapshots(ctx, st.JetStream(), SnapshotBucket(cfg.Stream), headObject, cfg.Replicas)
		}
		if err == nil && keys != nil {
			chainSaved, err = projections.OpenObjectSnapshots(ctx, st.JetStream(), SnapshotBucket(cfg.Stream), chainObject, cfg.Replicas)
		}
		if err != nil {
			st.Close()
			return nil, err
		}
		pcfg.Snapshots = snaps
		pcfg.AfterSnapshot = func(ctx context.Context, applied []events.Position) {
			if self != nil {
				if err := self.checkChainBefore(ctx, applied); err != nil {
					cfg.Logger.Warn().Err(err).Msg("chain head not saved")
					return
				}
			}
			if err := SaveHead(ctx, st.Log(), heads, applied); err != nil {
				cfg.Logger.Warn().Err(err).Msg("chain head not saved")
			}
		}
	}
	var leases *lease.Leases
	if !cfg.NoLeases {
		// A fresh instance per start: a restarted process never takes
		// the leases of the one before it for its own.
		leases, err = lease.Open(ctx, lease.Config{
			JS: st.JetStream(), Bucket: lease.Bucket(cfg.Stream), Partitions: cfg.Partitions, TTL: cfg.LeaseTTL,
			Replicas: cfg.Replicas, Instance: events.NewID(), Name: cfg.Name, Logger: cfg.Logger,
		})
		if err != nil {
			st.Close()
			return nil, err
		}
	}
	n, err := build(cfg, st, runs, pcfg, ready, leases)
	if err != nil {
		st.Close()
		return nil, err
	}
	eng, n.heads, n.logWarning = n.Engine, heads, logWarning
	if keys != nil {
		n.chainFile, n.chainKeys, n.chainSaved = chain, keys, chainSaved
		n.checkChainAtStart(ctx)
		registerChainMetrics(n.cfg.Registry, n.chain)
	}
	self = n
	return n, nil
}

// The ready publisher sends its notifications through the log's pipeline.
var _ delivery.AckedPublisher = (*eventlog.Pipeline)(nil)

// The engine reads the log through eventlog's one ordered reader.
var _ projections.Log = eventlog.Log{}

// build makes the parts on an open store and ready stream.
func build(cfg Config, st *store.Store, runs *store.Runs, pcfg projections.Config, ready jetstream.Stream, leases *lease.Leases) (*Node, error) {
	eng, err := projections.New(pcfg)
	if err != nil {
		return nil, err
	}
	if cfg.Registry == nil {
		cfg.Registry = newRegistry(eng, st)
	}
	metrics := scheduler.NewMetrics(cfg.Registry)
	publisher := &delivery.Publisher{JS: st.JetStream(), Subjects: cfg.Subjects, Stream: ready, JSON: cfg.ReadyJSON, Acked: st.Pipeline()}
	queues, err := delivery.New(delivery.Config{
		JS: st.JetStream(), Stream: cfg.ReadyStream, Subjects: cfg.Subjects, Idle: cfg.Limits.QueueIdle,
		Publisher: publisher, Log: st, Views: eng, Logger: cfg.Logger, Handed: metrics.Handoffs.Inc,
	})
	if err != nil {
		return nil, err
	}
	svc, err := scheduler.New(scheduler.Config{
		Store: st, Views: eng, Runs: durableRuns(runs, cfg.Durable), Delivery: queues,
		Usage: eng, Admission: cfg.Admission, Logger: cfg.Logger, Metrics: metrics,
		Limits: cfg.Limits, Now: cfg.Now, Renewed: announceRenewals(cfg.NC, cfg.Subjects),
	})
	if err != nil {
		return nil, err
	}
	errorLog := ratelog.New(cfg.Logger, cfg.LogRepeatInterval)
	alarmCfg := cfg.Alarm
	alarmCfg.Store, alarmCfg.Projection, alarmCfg.Repeats, alarmCfg.Schedules = st, eng, errorLog, svc
	alarmCfg.Publisher, alarmCfg.Handoff = publisher, queues.HoldOrHandoff
	alarmCfg.Logger, alarmCfg.Now, alarmCfg.Crash = cfg.Logger, cfg.Now, crashpoint.Hit
	var partitions httpapi.TimerPartitions
	if leases != nil {
		alarmCfg.Partitions, partitions = leases, leases
	}
	if alarmCfg.Observe == nil {
		alarmCfg.Observe = observeAlarm(cfg.Registry)
	}
	lateness := reactors.NewLatenessWindow(cfg.Now)
	observe := alarmCfg.Observe
	alarmCfg.Observe = func(t projections.Timer, late time.Duration, err error) {
		observe(t, late, err)
		lateness.Observe(t, late, err)
	}
	if alarmCfg.Exhausted == nil {
		alarmCfg.Exhausted = countExhausted(cfg.Registry)
	}
	alarm, err := reactors.NewAlarm(alarmCfg)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, Store: st, Engine: eng, Service: svc, Leases: leases, alarm: alarm, errorLog: errorLog}
	httpCfg := httpapi.ServerConfig{
		Service: svc, Ready: eng, Health: n, Lateness: func() api.AlarmStats { return alarmStats(lateness) }, Partitions: partitions, Epochs: epochStats(st, cfg.EpochPeriod), Tokens: cfg.Tokens, TokenNames: cfg.TokenNames, Gatherer: cfg.Registry, Registerer: cfg.Registry, Logger: cfg.Logger, ErrorLog: errorLog,
		MaxInFlight: cfg.MaxInFlight, BodyTimeout: cfg.BodyTimeout, MaxBodyMemory: cfg.MaxBodyMemory, Streams: cfg.Streams, CursorKey: cfg.cursorKey,
	}
	if cfg.Durable != nil {
		httpCfg.Durable = cfg.Durable.Sync
		registerCommitMetrics(cfg.Registry, cfg.Durable)
	}
	n.Handler, err = httpapi.NewHandler(httpCfg)
	if err != nil {
		return nil, err
	}
	if cfg.Middleware != nil {
		n.Handler = cfg.Middleware(n.Handler)
	}
	n.Server = httpapi.NewServer(n.Handler, cfg.HTTP, errorLog)
	if !cfg.NoNATSAPI {
		apiConn := cfg.NATSAPIConn
		if apiConn == nil {
			apiConn = cfg.NC
		}
		n.natsAPI, err = natsapi.New(natsapi.Config{NC: apiConn, Handler: n.Handler, Root: cfg.Subjects.Root, Tokens: cfg.Tokens,
			MaxRequests: cfg.NATSMaxRequests, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
	}
	registerServerMetrics(cfg.Registry, n.Server, svc)
	return n, nil
}

// Metrics serves GET /metrics of the node's registry without a token, for
// a separate listener (serve --metrics-http), to a Host that is an IP
// address, localhost or one of hosts (httpapi.MetricsHandler).
func (n *Node) Metrics(hosts []string) http.Handler {
	return httpapi.MetricsHandler(n.cfg.Registry, hosts)
}

// Run runs the projection engine and, once it has caught up with the log,
// the leases and the alarm, until ctx ends: then the alarm stops first,
// the leases after it (given back), the engine last, and Run returns nil.
// It returns early with an error if a part fails.
func (n *Node) Run(ctx context.Context) error {
	defer n.Store.Close()
	defer n.errorLog.Close() // the pending counts of repeated errors
	engCtx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	defer stopEngine()
	stopRenewals, ferr := followRenewals(n.cfg.NC, n.cfg.Subjects, n.Engine, n.cfg.Now)
	if ferr != nil {
		return fmt.Errorf("heartbeats: %w", ferr)
	}
	defer stopRenewals()
	g, gctx := errgroup.WithContext(ctx)
	defer context.AfterFunc(gctx, n.Service.Close)()
	g.Go(func() error {
		if err := n.Engine.Run(engCtx); engCtx.Err() == nil {
			return fmt.Errorf("projections: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		defer stopEngine()
		// Recovery: the alarm starts once the projections hold every
		// release, pending delivery and deadline the log had at start.
		select {
		case <-gctx.Done():
			return nil
		case <-n.Engine.Ready():
		}
		n.cfg.Logger.Info().Uint64("applied", n.Engine.Applied()).Msg("projections ready; alarm armed")
		// Leases are taken only now: a process still rebuilding its
		// projections must not hold partitions it cannot serve.
		if n.Leases != nil {
			leaseCtx, stopLeases := context.WithCancel(context.WithoutCancel(gctx))
			leasesDone := make(chan struct{})
			go func() { defer close(leasesDone); n.Leases.Run(leaseCtx) }()
			defer func() { stopLeases(); <-leasesDone }()
		}
		return n.alarm.Run(gctx)
	})
	g.Go(func() error { n.watchStorage(gctx); return nil })
	if n.natsAPI != nil {
		g.Go(func() error { return n.natsAPI.Run(gctx) })
	}
	if n.Store.Shards().Slots > 0 {
		g.Go(func() error {
			select { // the projections decide whether an epoch is done
			case <-gctx.Done():
				return nil
			case <-n.Engine.Ready():
			}
			n.runEpochs(gctx)
			return nil
		})
	}
	err := g.Wait()
	n.Service.Close() // waits for the claim dispatchers' pulls
	if err == nil && n.heads != nil {
		if herr := n.saveHeadAtShutdown(context.WithoutCancel(ctx)); herr != nil {
			n.cfg.Logger.Warn().Err(herr).Msg("chain head not saved at shutdown")
		}
	}
	return err
}

// saveHeadAtShutdown saves the chain heads at every part's last event,
// once the keyed chain's check has covered the events up to them.
func (n *Node) saveHeadAtShutdown(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, n.Store.Config().WriteTimeout)
	last, err := n.Store.Log().LastPositions(wctx)
	cancel()
	if err != nil {
		return err
	}
	// The events since the last snapshot: up to SnapshotEvery.
	cctx, cancel := context.WithTimeout(ctx, chainCheckTimeout)
	err = n.checkChainBefore(cctx, last)
	cancel()
	if err != nil {
		return err
	}
	wctx, cancel = context.WithTimeout(ctx, n.Store.Config().WriteTimeout)
	defer cancel()
	return SaveHead(wctx, n.Store.Log(), n.heads, last)
}

// syncedRuns is the runs bucket under the group commit: a saved Run
// revision is on stable storage before Save returns, so before the log
// records it (RunSaved). Without that wait one fsync pass could cover the
// log's RunSaved and not the bucket's record written just before it (the
// pass looks at the files at one instant and syncs them after), and a
// power cut would leave the log naming a revision that is not there;
// TestPowerCut found it.
type syncedRuns struct {
	scheduler.Runs
	sync func(context.Context) error
}

// durableRuns returns runs, made durable on save when c is set.
func durableRuns(runs *store.Runs, c Committer) scheduler.Runs {
	if c == nil {
		return runs
	}
	return syncedRuns{Runs: runs, sync: c.Sync}
}

func (r syncedRuns) Save(ctx context.Context, taskID string, base uint64, run store.Run) (store.Run, error) {
	saved, err := r.Runs.Save(ctx, taskID, base, run)
	if err != nil {
		return saved, err
	}
	if err := r.sync(ctx); err != nil {
		// The record stays an orphan the log never names; a retry of the
		// save replaces it (store.Runs.Save).
		return store.Run{}, fmt.Errorf("%w: run %s revision %d is not on stable storage: %w", store.ErrUnavailable, taskID, saved.Revision, err)
	}
	return saved, nil
}
