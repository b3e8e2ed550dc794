package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/taskledger/taskledger/api"
)

// readBody reads r's whole body, at most limit bytes, within BodyTimeout
// (a 408 past it) and MaxBodyMemory (a 503 past it), and leaves it in
// memory as r.Body. It returns the bytes it holds of the memory budget,
// to release once the request is done, error or not.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request, limit int64) (int64, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return 0, nil
	}
	rc := http.NewResponseController(w)
	// The connection's read deadline (ResponseRecorders of the fuzz
	// tests have none). Once the body is in it is cleared (net/http does
	// so too when it starts watching for the client going away), so a
	// long poll may wait; after an error it stays, so that net/http's
	// discarding of the rest fails at once too. net/http sets its own for
	// the next request.
	deadline := h.BodyTimeout > 0 && rc.SetReadDeadline(time.Now().Add(h.BodyTimeout)) == nil
	budgeted := &budgetReader{r: http.MaxBytesReader(w, r.Body, limit), b: h.bodies}
	body, err := io.ReadAll(budgeted)
	r.Body = heldBody{Reader: bytes.NewReader(body), data: body}
	var tooBig *http.MaxBytesError
	switch {
	case err == nil:
		if deadline {
			rc.SetReadDeadline(time.Time{})
		}
		return budgeted.n, nil
	case errors.As(err, &tooBig):
		return budgeted.n, api.ErrPayloadTooLarge.WithMessage(fmt.Sprintf("body is larger than %d bytes", limit))
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		return budgeted.n, api.ErrRequestTimeout.WithMessage(fmt.Sprintf("body not received within %s (--body-timeout)", h.BodyTimeout))
	case errors.Is(err, errBodyMemory):
		w.Header().Set("Connection", "close")
		return budgeted.n, api.ErrUnavailable.WithMessage("request bodies in memory are at --max-body-memory; retry later")
	}
	return budgeted.n, invalidArg("reading body: %v", err)
}

// heldBody is a request body readBody read whole: decode takes its bytes
// as they are instead of reading a second copy.
type heldBody struct {
	*bytes.Reader
	data []byte
}

func (heldBody) Close() error { return nil }

// bodyBytes returns r's whole body.
func bodyBytes(r *http.Request) ([]byte, error) {
	if b, ok := r.Body.(heldBody); ok {
		return b.data, nil
	}
	return io.ReadAll(r.Body)
}

// errBodyMemory is a budgetReader's error once the budget is spent.
var errBodyMemory = errors.New("httpapi: body memory budget spent")

// bodyBudget counts the bytes of the request bodies held in memory, to
// bound them: with bodies read before an in-flight slot is taken, slow
// clients could otherwise make the server hold up to --max-conns of the
// largest body. Slow bodies hold little of it, fast ones not for long.
// A limit ≤ 0 bounds nothing. It is safe for concurrent use.
type bodyBudget struct {
	limit int64
	used  atomic.Int64
}

// take counts n more bytes held and reports whether they fit.
func (b *bodyBudget) take(n int64) bool {
	used := b.used.Add(n)
	return b.limit <= 0 || used <= b.limit
}

func (b *bodyBudget) release(n int64) {
	if n > 0 {
		b.used.Add(-n)
	}
}

// budgetReader takes what it reads from b; n is what it took.
type budgetReader struct {
	r io.Reader
	b *bodyBudget
	n int64
}

func (br *budgetReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	if n > 0 {
		br.n += int64(n)
		if !br.b.take(int64(n)) {
			return n, errBodyMemory
		}
	}
	return n, err
}
