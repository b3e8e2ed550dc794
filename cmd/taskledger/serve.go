package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/lease"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/ratelog"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/projections"
)

// natsFlags are the flags that say where the log lives; serve and the
// offline tools share them.
type natsFlags struct {
	data, listen, stream            string
	url, creds, nkey, ca, cert, key string
	tokenFile                       string
	replicas                        int
	syncAlways                      bool
	// clients admits the clients of --nats-listen (serve sets it from
	// --auth-file).
	clients broker.Clients
}

type flagSet interface {
	StringVar(*string, string, string, string)
	IntVar(*int, string, int, string)
	BoolVar(*bool, string, bool, string)
}

// register adds every flag: the embedded server's and the remote ones.
func (f *natsFlags) register(fs flagSet) {
	fs.StringVar(&f.data, "data", "./data", "data directory of the embedded NATS server")
	fs.StringVar(&f.listen, "nats-listen", "", "also expose the embedded NATS server's client port on this host:port (e.g. 127.0.0.1:4222) for the API over NATS: --auth-file's tokens connect there, a customer's confined to its own API requests and inbox, an operator's to every customer's API requests; no token may use the JetStream API or read or write the log; a connection without a token is refused. Needs --auth-file or --nats-token-file")
	fs.StringVar(&f.stream, "stream", events.DefaultStream, "event stream name")
	fs.IntVar(&f.replicas, "replicas", 1, "stream replicas (3 on a cluster)")
	fs.BoolVar(&f.syncAlways, "sync-always", false, "embedded server: fsync every append before acknowledging it (about 9x slower; survives power loss)")
	f.registerRemote(fs)
}

// registerRemote adds the flags that reach an existing NATS server.
func (f *natsFlags) registerRemote(fs flagSet) {
	fs.StringVar(&f.url, "nats-url", "", "connect to this NATS server or cluster instead of embedding one")
	fs.StringVar(&f.creds, "nats-creds", "", "NATS user credentials file (with --nats-url)")
	fs.StringVar(&f.nkey, "nats-nkey", "", "NATS nkey seed file (with --nats-url)")
	fs.StringVar(&f.ca, "nats-ca", "", "TLS root CA file (with --nats-url)")
	fs.StringVar(&f.cert, "nats-cert", "", "TLS client certificate file (with --nats-url)")
	fs.StringVar(&f.key, "nats-key", "", "TLS client key file (with --nats-url)")
	fs.StringVar(&f.tokenFile, "nats-token-file", "", "file holding taskledger's own NATS token (at least 32 characters; the file readable by its owner only): with --nats-listen the embedded server admits it with every right, so other taskledger processes can share its log (--nats-url with the same file); with --nats-url, the token to connect with")
}

// token reads --nats-token-file: "" without one. The token gives every
// right on the log, so a file others may read, or a short token, is
// refused.
func (f *natsFlags) token() (string, error) {
	if f.tokenFile == "" {
		return "", nil
	}
	info, err := os.Stat(f.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--nats-token-file: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("--nats-token-file %s: mode %04o lets others read it; want it readable by its owner only (chmod 600)", f.tokenFile, info.Mode().Perm())
	}
	b, err := os.ReadFile(f.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--nats-token-file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < broker.MinTokenLen || strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("--nats-token-file %s: want one token of at least %d characters without spaces", f.tokenFile, broker.MinTokenLen)
	}
	return token, nil
}

// connect returns a NATS connection, the embedded server (nil with
// --nats-url) and a function that closes both.
func (f *natsFlags) connect(log zerolog.Logger) (*nats.Conn, *broker.Embedded, func(), error) {
	token, err := f.token()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if f.url != "" {
		remote := f.remote()
		remote.Token = token
		nc, err := broker.ConnectRemote(remote)
		if err != nil {
			return nil, nil, nil, err
		}
		log.Info().Str("url", f.url).Msg("connected to NATS")
		return nc, nil, func() { nc.Drain() }, nil
	}
	if f.listen != "" && f.clients.Tokens == nil && token == "" {
		return nil, nil, nil, fmt.Errorf("%w: --nats-listen admits no connection without credentials: give --auth-file (executors and operators over the API) or --nats-token-file (other taskledger processes)", errUsage)
	}
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: f.data, Listen: f.listen, SyncAlways: f.syncAlways, Clients: f.clients, Token: token})
	if err != nil {
		return nil, nil, nil, err
	}
	nc, err := srv.Connect()
	if err != nil {
		srv.Shutdown()
		return nil, nil, nil, err
	}
	log.Info().Str("data", f.data).Str("nats", srv.ClientURL()).Bool("syncAlways", f.syncAlways).Msg("embedded NATS JetStream started")
	return nc, srv, func() {
		nc.Drain()
		for !nc.IsClosed() {
			time.Sleep(5 * time.Millisecond)
		}
		srv.Shutdown()
	}, nil
}

