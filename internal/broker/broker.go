// Package broker gives taskledger its NATS connection: either an embedded
// nats-server with JetStream on a local data directory, reached over
// loopback TCP, or an existing server or cluster by URL. The embedded
// server's Sync is the group commit that makes acknowledged writes
// durable before the API answers (commit.go).
package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// EmbeddedConfig configures an embedded server. The zero value is not
// usable: Dir is required.
type EmbeddedConfig struct {
	// Dir holds JetStream's files. Required: an empty StoreDir would make
	// nats-server fall back to a shared temporary folder.
	Dir string
	// Listen, when set (host:port), also accepts NATS clients there, as
	// Clients says: executors speaking the API over NATS, an operator
	// with the nats CLI, each confined to the API subjects. Empty means
	// a private listener: a random loopback port. Either way
	// taskledger's own connections authenticate with Token and are the
	// only unrestricted ones; a connection without credentials is
	// refused.
	Listen string
	// Clients admits the clients of Listen (auth.go).
	Clients Clients
	// Token, if set, is taskledger's own token, which other taskledger
	// processes sharing this server's log (serve --nats-url
	// --nats-token-file) connect with too: at least MinTokenLen
	// characters. Empty: a random one generated at start, which never
	// leaves the process.
	Token string
	// SyncAlways fsyncs every append before acknowledging it (about 7x
	// slower). Without it an acknowledged append survives a killed
	// process, not a power cut.
	SyncAlways bool
	// ServerName names the server in JetStream metadata; default
	// "taskledger".
	ServerName string
	// MaxStore caps the file storage of the clients' account in bytes;
	// past it every write is refused. Zero means no cap but the server's
	// (most of the free disk).
	MaxStore int64
}

// MinTokenLen is the shortest EmbeddedConfig.Token accepted: the token
// gives every right on the log.
const MinTokenLen = 32

// Embedded is a running in-process nats-server with JetStream.
//
// Its clients connect over loopback TCP, not through nats.go's
// in-process connection: that one is a net.Pipe, which has no buffer, so
// every flush of a client waits until the server's read loop takes the
// bytes, under the connection's lock. Measured with `taskledger bench
// --scale 0.3 --only lifecycle,burst`: the p99 of a burst's claims 122 ms
// in-process, 60–65 ms over loopback TCP.
type Embedded struct {
	srv      *server.Server
	token    string     // taskledger's own connections'
	listen   bool       // Listen was given
	mu       sync.Mutex // serializes RestartJetStream and SetMaxStore
	maxStore int64
	commit   *groupCommit
	stopOnce sync.Once
}

// StartEmbedded starts a server and waits until it accepts connections.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("broker: embedded server needs a data directory")
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		JetStream:  true,
		StoreDir:   cfg.Dir,
		SyncAlways: cfg.SyncAlways,
		NoSigs:     true,
		NoLog:      true,
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
	}
	if opts.ServerName == "" {
		opts.ServerName = "taskledger"
	}
	token := cfg.Token
	if token == "" {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("broker: token: %w", err)
		}
		token = hex.EncodeToString(b)
	} else if len(token) < MinTokenLen {
		return nil, fmt.Errorf("broker: taskledger's token has %d characters, want at least %d", len(token), MinTokenLen)
	}
	opts.CustomClientAuthentication = &clientAuth{private: token, clients: cfg.Clients, listen: cfg.Listen != ""}
	if cfg.Listen != "" {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("broker: listen address %q: %w", cfg.Listen, err)
		}
		opts.Host = host
		if opts.Port, err = strconv.Atoi(port); err != nil {
			return nil, fmt.Errorf("broker: listen port %q: %w", port, err)
		}
		if opts.Port == 0 { // nats-server's 0 is its default port, 4222
			opts.Port = server.RANDOM_PORT
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("broker: new server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("broker: embedded server did not become ready in 30s")
	}
	e := &Embedded{srv: srv, token: token, listen: cfg.Listen != "", maxStore: cfg.MaxStore, commit: newGroupCommit(cfg.Dir)}
	if cfg.MaxStore > 0 {
		if err := srv.GlobalAccount().UpdateJetStreamLimits(e.limits()); err != nil {
			e.Shutdown()
			return nil, fmt.Errorf("broker: account storage limit: %w", err)
		}
	}
	return e, nil
}

// limits are the clients' account's JetStream limits: MaxStore, if set,
// and no other.
func (e *Embedded) limits() map[string]server.JetStreamAccountLimits {
	if e.maxStore <= 0 {
		return nil
	}
	return map[string]server.JetStreamAccountLimits{"": {MaxMemory: -1, MaxStore: e.maxStore, MaxStreams: -1, MaxConsumers: -1}}
}

