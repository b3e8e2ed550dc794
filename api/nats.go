package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The NATS protocol (docs/API.md, "NATS protocol"): a request to
// NATSSubject(root, customer) + ".<anything>" carries the HTTP method and
// path (with its query) in headers, the bearer token in Authorization and
// the JSON body as its data; the answer carries the HTTP status in
// NATSStatusHeader, the answer's headers and its JSON body. Every route
// but the event streams answers as over HTTP, by the same handler.
const (
	NATSMethodHeader = "Method"
	NATSPathHeader   = "Path"
	NATSStatusHeader = "Status"
	NATSAuthHeader   = "Authorization"
	// NATSRequestIDHeader, optional, names a request so that its client
	// can cancel it: a message to NATSSubject(root, customer) +
	// ".cancel" with the same header ends the request's context on the
	// server, as a closed connection ends an HTTP request's (a long poll
	// then claims nothing more).
	NATSRequestIDHeader = "Request-Id"
)

// NATSSubject is the prefix of the request subjects of customer's API
// requests under the subject root ("tl"): "<root>.api.<customer>". A
// client's token may publish only below it. An operator token (or a
// server without tokens) may use any customer id.
func NATSSubject(root, customer string) string { return root + ".api." + customer }

// NATSInbox is the inbox prefix of customer's connections
// (nats.CustomInboxPrefix): a client's token may subscribe only below it,
// so no customer reads another's answers.
func NATSInbox(customer string) string { return "_INBOX_" + customer }

// NATSOperatorInbox is the inbox prefix of an operator's connection
// (nats.CustomInboxPrefix) to the embedded server's client port: an
// operator's token may subscribe below it and below every auth-file
// customer's NATSInbox, not below nats.go's default "_INBOX", where
// taskledger's own connections get their JetStream answers. It is no
// customer's inbox: "_OPINBOX" is not "_INBOX_" followed by an id.
const NATSOperatorInbox = "_OPINBOX"

// ErrHTTPOnly is what a Client over NATS (NewNATSClient) returns from the
// calls that read an event stream (Stream, StreamAfter, CustomerEvents,
// StreamRun): their answers are streams, which one NATS reply cannot
// carry. Ask an HTTP client.
var ErrHTTPOnly = errors.New("api: event streams are served over HTTP only, not over NATS")

// NATSTimeout is how long a Client over NATS waits for an answer to a
// request whose context has no deadline, beyond the wait of a long poll:
// a request or answer lost (NATS delivers at most once) fails then.
const NATSTimeout = 30 * time.Second

// ConnectNATS connects to a taskledger server's NATS client port (serve
// --nats-listen) as customer with token: the token authenticates the
// connection, and its inbox is NATSInbox(customer), the only subjects the
// token may subscribe to; customer "*" is an operator's token, whose
// inbox is NATSOperatorInbox. opts come after these (nats.Name, say).
// The connection reconnects forever, as a server restart needs.
func ConnectNATS(url, customer, token string, opts ...nats.Option) (*nats.Conn, error) {
	inbox := NATSInbox(customer)
	if customer == "*" {
		inbox = NATSOperatorInbox
	}
	base := []nats.Option{nats.CustomInboxPrefix(inbox), nats.MaxReconnects(-1)}
	if token != "" {
		base = append(base, nats.Token(token))
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("api: connect to %s: %w", url, err)
	}
	return nc, nil
}

// NewNATSClient returns a client that sends every call as a NATS request
// on nc to the server whose subject root is root ("" is "tl"), as
// customer with token. nc should come from ConnectNATS (its inbox prefix
// must be NATSInbox(customer) where the server confines tokens). Calls
// answer as over HTTP, with the same *Error values; a body larger than
// nc's max payload is ErrPayloadTooLarge without being sent (send it over
// HTTP), and the event streams (Stream, CustomerEvents, StreamRun) are
// HTTP only. A call whose context ends first cancels its request on the
// server (NATSRequestIDHeader). A context without a deadline gets NATSTimeout (plus the
// wait of a long poll). The client is safe for concurrent use.
func NewNATSClient(nc *nats.Conn, root, customer, token string) *Client {
	if root == "" {
		root = "tl"
	}
	prefix := NATSSubject(root, customer)
	return &Client{Token: token, nats: &natsTransport{nc: nc, subject: prefix + ".req", cancel: prefix + ".cancel"}}
}

// natsTransport sends a Client's calls over NATS.
type natsTransport struct {
	nc      *nats.Conn
	subject string // requests'
	cancel  string // cancellations'
}

// reserve is what a request's headers may take of the max payload.
const reserve = 4 << 10

// do sends a request of method and path with body (JSON, or nil) and
// returns the answer's status and data.
func (t *natsTransport) do(ctx context.Context, method, path, token string, body []byte) (int, []byte, error) {
	if limit := t.nc.MaxPayload() - reserve; int64(len(body)) > limit {
		return 0, nil, ErrPayloadTooLarge.WithMessage(fmt.Sprintf(
			"body of %d bytes is over what fits in a NATS message of this connection (%d bytes); send it over HTTP", len(body), limit))
	}
	if _, ok := ctx.Deadline(); !ok {
		timeout := NATSTimeout
		if path == "/v1/claims/next" || path == "/v1/claims" {
			timeout += MaxWaitSeconds * time.Second
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	msg := nats.NewMsg(t.subject)
	msg.Header.Set(NATSMethodHeader, method)
	msg.Header.Set(NATSPathHeader, path)
	if token != "" {
		msg.Header.Set(NATSAuthHeader, "Bearer "+token)
	}
	id := strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix) // unique
	msg.Header.Set(NATSRequestIDHeader, id)
	msg.Data = body
	reply, err := t.nc.RequestMsgWithContext(ctx, msg)
	if err != nil && ctx.Err() != nil {
		// Given up: end the request on the server too (best effort), so
		// a long poll claims nothing for a caller that went away.
		cancel := nats.NewMsg(t.cancel)
		cancel.Header.Set(NATSRequestIDHeader, id)
		t.nc.PublishMsg(cancel)
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return 0, nil, fmt.Errorf("%s %s over NATS: no taskledger server serves %s: %w", method, path, t.subject, err)
		}
		return 0, nil, fmt.Errorf("%s %s over NATS: %w", method, path, err)
	}
	status, err := strconv.Atoi(reply.Header.Get(NATSStatusHeader))
	if err != nil || status < 100 || status > 599 {
		return 0, nil, fmt.Errorf("%s %s over NATS: answer without a valid %s header (%q)", method, path, NATSStatusHeader, strings.TrimSpace(reply.Header.Get(NATSStatusHeader)))
	}
	if status == http.StatusNoContent {
		return status, nil, nil
	}
	return status, reply.Data, nil
}
