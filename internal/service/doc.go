// Package service is the vocabulary of the service layer: who makes a
// request (Principal), what it asks (the requests and filters), what
// comes back (the views, outcomes and run documents) and the errors the
// service adds to the aggregate's.
//
// internal/scheduler implements the service over the log, the
// projections and the ready queue, and names these types (as aliases) in
// its own signatures; internal/httpapi serves the service over HTTP
// through an interface it declares of the methods it calls, in these
// types, the wire's (api) and the aggregate's. This package imports
// events, aggregate and api only, so the HTTP edge links neither the
// log nor the projections, the reactors or replay.
//
// Every type here is a plain value: safe to copy, and safe for
// concurrent use once no one writes it.
package service
