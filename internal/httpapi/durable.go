package httpapi

import (
	"net/http"

	"github.com/taskledger/taskledger/api"
)

// durableWriter holds back the answer to a request that may have written
// until those writes are on stable storage (ServerConfig.Durable): the
// status goes out only after Durable returned. If it failed, the answer
// becomes 503 and the handler's body is dropped — the writes were
// acknowledged by the log but may not survive a power cut, so the client
// must not be told they happened (it retries; a repeated request is
// idempotent by its request id or its state).
type durableWriter struct {
	http.ResponseWriter
	h      *handler
	r      *http.Request
	sent   bool // the status went out (or the 503 in its place)
	failed bool
}

func (d *durableWriter) WriteHeader(status int) {
	if d.sent {
		d.ResponseWriter.WriteHeader(status) // net/http logs the superfluous call
		return
	}
	d.sent = true
	if err := d.h.Durable(d.r.Context()); err != nil && status < http.StatusInternalServerError {
		d.failed = true
		e := api.ErrUnavailable.WithMessage("the write was not confirmed on stable storage: " + err.Error())
		if d.r.Context().Err() != nil {
			// The client went away (a long poll it gave up, its
			// connection closed): nobody reads this answer, and the
			// storage did not fail; logging it would only be noise.
			writeError(d.ResponseWriter, e)
			return
		}
		d.h.fail(d.ResponseWriter, d.r, e)
		return
	}
	d.ResponseWriter.WriteHeader(status)
}

func (d *durableWriter) Write(p []byte) (int, error) {
	if !d.sent {
		d.WriteHeader(http.StatusOK)
	}
	if d.failed {
		return len(p), nil
	}
	return d.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (d *durableWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// writes reports whether a request of this method may write: its answer
// waits for Durable.
func writes(method string) bool {
	return method != http.MethodGet && method != http.MethodHead && method != http.MethodOptions
}