// remote is how --nats-url and its credentials reach the cluster.
func (f *natsFlags) remote() broker.RemoteConfig {
	return broker.RemoteConfig{URL: f.url, CredsFile: f.creds, NKeyFile: f.nkey, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key}
}

// apiConn opens the connection the API over NATS is served on, beside
// nc: on a socket of its own, requests and answers do not queue behind
// the log's appends (node.Config.NATSAPIConn).
func (f *natsFlags) apiConn(embedded *broker.Embedded) (*nats.Conn, error) {
	name := nats.Name("taskledger API over NATS")
	if embedded != nil {
		return embedded.Connect(name)
	}
	remote := f.remote()
	var err error
	if remote.Token, err = f.token(); err != nil {
		return nil, err
	}
	return broker.ConnectRemote(remote, name)
}

func requireLoopback(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	if httpapi.LoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("%s is not a loopback address", hostport)
}

func newLogger(level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Logger{}, fmt.Errorf("%w: --log-level: %w", errUsage, err)
	}
	var w io.Writer = os.Stderr
	if format == "text" || format == "auto" && isatty.IsTerminal(os.Stderr.Fd()) {
		w = zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// retainFlag registers --retain, which serve and replay rebuild share: a
// snapshot keeps what the retention of the engine that wrote it kept.
func retainFlag(fs *flag.FlagSet) *int {
	return fs.Int("retain", projections.DefaultRetain, "tasks of finished lineages kept in memory for listing, oldest finished evicted first (-1: all); the log keeps every task")
}

func checkRetain(n int) error {
	if n == 0 || n < -1 {
		return fmt.Errorf("%w: --retain %d: want a positive number, or -1 to keep every task", errUsage, n)
	}
	return nil
}

func serveCommand(ctx context.Context, args []string, _ io.Writer) error {
	fs := newFlagSet("serve")
	var nf natsFlags
	nf.register(fs)
	httpAddr := fs.String("http", "127.0.0.1:8080", "HTTP API listen address")
	durability := fs.String("durability", durabilityFsync, "embedded server: fsync (an answer that reports a write is sent once the write is on disk, fsyncs shared by concurrent requests) or os (once the log acknowledged it: a power cut loses up to the last sync interval, 2 minutes)")
	authFile := fs.String("auth-file", "", "bearer tokens: lines of 'TOKEN CUSTOMER_ID [NAME]' ('*' for an operator; NAME, the token's actor in history); required to listen beyond loopback")
	insecureAuth := fs.Bool("insecure-auth-file", false, "accept an --auth-file that its group or others may read or change, and tokens shorter than 32 characters (for tests)")
	quotaFile := fs.String("quota-file", "", `admission quotas as JSON: {"default": {"maxActiveRoots": N, "maxRootsPerMinute": N}, "customers": {"ID": {...}}, "checkerUrl": "http://..."}`)
	maxActive := fs.Int("max-active-roots", 0, "default quota: active root tasks per customer (0 = unlimited)")
	maxPerMinute := fs.Int("max-roots-per-minute", 0, "default quota: new root tasks per customer per minute (0 = unlimited)")
	checkerURL := fs.String("usage-checker-url", "", "external usage checker asked about each new root task (fails open)")
	maxInFlight := fs.Int("max-inflight", 1024, "API requests served at once (long polls aside); more answer 503 with Retry-After (-1: no limit)")
	maxStreams := fs.Int("max-streams", httpapi.DefaultMaxStreams, "live event streams (GET /v1/events/stream) open at once; more answer 503 (-1: no limit)")
	maxStreamsPerCustomer := fs.Int("max-streams-per-customer", httpapi.DefaultMaxStreamsPerCustomer, "live event streams one customer token may hold at once; more answer 503 (-1: no limit)")
	var limits httpapi.Limits
	fs.DurationVar(&limits.ReadHeaderTimeout, "read-header-timeout", httpapi.DefaultReadHeaderTimeout, "time a client has to send a request's headers (-1s: no limit)")
	bodyTimeout := fs.Duration("body-timeout", httpapi.DefaultBodyTimeout, "time a client has to send a request's whole body; later is 408 (-1s: no limit)")
	maxBodyMemory := fs.Int64("max-body-memory", httpapi.DefaultMaxBodyMemory, "bytes of request bodies held in memory at once; past it a request is 503 (at least 8 MiB; -1: no limit)")
	fs.DurationVar(&limits.IdleTimeout, "idle-timeout", httpapi.DefaultIdleTimeout, "keep-alive connections idle this long are closed (-1s: never)")
	fs.IntVar(&limits.MaxHeaderBytes, "max-header-bytes", httpapi.DefaultMaxHeaderBytes, "largest request header block; larger is 431")
	fs.IntVar(&limits.MaxConns, "max-conns", httpapi.DefaultMaxConns, "HTTP connections open at once; more are answered 503 and closed (-1: no limit; mind ulimit -n)")
	metricsAddr := fs.String("metrics-http", "", "also serve GET /metrics on this address, without a token (for a scraper on a private network), to a Host that is an IP address, localhost or a name of --metrics-hosts")
	metricsHosts := fs.String("metrics-hosts", "", "with --metrics-http: comma-separated host names (no port) a scraper may send as Host besides IP addresses and localhost; any other is 403 (DNS rebinding)")
	logRepeat := fs.Duration("log-repeat-interval", ratelog.DefaultInterval, "a repeated error is logged once, then as one count per interval")
	writeTimeout := fs.Duration("write-timeout", 5*time.Second, "an append the log does not acknowledge within this (a full disk) answers 503")
	storageRetry := fs.Duration("storage-retry", 5*time.Second, "while appends fail, probe the log (and restart the embedded JetStream) this often")
	retain := retainFlag(fs)
	fs.Duration("run-retention", 0, "deprecated and ignored: a task's Run lives as long as the log that records its revisions")
	maxEventBytes := fs.Int("max-event-bytes", 0, "largest event the log takes, as the event stream's max message size (0: the NATS server's max_payload, 1 MiB by default); a larger one answers 413")
	var lf limitFlags
	lf.register(fs)
	epochSlots := fs.Int("epoch-slots", 0, "give a new log epochs: its tasks live in this many sets of streams (<stream>_s<slot>_<i>), one epoch to a set, sealed once done and removed after archiving (docs/DESIGN.md, \"Epochs\"); fixed when the log is created; 0: none")
	epochPeriod := fs.Duration("epoch-period", 30*24*time.Hour, "with --epoch-slots: how long each epoch takes new lineages")
	retainEpochs := fs.Int("retain-epochs", 1, "with --epoch-slots: periods an epoch stays unsealed after its own ended")
	epochCheck := fs.Duration("epoch-check", 0, "with --epoch-slots: how often to advance and seal epochs (default the period / 10, between 100ms and 1m)")
	shards := fs.Int("shards", 1, "event streams the log is spread over (<stream>_<i> when above 1); fixed when the log is created: a start with another number is refused")
	partitions := fs.Int("timer-partitions", lease.DefaultPartitions, "timer work is split into this many partitions, each acted on by the process holding its lease; every process of a stream must agree")
	leaseTTL := fs.Duration("lease-ttl", lease.DefaultTTL, "a partition lease lives this long unrenewed (renewed every quarter of it): a lost process's timers are taken over within about this")
	noLeases := fs.Bool("no-timer-leases", false, "act on every timer item and hold no partition lease, as every process did before leases (correct beside lease holders, only wasteful: for comparison)")
	allowEmptyLog := fs.Bool("allow-empty-log", false, "start even though the event stream holds no event while its saved chain head says it held some (it was deleted or purged): the events are lost and the log starts again empty, with a warning in /readyz; without it such a start is refused")
	noNATSAPI := fs.Bool("no-nats-api", false, "do not serve the API over NATS (docs/API.md, NATS protocol); HTTP serves it either way")
	chainKey := chainKeyFlag(fs)
	name := fs.String("name", "", "this scheduler's name in the events it writes (default: hostname)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "auto", "text, json, or auto (text on a terminal)")
	if err := parse(fs, args); err != nil {
		return err
	}
	for name, n := range map[string]int{"max-streams": *maxStreams, "max-streams-per-customer": *maxStreamsPerCustomer} {
		if n == 0 || n < -1 {
			return fmt.Errorf("%w: --%s %d: want a positive number, or -1 for no limit", errUsage, name, n)
		}
	}
	if err := checkRetain(*retain); err != nil {
		return err
	}
	if *maxEventBytes < 0 || *maxEventBytes > math.MaxInt32 {
		return fmt.Errorf("%w: --max-event-bytes %d: want 0 to %d", errUsage, *maxEventBytes, math.MaxInt32)
	}
	alarm, bounds, err := lf.check()
	if err != nil {
		return err
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return err
	}
	var tokens, names map[string]string
	if *authFile != "" {
		if tokens, names, err = readAuthFile(*authFile, *insecureAuth); err != nil {
			return err
		}
	} else if err := requireLoopback(*httpAddr); err != nil {
		return fmt.Errorf("refusing to serve without --auth-file: %w", err)
	}
	admission, err := loadAdmission(*quotaFile)
	if err != nil {
		return err
	}
	if *maxActive > 0 {
		admission.Default.MaxActiveRoots = *maxActive
	}
	if *maxPerMinute > 0 {
		admission.Default.MaxRootsPerMinute = *maxPerMinute
	}
	if *checkerURL != "" {
		admission.CheckerURL = *checkerURL
	}
	if *name == "" {
		h, _ := os.Hostname()
		*name = "scheduler-" + sanitize(h)
	}
	if *epochSlots != 0 && (*epochSlots > eventlog.MaxEpochSlots || *epochPeriod < eventlog.MinEpochPeriod || *retainEpochs < 1 || *epochSlots < *retainEpochs+1) {
		// The current epoch, the retained ones and one being sealed each
		// hold a slot; with fewer the ring waits.
		return fmt.Errorf("%w: --epoch-slots %d --epoch-period %s --retain-epochs %d: want at least --retain-epochs + 1 slots and at most %d, a period of at least %s and at least 1 period retained", errUsage,
			*epochSlots, *epochPeriod, *retainEpochs, eventlog.MaxEpochSlots, eventlog.MinEpochPeriod)
	}
	if *shards < 1 || *shards > eventlog.MaxShards {
		return fmt.Errorf("%w: --shards %d: want 1 to %d", errUsage, *shards, eventlog.MaxShards)
	}
	if *partitions < 1 || *partitions > lease.MaxPartitions {
		return fmt.Errorf("%w: --timer-partitions %d: want 1 to %d", errUsage, *partitions, lease.MaxPartitions)
	}
	if *leaseTTL < time.Second || *leaseTTL > time.Hour {
		return fmt.Errorf("%w: --lease-ttl %s: want 1s to 1h", errUsage, *leaseTTL)
	}
	if *durability != durabilityFsync && *durability != durabilityOS {
		return fmt.Errorf("%w: --durability %q: want fsync or os", errUsage, *durability)
	}
	if *writeTimeout <= 0 || *storageRetry <= 0 {
		return fmt.Errorf("%w: --write-timeout and --storage-retry must be positive", errUsage)
	}
	nf.clients = broker.Clients{Tokens: tokens, Root: events.DefaultSubjects.Root}
	nc, embedded, closeNATS, err := nf.connect(log)
	if err != nil {
		return err
	}
	defer closeNATS()
	cfg := node.Config{
		NC: nc, Stream: nf.stream, Replicas: nf.replicas, Shards: *shards, Name: *name,
		EpochSlots: *epochSlots, EpochPeriod: *epochPeriod, EpochRetain: *retainEpochs, EpochCheck: *epochCheck, Tokens: tokens, TokenNames: names, Admission: admission, MaxInFlight: *maxInFlight,
		Streams: httpapi.StreamLimits{Max: *maxStreams, MaxPerCustomer: *maxStreamsPerCustomer},
		HTTP:    limits, BodyTimeout: *bodyTimeout, MaxBodyMemory: *maxBodyMemory, LogRepeatInterval: *logRepeat,
		Subjects: events.DefaultSubjects, Logger: log, Retain: *retain, Alarm: alarm, Limits: bounds, ReadyJSON: lf.readyJSON,
		MaxEventBytes: int32(*maxEventBytes), WriteTimeout: *writeTimeout, StorageRetry: *storageRetry,
		Partitions: *partitions, LeaseTTL: *leaseTTL, NoLeases: *noLeases,
		NoNATSAPI: *noNATSAPI, NATSMaxRequests: limits.WithDefaults().MaxConns,
		ChainKeyFile:  chainKeyPath(*chainKey, nf),
		AllowEmptyLog: *allowEmptyLog,
	}
	if !*noNATSAPI {
		if cfg.NATSAPIConn, err = nf.apiConn(embedded); err != nil {
			return err
		}
		defer cfg.NATSAPIConn.Close()
	}
	if embedded != nil {
		cfg.StorageError, cfg.RecoverStorage = embedded.StorageError, embedded.RestartJetStream
		if *durability == durabilityFsync {
			cfg.Durable = embedded
		}
		if *durability == durabilityOS {
			log.Warn().Msg("--durability os: answers do not wait for fsync; a power cut loses the writes of up to the last 2 minutes")
		}
	}
	n, err := node.New(ctx, cfg)
	if err != nil {
		return err
	}
	if embedded == nil {
		warnRemoteDurability(ctx, log, nc, nf.stream)
		warnRemoteBypass(ctx, log, nf.remote(), n.Store.Shards().Stream(nf.stream, 0))
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return err
	}
	log.Info().Str("http", "http://"+ln.Addr().String()).Msg("taskledger serving")
	if !*noNATSAPI {
		log.Info().Str("subjects", api.NATSSubject(events.DefaultSubjects.Root, "*")+".>").Msg("serving the API over NATS")
	}
	warnFDLimit(log, limits.WithDefaults().MaxConns)
	type served struct {
		srv *httpapi.Server
		ln  net.Listener
	}
	servers := []served{{n.Server, ln}}
	if *metricsAddr != "" {
		mln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--metrics-http: %w", err)
		}
		log.Info().Str("metrics", "http://"+mln.Addr().String()+"/metrics").Msg("serving metrics without a token")
		servers = append(servers, served{httpapi.NewServer(n.Metrics(hostList(*metricsHosts)), limits, ratelog.New(log, *logRepeat)), mln})
	}

	g, gctx := errgroup.WithContext(ctx)
	for _, s := range servers {
		g.Go(func() error {
			if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 65*time.Second)
			defer cancel()
			return s.srv.Shutdown(sctx)
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		log.Info().Msg("shutting down")
		return nil
	})
	g.Go(func() error { return n.Run(gctx) })
	err = g.Wait()
	log.Info().Err(err).Msg("stopped")
	return err
}

// hostList splits a comma-separated list of host names, dropping empty
// ones.
func hostList(s string) []string {
	var out []string
	for _, h := range strings.Split(s, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// sanitize makes s a valid id.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if events.ValidID(string(c)) != nil {
			b[i] = '-'
		}
	}
	if len(b) > 40 {
		b = b[:40]
	}
	return string(b)
}

