package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// wireErrors is the one table from the service's errors to the wire's,
// used by the HTTP handler and by Local alike. The first match wins.
var wireErrors = []struct {
	err  error
	wire *api.Error
}{
	{aggregate.ErrInvalid, api.ErrInvalid},
	{aggregate.ErrNotFound, api.ErrNotFound},
	{aggregate.ErrTerminal, api.ErrTerminal},
	{aggregate.ErrClaimLost, api.ErrClaimLost},
	{aggregate.ErrTokenMismatch, api.ErrTokenMismatch},
	{aggregate.ErrNotClaimable, api.ErrNotClaimable},
	{aggregate.ErrNotTerminal, api.ErrNotTerminal},
	{service.ErrParentTerminal, api.ErrParentTerminal},
	{service.ErrAncestorTerminal, api.ErrAncestorTerminal},
	{service.ErrRequestIDConflict, api.ErrRequestIDConflict},
	{service.ErrLineageLimit, api.ErrLineageLimit},
	{service.ErrScheduleLimit, api.ErrScheduleLimit},
	{service.ErrStaleRevision, api.ErrStaleRevision},
	{service.ErrOperatorOnly, api.ErrOperatorOnly},
	{aggregate.ErrTooLarge, api.ErrPayloadTooLarge}, // permanent: never retried as unavailable
	{service.ErrCorruptEvent, api.ErrCorruptEvent},  // permanent too: before unavailable
	{service.ErrTooManyPolls, api.ErrTooManyPolls},
	{service.ErrProgressRate, api.ErrProgressRate},
	{service.ErrUnavailable, api.ErrUnavailable},
	{aggregate.ErrConflict, api.ErrUnavailable}, // lost every OCC retry: try again
	{context.DeadlineExceeded, api.ErrUnavailable},
}

// wireError returns the *api.Error a client gets for err: err itself when
// it is one, a 429 with the recorded task for an admission rejection, the
// table's entry with err's text, or 500 internal.
func wireError(err error) *api.Error {
	var wire *api.Error
	var rejected *service.AdmissionError
	switch {
	case errors.As(err, &wire):
		return wire
	case errors.As(err, &rejected):
		t := NewTask(rejected.Task)
		e := api.ErrAdmissionRejected.WithMessage(rejected.Task.Reason)
		e.Task = &t
		return e
	}
	for _, m := range wireErrors {
		if errors.Is(err, m.err) {
			e := m.wire.WithMessage(err.Error())
			if corrupt, ok := errors.AsType[*events.CorruptError](err); ok {
				// Not err's text: the message's subject names its
				// customer, which the caller need not be (an operator).
				e.Message = fmt.Sprintf("the log's message at seq %d does not decode (quarantined): %v", corrupt.Pos, corrupt.Err)
				e.Seq = uint64(corrupt.Pos)
			}
			return e
		}
	}
	return api.ErrInternal.WithMessage(err.Error())
}

func invalidArg(format string, args ...any) *api.Error {
	return api.ErrInvalid.WithMessage(fmt.Sprintf(format, args...))
}

func noRoute(r *http.Request) *api.Error {
	return api.ErrNotFound.WithMessage("no route " + r.Method + " " + r.URL.Path)
}
