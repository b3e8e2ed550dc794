package httpapi

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"strings"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// hostPolicy is the Host headers a listener serves, against DNS
// rebinding: a page of another site whose name comes to resolve to the
// listener's address sends that name as Host, so only names the page
// cannot take are served. The zero value serves loopback names and
// addresses only (the API without tokens).
type hostPolicy struct {
	// anyIP also serves every IP literal: a rebinding page's Host is a
	// name, never an address (the metrics listener, scraped by address).
	anyIP bool
	// names are more names served, lower-case, without a port.
	names map[string]bool
	// why ends the 403's message: what this listener serves.
	why string
}

// apiHosts is the API's policy without tokens.
var apiHosts = hostPolicy{why: "a server without --auth-file serves only loopback names and addresses (localhost, 127.0.0.0/8, ::1)"}

// metricsHosts is the Host policy of MetricsHandler: loopback names and
// addresses, every IP address, and names (host names without a port,
// compared without case).
func metricsHosts(names []string) hostPolicy {
	p := hostPolicy{anyIP: true, names: map[string]bool{},
		why: "--metrics-http serves only IP addresses, localhost and the names of --metrics-hosts"}
	for _, n := range names {
		p.names[strings.ToLower(n)] = true
	}
	return p
}

// allows reports whether p serves the Host header hostport (with or
// without a port).
func (p hostPolicy) allows(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if LoopbackHost(host) || p.names[strings.ToLower(host)] {
		return true
	}
	return p.anyIP && net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")) != nil
}

// refuse answers 403 to a request for a Host p does not serve and
// reports whether it did.
func (p hostPolicy) refuse(w http.ResponseWriter, r *http.Request) bool {
	if p.allows(r.Host) {
		return false
	}
	writeError(w, api.ErrForbidden.WithMessage(fmt.Sprintf("Host %q is not served (DNS rebinding): %s", r.Host, p.why)))
	return true
}

// secureHeaders sets the headers every answer carries: no content
// sniffing, and no caching of answers that hold a tenant's data (a
// route may set its own Cache-Control, as the console's assets do).
func secureHeaders(h http.Header) {
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
}

// checkContentType refuses, with 415, a request that may write (any
// method but GET, HEAD and OPTIONS) and carries a body without declaring
// it JSON, or declares any media type but application/json: an HTML form
// and a no-preflight fetch always send another one. A charset
// parameter, if any, must be utf-8. A request without a body and without
// Content-Type (POST /v1/tasks/{id}/cancel from curl) is served.
func checkContentType(r *http.Request) error {
	if !writes(r.Method) {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		if r.ContentLength == 0 { // no body (chunked is -1)
			return nil
		}
		return api.ErrUnsupportedMediaType.WithMessage("a request body needs Content-Type: application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return api.ErrUnsupportedMediaType.WithMessage(fmt.Sprintf("Content-Type %q: want application/json", events.Truncate(ct, 100)))
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return api.ErrUnsupportedMediaType.WithMessage(fmt.Sprintf("Content-Type %q: want application/json, with no parameter but charset=utf-8", events.Truncate(ct, 100)))
		}
	}
	return nil
}
