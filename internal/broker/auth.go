package broker

import (
	"crypto/subtle"
	"maps"
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/taskledger/taskledger/api"
)

// Clients says who may connect to the embedded server's client port
// (EmbeddedConfig.Listen) besides taskledger itself. A client without
// credentials is never admitted.
type Clients struct {
	// Tokens maps the auth file's bearer tokens to customer ids ("*" for
	// an operator), as the HTTP API's. A customer's token gets
	// CustomerPermissions, an operator's OperatorPermissions: neither
	// may use the JetStream API or touch the log's subjects. Nil: no
	// client but taskledger's own connections is admitted.
	Tokens map[string]string
	// Root is the subject root of the API (events.Subjects.Root).
	Root string
}

// clientAuth admits the clients of an embedded server
// (server.Authentication): taskledger's own connections by its token,
// the others by Clients.
type clientAuth struct {
	private string // taskledger's own (EmbeddedConfig.Token, or generated)
	clients Clients
	listen  bool // EmbeddedConfig.Listen was given: Clients apply; else only private
}

var _ server.Authentication = (*clientAuth)(nil)

// Check admits c and registers its permissions, or refuses it: only
// taskledger's own token is admitted without restriction, a connection
// without a token never.
func (a *clientAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	token := c.GetOpts().Token
	if token == "" {
		return false
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(a.private)) == 1 {
		c.RegisterUser(&server.User{Username: "taskledger"})
		return true
	}
	if !a.listen {
		return false // the private listener takes only taskledger's own
	}
	customer, ok := a.clients.Tokens[token]
	if !ok {
		return false
	}
	if customer == "*" {
		c.RegisterUser(&server.User{Username: "operator", Permissions: OperatorPermissions(a.clients.Root, a.customers())})
		return true
	}
	c.RegisterUser(&server.User{Username: "customer:" + customer, Permissions: CustomerPermissions(a.clients.Root, customer)})
	return true
}

// customers are the customer ids of the auth file's tokens, sorted.
func (a *clientAuth) customers() []string {
	set := map[string]bool{}
	for _, c := range a.clients.Tokens {
		if c != "*" {
			set[c] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// CustomerPermissions are the NATS permissions of a customer's token
// under the subject root: publish its own API requests
// (api.NATSSubject(root, customer) + ".>"), subscribe to its own inbox
// (api.NATSInbox(customer) + ".>"), nothing else: no JetStream API, no
// log, ready, KV or object-store subject, no other customer's requests
// or answers.
func CustomerPermissions(root, customer string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{api.NATSSubject(root, customer) + ".>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{api.NATSInbox(customer) + ".>"}},
	}
}

// OperatorPermissions are the NATS permissions of an operator's token
// under the subject root: publish the API requests of every customer
// (api.NATSSubject(root, "*") + ".>"), subscribe to its own inbox
// (api.NATSOperatorInbox + ".>") and to the inbox of each of customers
// (an operator's client acting for a customer uses its inbox:
// api.ConnectNATS). Like a customer's, an operator's token may not use
// the JetStream API ($JS.>, $KV.>, $O.>) nor the log's, ready or
// heartbeat subjects, may not read the API requests (they carry the
// customers' tokens), nor the default inbox "_INBOX.>", where
// taskledger's own connections get their JetStream answers: only
// taskledger's own connections may.
func OperatorPermissions(root string, customers []string) *server.Permissions {
	inboxes := []string{api.NATSOperatorInbox + ".>"}
	for _, c := range customers {
		inboxes = append(inboxes, api.NATSInbox(c)+".>")
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{api.NATSSubject(root, "*") + ".>"}},
		Subscribe: &server.SubjectPermission{Allow: inboxes},
	}
}
