package broker

import (
	"crypto/subtle"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/taskledger/taskledger/api"
)

// Clients says who may connect to the embedded server's client port
// (EmbeddedConfig.Listen) besides taskledger itself.
type Clients struct {
	// Tokens maps the auth file's bearer tokens to customer ids ("*" for
	// an operator), as the HTTP API's. A client connecting with a
	// customer's token may publish only API requests of that customer
	// (api.NATSSubject(Root, customer) + ".>") and subscribe only to its
	// own inbox (api.NATSInbox(customer) + ".>"): no JetStream API, no
	// other customer's requests or answers. An operator's token has no
	// restriction. Nil: no tokens; then a client without credentials is
	// admitted with no restriction (the listener is loopback only: serve
	// refuses --nats-listen beyond loopback without an auth file).
	Tokens map[string]string
	// Root is the subject root of the API (events.Subjects.Root).
	Root string
}

// clientAuth admits the clients of an embedded server
// (server.Authentication): taskledger's own connections by the private
// token generated at start, the others by Clients.
type clientAuth struct {
	private string
	clients Clients
	listen  bool // EmbeddedConfig.Listen was given: Clients apply; else only private
}

var _ server.Authentication = (*clientAuth)(nil)

// Check admits c and registers its permissions, or refuses it.
func (a *clientAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	token := c.GetOpts().Token
	if subtle.ConstantTimeCompare([]byte(token), []byte(a.private)) == 1 {
		c.RegisterUser(&server.User{Username: "taskledger"})
		return true
	}
	if !a.listen {
		return false // the private listener takes only taskledger's own
	}
	if a.clients.Tokens == nil {
		if token != "" {
			return false
		}
		c.RegisterUser(&server.User{Username: "anonymous"})
		return true
	}
	customer, ok := a.clients.Tokens[token]
	if !ok || token == "" {
		return false
	}
	if customer == "*" {
		c.RegisterUser(&server.User{Username: "operator"})
		return true
	}
	c.RegisterUser(&server.User{Username: "customer:" + customer, Permissions: CustomerPermissions(a.clients.Root, customer)})
	return true
}

// CustomerPermissions are the NATS permissions of a customer's token
// under the subject root: publish its own API requests, subscribe to its
// own inbox, nothing else.
func CustomerPermissions(root, customer string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{api.NATSSubject(root, customer) + ".>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{api.NATSInbox(customer) + ".>"}},
	}
}