// StorageError returns nil while JetStream runs and no stream reports a
// problem to nats-server's health check, else what is wrong: a stream
// whose file store failed a write (ENOSPC on a full disk) keeps that
// error and refuses every later write until RestartJetStream. It is safe
// for concurrent use; each call walks the server's streams.
func (e *Embedded) StorageError() error {
	if !e.srv.JetStreamEnabled() {
		return errors.New("broker: JetStream is not running")
	}
	if err := e.commit.stats().Err; err != nil {
		return err
	}
	for _, he := range e.srv.Healthz(&server.HealthzOptions{Details: true}).Errors {
		if he.Type == server.HealthzErrorStream || he.Type == server.HealthzErrorJetStream {
			return fmt.Errorf("broker: %s", he.Error)
		}
	}
	return nil
}

// RestartJetStream stops the clients' account's JetStream and starts it
// again from the same directory, as a restart of the process would,
// without one: every stream is reopened from its files, which clears a
// file store's kept write error. Clients keep their connections; durable
// consumers come back from disk, ordered ones are recreated by their
// clients. The server's own JetStream (its API) keeps running: stopping
// that at run time races with the API requests of connected clients in
// nats-server 2.15.2. It is safe for concurrent use.
func (e *Embedded) RestartJetStream() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	acc := e.srv.GlobalAccount()
	if err := acc.DisableJetStream(); err != nil {
		return fmt.Errorf("broker: stop JetStream: %w", err)
	}
	if err := acc.EnableJetStream(e.limits(), nil); err != nil {
		return fmt.Errorf("broker: start JetStream: %w", err)
	}
	return nil
}

// SetMaxStore changes MaxStore at once, as an operator raising the
// account's limit would.
func (e *Embedded) SetMaxStore(n int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.maxStore = n
	return e.srv.GlobalAccount().UpdateJetStreamLimits(e.limits())
}

// Connect opens a connection to the server.
func (e *Embedded) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name("taskledger")}, opts...)
	opts = append(opts, nats.Token(e.token))
	nc, err := nats.Connect(e.srv.ClientURL(), opts...)
	if err != nil {
		return nil, fmt.Errorf("broker: connect to the embedded server: %w", err)
	}
	return nc, nil
}

// Disconnect drops the server's side of nc's connection, as a network
// failure would; nc reconnects if its options let it.
func (e *Embedded) Disconnect(nc *nats.Conn) error {
	id, err := nc.GetClientID()
	if err != nil {
		return err
	}
	return e.srv.DisconnectClientByID(id)
}

// ClientURL is where external clients reach the server, or "" when it
// has only its private listener.
func (e *Embedded) ClientURL() string {
	if !e.listen {
		return ""
	}
	return e.srv.ClientURL()
}

// Sync returns once every write the server acknowledged before the call
// is on stable storage, sharing its fsyncs with concurrent callers
// (group commit): nil, ctx's error, ErrStopped after Shutdown, or the
// error of a failed fsync, which every later call returns too until the
// process restarts. An answer that reports a write calls it before it is
// sent (serve --durability fsync). It is safe for concurrent use.
func (e *Embedded) Sync(ctx context.Context) error { return e.commit.Sync(ctx) }

// CommitStats reports Sync's work since start.
func (e *Embedded) CommitStats() CommitStats { return e.commit.stats() }

// Shutdown stops the server and waits until it has. It is safe to call
// more than once.
func (e *Embedded) Shutdown() {
	e.stopOnce.Do(e.commit.close)
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// RemoteConfig says how to reach an existing NATS server or cluster.
type RemoteConfig struct {
	URL       string // comma-separated server URLs
	CredsFile string // user JWT and nkey seed (.creds)
	NKeyFile  string // nkey seed file
	CAFile    string // TLS root CA
	CertFile  string // TLS client certificate
	KeyFile   string // TLS client key
	Token     string // bearer token (an embedded server's EmbeddedConfig.Token)
}

// ConnectRemote connects to an existing server or cluster. The connection
// reconnects forever; callers see errors per request while it is down.
func ConnectRemote(cfg RemoteConfig, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name("taskledger"), nats.MaxReconnects(-1)}, opts...)
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("broker: nkey: %w", err)
		}
		opts = append(opts, o)
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("broker: connect %s: %w", cfg.URL, err)
	}
	return nc, nil
}
