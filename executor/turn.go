package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// Turn is one model iteration and its tool cycle, inside Run.Turn: the
// model input the executor assembles, the model's response, the tools it
// dispatches and their results. Its methods are safe for concurrent use
// (tools may be dispatched in parallel; give each call its own ID then).
type Turn struct {
	run *Run
	n   int

	mu           sync.Mutex
	items, calls int // Record and Dispatch calls so far, for their default ids
}

// ToolFunc calls a tool and returns its output (JSON). An error settles
// the call as "error", or "timeout" when it is context.DeadlineExceeded.
type ToolFunc func(ctx context.Context) (json.RawMessage, error)

// ToolLookup tells whether a tool call cut off by a crash took place,
// and its output if it did.
type ToolLookup func(ctx context.Context) (output json.RawMessage, found bool, err error)

// Number is the Turn's index in the run, from 1.
func (t *Turn) Number() int { return t.n }

// Turn runs fn as the run's next Turn (the package doc, "The Run and Turn
// contract").
// A run's Turns run one after another, not at once.
// The k-th call of Turn in a handler is Turn k, so a restarted handler
// that makes the same calls in the same order meets its Turns again:
//
//   - a Turn whose end is in the saved Run is skipped: fn is not called
//     and Turn returns nil (the handler reads what it needs from State);
//   - a Turn cut off mid-way runs fn again, and its Record and Dispatch
//     calls answer from the saved transcript instead of doing their work
//     twice;
//   - any other Turn runs fn for the first time.
//
// A Turn begins at a boundary: Turn checks stop first (ErrStopped once
// stopped), mailbox messages received so far join the transcript, and the
// Run is saved with this Turn as the current one. Messages that arrive
// during the Turn join at its end, never in the middle of a tool call. A
// Turn run again after a crash joins none at its start: its saved items
// (the model's tool calls, the results that settled) are followed by the
// rest of its tool results before any message, so a recovered transcript
// keeps every tool call next to its result.
// The Turn ends when fn returns nil with every dispatched tool settled:
// its end is recorded (transcript item "t<k>.end") and saved. An error
// from fn is returned (marked ErrStopped when a stop cut it short) and the
// Turn stays open, to be run again by a resumed handler.
func (r *Run) Turn(ctx context.Context, fn func(t *Turn) error) error {
	r.mu.Lock()
	r.turns++
	k := r.turns
	done := r.cp.Turn > k || r.cp.hasItem(turnEndID(k))
	r.mu.Unlock()
	if done {
		return nil
	}
	if err := r.Check(ctx); err != nil {
		return err
	}
	if err := r.Update(ctx, func(cp *Checkpoint) {
		if cp.Turn < k { // a new Turn; one cut off mid-way joins mail at its end
			r.joinLocked()
		}
		cp.Turn = k
		r.inTurn++
	}); err != nil {
		r.leaveTurn()
		return err
	}
	err := fn(&Turn{run: r, n: k})
	if err != nil {
		r.leaveTurn()
		return r.interrupted("turn "+strconv.Itoa(k), err)
	}
	if r.stopped() {
		r.leaveTurn()
		return ErrStopped
	}
	var pending []string
	err = r.Update(ctx, func(cp *Checkpoint) {
		r.inTurn-- // with the end and the join, so no check joins a message before the end
		for _, c := range cp.PendingTools {
			if c.Turn == k {
				pending = append(pending, c.ID)
			}
		}
		if len(pending) == 0 {
			cp.Transcript = append(cp.Transcript, api.TranscriptItem{ID: turnEndID(k), Kind: api.ItemNote, Turn: k, At: time.Now().UTC(),
				Content: []events.ContentPart{{Type: "text", Text: "turn " + strconv.Itoa(k) + " ended"}}})
		}
		r.joinLocked()
	})
	if err == nil && len(pending) > 0 {
		err = fmt.Errorf("turn %d: fn returned with tools %v not settled", k, pending)
	}
	return err
}

func (r *Run) leaveTurn() {
	r.mu.Lock()
	r.inTurn--
	r.mu.Unlock()
}

func turnEndID(k int) string { return "t" + strconv.Itoa(k) + ".end" }

// Record adds item (a model input or output, or a note) to the
// transcript and saves it, and returns the item as saved. Its id is
// item.ID, or "t<k>.i<j>" for the j-th Record of Turn k. In a Turn run
// again after a crash, an id already in the transcript answers with the
// saved item and records nothing: the handler goes on with what was
// recorded the first time (e.g. the model's earlier answer, which the
// tool calls already dispatched were made from). Kind defaults to
// api.ItemNote; the mailbox and tool kinds belong to the Run. Record
// returns ErrStopped once the run is stopped.
func (t *Turn) Record(ctx context.Context, item api.TranscriptItem) (api.TranscriptItem, error) {
	t.mu.Lock()
	t.items++
	j := t.items
	t.mu.Unlock()
	if item.ID == "" {
		item.ID = "t" + strconv.Itoa(t.n) + ".i" + strconv.Itoa(j)
	}
	switch item.Kind {
	case "":
		item.Kind = api.ItemNote
	case api.ItemModelInput, api.ItemModelOutput, api.ItemNote:
	default:
		return api.TranscriptItem{}, fmt.Errorf("record %s: kind %q is not a model input, output or note", item.ID, item.Kind)
	}
	r := t.run
	r.mu.Lock()
	saved, ok := r.cp.item(item.ID)
	r.mu.Unlock()
	if ok {
		return saved, nil
	}
	if r.stopped() {
		return api.TranscriptItem{}, ErrStopped
	}
	item.Turn, item.Tool = t.n, nil
	if item.At.IsZero() {
		item.At = time.Now().UTC()
	}
	return item, r.Update(ctx, func(cp *Checkpoint) { cp.Transcript = append(cp.Transcript, item) })
}

