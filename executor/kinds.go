package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/taskledger/taskledger/events"
)

// Typed handlers: a task's kind (api.Task.Kind) picks the handler that
// runs it, and its payload (api.Task.Payload, JSON) is decoded into the
// handler's argument type.

// kindHandlers are a worker's typed handlers by kind.
type kindHandlers struct {
	mu sync.RWMutex
	by map[string]Handler
}

// ErrNoHandler is the failure a worker reports for a task whose kind has
// no typed handler (Handle) when it has no default handler either.
var ErrNoHandler = errors.New("executor: no handler for the task's kind")

// PayloadError is the failure a typed handler's task reports when its
// payload does not decode into the handler's argument type. The result
// says the failure is final (retryable false): the same payload would
// fail again.
type PayloadError struct {
	Kind string
	Err  error // the JSON decoder's error
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("executor: the payload of kind %q does not decode: %v", e.Kind, e.Err)
}

func (e *PayloadError) Unwrap() error { return e.Err }

// Handle registers fn as w's handler of the tasks of kind (an
// events.ValidKind; Handle panics on another, as on a nil fn): each such
// task's payload is decoded into a T with encoding/json (a task without a
// payload decodes as JSON null: T's zero value) and fn runs with it. A nil
// error reports success, any other failure; a payload that does not decode
// into T fails the task with a *PayloadError, not retryable, without
// calling fn. A result's output is what fn gave Run.SetOutput.
//
// A task of a kind without a typed handler (or without a kind) runs the
// worker's default Handler (NewWorker's); a worker without one fails it
// with ErrNoHandler, leaving it to the task's retry policy. Registering a
// kind again replaces its handler. Handle is safe for concurrent use, and
// meant to be called before Run.
func Handle[T any](w *Worker, kind string, fn func(ctx context.Context, run *Run, args T) error) {
	if !events.ValidKind(kind) {
		panic(fmt.Sprintf("executor: Handle: %q is not a kind ([a-z0-9][a-z0-9._-]{0,63})", kind))
	}
	if fn == nil {
		panic("executor: Handle: nil handler for kind " + kind)
	}
	h := func(ctx context.Context, run *Run) (string, error) {
		var args T
		payload := []byte(run.Task.Payload)
		if len(payload) == 0 {
			payload = []byte("null")
		}
		if err := json.Unmarshal(payload, &args); err != nil {
			return "", &PayloadError{Kind: kind, Err: err}
		}
		return "", fn(ctx, run, args)
	}
	w.kinds.mu.Lock()
	defer w.kinds.mu.Unlock()
	if w.kinds.by == nil {
		w.kinds.by = make(map[string]Handler)
	}
	w.kinds.by[kind] = h
}

// handlerFor returns the handler of a task of kind: its typed handler,
// else the default one, else one failing with ErrNoHandler.
func (w *Worker) handlerFor(kind string) Handler {
	w.kinds.mu.RLock()
	h := w.kinds.by[kind]
	w.kinds.mu.RUnlock()
	switch {
	case h != nil:
		return h
	case w.handler != nil:
		return w.handler
	}
	return func(context.Context, *Run) (string, error) {
		return "", fmt.Errorf("%w: kind %q", ErrNoHandler, kind)
	}
}

// SetOutput sets the structured output of the run's result: v as JSON
// (at most events.MaxOutputBytes once compact). The last call before the
// handler returns wins; nil clears it. It fails, keeping the output as it
// was, when v does not encode or is too large.
func (r *Run) SetOutput(v any) error {
	var out json.RawMessage
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("executor: output: %w", err)
		}
		if len(b) > events.MaxOutputBytes {
			return fmt.Errorf("executor: output is %d bytes of JSON, more than %d", len(b), events.MaxOutputBytes)
		}
		out = b
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.output = out
	return nil
}

// resultOutput returns what SetOutput set.
func (r *Run) resultOutput() json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.output
}