// MinTokenLength is the fewest characters an auth file's token may have
// (without --insecure-auth-file): 32 random characters of any common
// alphabet are past guessing.
const MinTokenLength = 32

// readAuthFile reads lines of "TOKEN CUSTOMER_ID [NAME]" ("*" for an
// operator); '#' starts a comment. It returns the tokens' customers and
// the names of the tokens that have one (an id: the actor of the events
// the token's requests append). A token given twice is refused: which
// customer it stands for would be ambiguous. Unless insecure, a file
// that grants its group or others any permission, and a token shorter
// than MinTokenLength, are refused too.
func readAuthFile(path string, insecure bool) (tokens, names map[string]string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil {
		return nil, nil, err
	} else if perm := info.Mode().Perm(); perm&0o077 != 0 && !insecure {
		return nil, nil, fmt.Errorf("%s: mode %04o lets its group or others read or change the tokens: chmod 600 it (or pass --insecure-auth-file)", path, perm)
	}
	tokens, names = map[string]string{}, map[string]string{}
	lines := map[string]int{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if len(fields) < 2 || len(fields) > 3 || (fields[1] != "*" && events.ValidID(fields[1]) != nil) {
			return nil, nil, fmt.Errorf("%s:%d: want 'TOKEN CUSTOMER_ID [NAME]' or 'TOKEN * [NAME]'", path, line)
		}
		if len(fields) == 3 && events.ValidID(fields[2]) != nil {
			return nil, nil, fmt.Errorf("%s:%d: NAME %q must be 1 to 64 of A-Z a-z 0-9 _ -", path, line, events.Truncate(fields[2], 65))
		}
		if n := utf8.RuneCountInString(fields[0]); n < MinTokenLength && !insecure {
			return nil, nil, fmt.Errorf("%s:%d: token of %d characters: want at least %d (openssl rand -hex 24 makes one; or pass --insecure-auth-file)", path, line, n, MinTokenLength)
		}
		if first, dup := lines[fields[0]]; dup {
			return nil, nil, fmt.Errorf("%s:%d: token repeats the one on line %d", path, line, first)
		}
		tokens[fields[0]], lines[fields[0]] = fields[1], line
		if len(fields) == 3 {
			names[fields[0]] = fields[2]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if len(tokens) == 0 {
		return nil, nil, fmt.Errorf("%s: no tokens", path)
	}
	return tokens, names, nil
}

func loadAdmission(path string) (scheduler.Admission, error) {
	var a scheduler.Admission
	if path == "" {
		return a, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return a, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return a, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// The values of serve --durability.
const (
	durabilityFsync = "fsync"
	durabilityOS    = "os"
)

// warnRemoteDurability logs a warning for each of the log's streams on a
// NATS cluster (--nats-url) whose acknowledged writes a power cut of
// one server can lose: with one replica, an append is acknowledged
// once it is in that server's page cache, and nats-server fsyncs every
// sync_interval (2 minutes by default) unless it runs with
// sync_interval: always. The servers' setting is not visible to a
// client, so the warning names both remedies.
func warnRemoteDurability(ctx context.Context, log zerolog.Logger, nc *nats.Conn, stream string) {
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		cfg := info.Config
		if !strings.HasPrefix(cfg.Name, stream) || cfg.Storage != jetstream.FileStorage || cfg.Replicas >= 3 {
			continue
		}
		log.Warn().Str("stream", cfg.Name).Int("replicas", cfg.Replicas).
			Msg("acknowledged writes of this stream live on fewer than 3 servers: a power cut can lose those not yet fsynced (up to the servers' sync_interval, 2 minutes by default); run it with --replicas 3, or the servers with sync_interval: always (docs/operations.md, Durability)")
	}
	if err := lister.Err(); err != nil {
		log.Warn().Err(err).Msg("could not read the streams' replication to check durability")
	}
}

// warnRemoteBypass logs a warning when a connection to --nats-url
// without credentials (only its TLS root CA, if given) is admitted and
// can read the log's stream (its first, stream) through the JetStream
// API: then whoever reaches the servers may read every tenant's events,
// forge events and delete the log (docs/operations.md, "NATS
// permissions"). A refused connection, or a JetStream API that does not
// answer it about the stream within 2 s (a permission violation gets no
// answer), passes. It is the obvious bypass a client can test; the
// servers' other users it cannot see.
func warnRemoteBypass(ctx context.Context, log zerolog.Logger, remote broker.RemoteConfig, stream string) {
	bare := broker.RemoteConfig{URL: remote.URL, CAFile: remote.CAFile}
	nc, err := broker.ConnectRemote(bare, nats.MaxReconnects(0), nats.Name("taskledger permission check"))
	if err != nil {
		return // refused: what we want
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+stream, nil)
	var info struct {
		Config struct {
			Name string `json:"name"`
		} `json:"config"`
	}
	if err != nil || json.Unmarshal(msg.Data, &info) != nil || info.Config.Name != stream {
		log.Info().Str("url", remote.URL).Msg("a connection without credentials is admitted by --nats-url, but cannot read the log's stream")
		return
	}
	log.Warn().Str("url", remote.URL).Str("stream", stream).
		Msg("a connection to --nats-url without credentials can use the JetStream API on the log's stream: anyone who reaches the NATS servers can read every tenant's events, forge events or delete the log; give taskledger a user of its own and deny the others the JetStream API and the log's subjects (docs/operations.md, NATS permissions)")
}
