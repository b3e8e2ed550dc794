package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/ratelog"
)

// Limits bounds what clients may hold of a Server: time to send a
// request's headers, idle keep-alive time, header size, and the
// connections open at once (ServerConfig bounds the bodies). The zero
// value of each field means its default; a negative timeout or MaxConns
// turns that limit off.
type Limits struct {
	// ReadHeaderTimeout is how long a client has to send a request's
	// headers; default 10s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for
	// this long; default 120s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block (net/http allows
	// 4 KiB of slack beyond it); larger is 431. Default 64 KiB.
	MaxHeaderBytes int
	// MaxConns bounds the connections open at once; past it a new one
	// is answered 503 and closed at once. Default 4096.
	MaxConns int
}

// The defaults of Limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxConns          = 4096
)

// WithDefaults returns l with every zero field set to its default and
// every negative timeout set to 0, net/http's "no limit".
func (l Limits) WithDefaults() Limits {
	dur := func(d *time.Duration, def time.Duration) {
		switch {
		case *d == 0:
			*d = def
		case *d < 0:
			*d = 0
		}
	}
	dur(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	dur(&l.IdleTimeout, DefaultIdleTimeout)
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	return l
}

// Server serves a handler over HTTP/1.1 within Limits. No write timeout
// applies: long polls wait up to service.MaxWait.
type Server struct {
	http     *http.Server
	maxConns int
	log      *ratelog.Limiter
	open     atomic.Int64
	refused  atomic.Int64
}

// NewServer returns a Server for handler. log gets one line per kind of
// refused connection and interval (see ratelog).
func NewServer(handler http.Handler, limits Limits, log *ratelog.Limiter) *Server {
	l := limits.WithDefaults()
	return &Server{
		http: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: l.ReadHeaderTimeout,
			IdleTimeout:       l.IdleTimeout,
			MaxHeaderBytes:    l.MaxHeaderBytes,
		},
		maxConns: l.MaxConns,
		log:      log,
	}
}

// Serve accepts connections on ln until Shutdown or Close; it returns
// http.ErrServerClosed then.
func (s *Server) Serve(ln net.Listener) error {
	return s.http.Serve(&limitListener{Listener: ln, s: s})
}

// Shutdown stops accepting, waits for the requests in flight (long polls
// included) until ctx ends, and closes every connection.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }

// Close closes the listeners and every connection at once.
func (s *Server) Close() error { return s.http.Close() }

// OpenConns is the number of connections open now.
func (s *Server) OpenConns() int64 { return s.open.Load() }

// RefusedConns is the number of connections refused for MaxConns so far.
func (s *Server) RefusedConns() int64 { return s.refused.Load() }

// tooManyConns is what a connection past MaxConns gets before it is
// closed: a whole HTTP answer, written at once without reading the
// request, so the client learns why.
var tooManyConns = func() []byte {
	body, _ := json.Marshal(api.ErrUnavailable.WithMessage("too many open connections (--max-conns); retry later"))
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"+
		"Connection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// limitListener counts the open connections and answers the ones past
// MaxConns with tooManyConns, so they are refused at once rather than
// queued until the process runs out of file descriptors.
type limitListener struct {
	net.Listener
	s *Server
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.s.open.Add(1); l.s.maxConns > 0 && n > int64(l.s.maxConns) {
			l.s.open.Add(-1)
			l.s.refused.Add(1)
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write(tooManyConns)
			c.Close()
			l.s.log.Log(zerolog.WarnLevel, "max-conns", "connection refused: too many open connections", func(e *zerolog.Event) {
				e.Int("maxConns", l.s.maxConns)
			})
			continue
		}
		return &errorConn{Conn: c, s: l.s}, nil
	}
}

// errorConn is an accepted connection. It gives its slot back when it
// closes, and rewrites the plain-text error answers net/http writes
// itself (an unparsable request line or header, a header over
// MaxHeaderBytes) into the API's JSON error shape.
type errorConn struct {
	net.Conn
	s      *Server
	closed sync.Once
}

func (c *errorConn) Close() error {
	c.closed.Do(func() { c.s.open.Add(-1) })
	return c.Conn.Close()
}

// protocolError matches the one Write in which net/http answers a
// request it could not parse, before it closes the connection. Nothing
// else this server writes can match: every answer of the API is JSON,
// whose text never holds a raw CR or LF.
var protocolError = regexp.MustCompile(`^HTTP/1\.1 ([45]\d\d) [^\r\n]*\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n([^\r\n]*)$`)

func (c *errorConn) Write(p []byte) (int, error) {
	if !bytes.HasPrefix(p, []byte("HTTP/1.1 ")) {
		return c.Conn.Write(p)
	}
	m := protocolError.FindSubmatch(p)
	if m == nil {
		return c.Conn.Write(p)
	}
	status, _ := strconv.Atoi(string(m[1]))
	// The text is "431 Request Header Fields Too Large" or
	// "400 Bad Request: why".
	_, why, _ := strings.Cut(string(m[2]), ": ")
	e := protocolWireError(status, why)
	c.s.log.Log(zerolog.WarnLevel, "protocol "+e.Code, "malformed request refused", func(ev *zerolog.Event) {
		ev.Int("status", status).Str("why", why)
	})
	body, _ := json.Marshal(e)
	out := fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s\n",
		status, http.StatusText(status), len(body)+1, body)
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// protocolWireError is the wire error of a request net/http refused with
// status, for the reason why ("" if it gave none).
func protocolWireError(status int, why string) *api.Error {
	if status == http.StatusRequestHeaderFieldsTooLarge {
		return api.ErrHeaderTooLarge.WithMessage("request header block is larger than --max-header-bytes")
	}
	msg := "malformed HTTP request"
	if why != "" {
		msg += ": " + why
	}
	e := api.ErrInvalid.WithMessage(msg)
	e.Status = status // 400, or 501 and 505 as net/http chose
	return e
}