// Dispatch calls a tool at most once and returns the settled call
// (Status ok with Output, error with Error, timeout, or uncertain). Its
// id is call.ID, or "t<k>.c<j>" for the j-th Dispatch of Turn k.
//
// Before do runs, Dispatch checks stop and saves the call as pending (in
// PendingTools and as a tool_call item); after do returns it saves the
// settled call (a tool_result item "<id>.result") and drops it from
// PendingTools. In a Turn run again after a crash:
//
//   - a call already settled answers with its saved result; do is not
//     called;
//   - a call still pending was cut off: lookup, if given, tells whether
//     it took place (found: settled ok with its output; not found: do
//     runs); without a lookup do runs again only if call.Idempotent,
//     else the call settles as uncertain and the handler decides.
//
// The error is not the tool's (that is in the call): it is ErrStopped
// or the run's context error (the call stays pending when a stop or the
// worker's shutdown cut do short), or a failed save.
func (t *Turn) Dispatch(ctx context.Context, call api.ToolCall, do ToolFunc, lookup ToolLookup) (api.ToolCall, error) {
	return t.dispatch(ctx, t.named(call), do, lookup)
}

// named returns call with the id of the Turn's next dispatch if it has
// none: "t<k>.c<j>" for the j-th.
func (t *Turn) named(call api.ToolCall) api.ToolCall {
	t.mu.Lock()
	t.calls++
	j := t.calls
	t.mu.Unlock()
	if call.ID == "" {
		call.ID = "t" + strconv.Itoa(t.n) + ".c" + strconv.Itoa(j)
	}
	return call
}

// dispatch is Dispatch of a call named already.
func (t *Turn) dispatch(ctx context.Context, call api.ToolCall, do ToolFunc, lookup ToolLookup) (api.ToolCall, error) {
	call.Turn, call.Status, call.Output, call.Error = t.n, api.ToolPending, nil, ""
	r := t.run
	r.mu.Lock()
	settled, done := r.cp.item(toolResultID(call.ID))
	pending := slices.ContainsFunc(r.cp.PendingTools, func(c api.ToolCall) bool { return c.ID == call.ID })
	r.mu.Unlock()
	if done && settled.Tool != nil {
		return *settled.Tool, nil
	}
	if pending { // cut off by a crash
		if lookup != nil {
			out, found, err := lookup(r.ctx)
			if err != nil {
				return call, r.interrupted("tool "+call.ID+" lookup", err)
			}
			if found {
				call.Status, call.Output = api.ToolOK, out
				return t.settle(ctx, call)
			}
		} else if !call.Idempotent {
			call.Status, call.Error = api.ToolUncertain, "cut off by a crash; not repeated"
			return t.settle(ctx, call)
		}
	}
	if err := r.Check(ctx); err != nil {
		return call, err
	}
	if !pending {
		if err := r.Update(ctx, func(cp *Checkpoint) {
			cp.PendingTools = append(cp.PendingTools, call)
			c := call
			cp.Transcript = append(cp.Transcript, api.TranscriptItem{ID: call.ID, Kind: api.ItemToolCall, Turn: t.n, At: time.Now().UTC(), Tool: &c})
		}); err != nil {
			return call, err
		}
	}
	out, err := do(r.ctx)
	switch {
	case err != nil && r.ctx.Err() != nil: // a stop or the worker's shutdown cut it off
		return call, r.interrupted("tool "+call.ID, err)
	case errors.Is(err, context.DeadlineExceeded):
		call.Status, call.Error = api.ToolTimeout, err.Error()
	case err != nil:
		call.Status, call.Error = api.ToolError, events.Truncate(err.Error(), events.MaxErrorBytes)
	default:
		call.Status, call.Output = api.ToolOK, out
	}
	return t.settle(ctx, call)
}

// settle saves call's final status: a tool_result item, and no longer
// pending.
func (t *Turn) settle(ctx context.Context, call api.ToolCall) (api.ToolCall, error) {
	err := t.run.Update(ctx, func(cp *Checkpoint) {
		cp.PendingTools = slices.DeleteFunc(cp.PendingTools, func(c api.ToolCall) bool { return c.ID == call.ID })
		c := call
		cp.Transcript = append(cp.Transcript, api.TranscriptItem{ID: toolResultID(call.ID), Kind: api.ItemToolResult, Turn: t.n, At: time.Now().UTC(), Tool: &c})
	})
	return call, err
}

func toolResultID(callID string) string { return callID + ".result" }
