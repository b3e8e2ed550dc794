package executor

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// Delegate runs the tool call call by delegating it to a child task, and
// settles the call with the child's result: the model asked for work
// (call), a child does it, and the transcript holds the child's result as
// the tool result paired with that call (LLM APIs require each tool call
// to be answered by its result), not as a separate mailbox message.
//
// It dispatches call as Dispatch does (under call.ID, or the Turn's next
// default id; idempotent, whatever call.Idempotent says): the child is
// scheduled as Run.Delegate does, with req and the delegation key
// "tool:<call id>", then awaited as Run.Await does, with opts; the call
// settles ok with the child's events.ChildResult as its output (JSON),
// whatever the child's status. A Turn run again after a crash finds the
// same child and awaits it again, or answers from the settled call.
//
// An await that times out (AwaitTimeout) or whose ctx has a deadline that
// passes settles the call as timeout; a scheduling refused, or a ctx
// cancelled, settles it as error (a stop or the worker's shutdown leaves
// it pending, as Dispatch does). The child's result, should it come after either, joins the
// transcript as a mailbox message at a Turn boundary. The error is
// Dispatch's: ErrStopped, the run's context error, or a failed save.
func (t *Turn) Delegate(ctx context.Context, call api.ToolCall, req api.ScheduleRequest, opts ...AwaitOption) (api.ToolCall, error) {
	call = t.named(call)
	call.Idempotent = true
	r := t.run
	var childID string
	settled, err := t.dispatch(ctx, call, func(runCtx context.Context) (json.RawMessage, error) {
		// The run's context (a stop) and the caller's both end the wait.
		waitCtx, cancel := context.WithCancelCause(runCtx)
		defer cancel(nil)
		defer context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })()
		child, err := r.Delegate(waitCtx, toolDelegation+call.ID, req)
		if err != nil {
			return nil, err
		}
		res, err := r.Await(waitCtx, child.ID, opts...)
		if err != nil {
			return nil, err
		}
		childID = child.ID
		return json.Marshal(res)
	}, nil)
	if err == nil && settled.Status == api.ToolOK && childID != "" {
		// Received during the Turn, the report waits to join at its end:
		// the tool result holds it now.
		id := events.ChildResultID(childID)
		r.mu.Lock()
		r.inbox = slices.DeleteFunc(r.inbox, func(m string) bool { return m == id })
		r.mu.Unlock()
	}
	return settled, err
}

// toolDelegation prefixes the delegation key of a child a tool call
// delegated (Turn.Delegate): the rest is the call's id.
const toolDelegation = "tool:"

// delegatedResult reports whether mailbox message msgID is the report of
// a child a tool call delegated (Turn.Delegate) whose call settled ok
// with it: the tool result holds it, so it does not join the transcript
// again.
func (c *Checkpoint) delegatedResult(msgID string) bool {
	for key, child := range c.Children {
		callID, ok := strings.CutPrefix(key, toolDelegation)
		if !ok || events.ChildResultID(child) != msgID {
			continue
		}
		it, ok := c.item(toolResultID(callID))
		return ok && it.Tool != nil && it.Tool.Status == api.ToolOK
	}
	return false
}
