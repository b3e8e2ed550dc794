package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// ErrStopped is returned by Run's methods once a stop check said stop: the
// task or an ancestor is terminal, or the task is gone. The handler should
// return; no new step or tool dispatch may begin.
var ErrStopped = errors.New("executor: run stopped")

// Item is one mailbox message delivered to the run.
type Item struct {
	ID      string
	Index   int
	Content []events.ContentPart
}

// Run is a handler's handle on one claimed task. Its methods are safe for
// concurrent use.
type Run struct {
	Task api.Task

	w      *Worker
	ctx    context.Context // cancelled when a stop check says stop
	cancel context.CancelFunc

	saveMu     sync.Mutex // orders saves: a later snapshot is never overwritten by an older one
	mu         sync.Mutex
	cp         Checkpoint
	items      map[string]Item // mailbox messages known, by id; nil until the first
	inbox      []string        // ids of mailbox messages not yet in the transcript
	inTurn     int             // Turns running now; mailbox messages wait for a boundary
	turns      int             // calls of Turn so far
	stopReason string
	output     json.RawMessage // the result's output (SetOutput)
	lastCheck  CheckOutcome
}

// CheckOutcome is what a run's stop check found (Run.LastCheck).
type CheckOutcome struct {
	At time.Time
	// Reason is the scheduler's answer (api.ReasonActive, ReasonTerminal,
	// ReasonAncestorTerminal, ReasonMissing, ReasonCheckFailed), "" when
	// no answer came (Err).
	Reason string
	Err    error // why no answer came
}

// Failed reports whether the check could not tell whether to stop: the
// scheduler failed open (check_failed) or did not answer. The run goes
// on, and the next background check comes sooner (a quarter of
// WorkerConfig.CheckInterval).
func (c CheckOutcome) Failed() bool { return c.Err != nil || c.Reason == api.ReasonCheckFailed }

// LastCheck returns the outcome of the run's last stop check (the zero
// CheckOutcome before the first).
func (r *Run) LastCheck() CheckOutcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastCheck
}

// checked keeps a check's outcome; a failed one is logged and counted
// (Worker.CheckFailures).
func (r *Run) checked(c CheckOutcome) {
	r.mu.Lock()
	r.lastCheck = c
	r.mu.Unlock()
	if !c.Failed() {
		return
	}
	n := r.w.checkFailures.Add(1)
	ev := r.w.cfg.Logger.Warn().Str("task", r.Task.ID).Int64("checkFailures", n)
	if c.Err != nil {
		ev = ev.Err(c.Err)
	}
	ev.Msg("stop check failed: whether to stop is unknown; continuing (fail-open) and checking again sooner")
}

// Checkpoint returns a copy of the run's durable progress.
func (r *Run) Checkpoint() Checkpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cp.clone()
}

// State returns a copy of the run's state as it is saved (api.RunState).
func (r *Run) State() api.RunState { return r.Checkpoint().RunState }

// Update changes the checkpoint with fn and saves it.
func (r *Run) Update(ctx context.Context, fn func(cp *Checkpoint)) error {
	r.mu.Lock()
	fn(&r.cp)
	r.mu.Unlock()
	return r.save(ctx)
}

// save stores the checkpoint. A store that says the run is superseded
// stops it: the answer is then ErrStopped, and no later save is tried.
func (r *Run) save(ctx context.Context) error {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	if reason := r.StopReason(); reason == ReasonSuperseded || reason == ReasonClaimLost {
		return ErrStopped
	}
	cp := r.Checkpoint()
	err := r.w.cfg.Checkpoints.Save(ctx, cp)
	if errors.Is(err, ErrSuperseded) {
		reason := ReasonSuperseded
		if errors.Is(err, api.ErrClaimLost) {
			reason = ReasonClaimLost
		}
		r.stop(reason)
		return fmt.Errorf("%w: %w", ErrStopped, err)
	}
	if err != nil {
		return r.interrupted("save", fmt.Errorf("save checkpoint of %s: %w", cp.TaskID, err))
	}
	return nil
}

// SetPhase sets the run's phase (free text: "planning", "reviewing") and
// saves it.
func (r *Run) SetPhase(ctx context.Context, phase string) error {
	return r.Update(ctx, func(cp *Checkpoint) { cp.Phase = phase })
}

// ProgressAPI is what Run.Progress needs of a Worker's API beyond API:
// api.Client and the server's in-process client have it.
type ProgressAPI interface {
	Progress(ctx context.Context, id, deliveryID, text string) error
}

// ErrNoProgress is returned by Run.Progress when the Worker's API does
// not implement ProgressAPI.
var ErrNoProgress = errors.New("executor: the worker's API sends no progress lines")

// Progress sends text (model tokens, a status line) to the task's run
// streams (GET /v1/tasks/{id}/run/stream) as an ephemeral progress line:
// nothing is saved and the task's log does not change, so a line can be
// lost; progress is best effort, and a caller may ignore its error. It
// is safe for concurrent use. It fails with api.ErrPayloadTooLarge for
// text over api.MaxProgressBytes, api.ErrProgressRate past
// api.ProgressRate lines a second (api.ProgressBurst at once),
// api.ErrTokenMismatch or api.ErrTerminal once the run no longer holds
// the task, and ErrNoProgress (see ProgressAPI).
func (r *Run) Progress(ctx context.Context, text string) error {
	p, ok := r.w.cfg.API.(ProgressAPI)
	if !ok {
		return ErrNoProgress
	}
	return p.Progress(ctx, r.Task.ID, r.Checkpoint().DeliveryID, text)
}

// Context returns the named context snapshot saved by SaveContext; ok is
// false if there is none.
func (r *Run) Context(name string) (c api.RunContext, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok = r.cp.Contexts[name]
	return c, ok
}

// SaveContext saves value (as JSON) as the named context snapshot: the
// first save is version 1, each replacement the next version.
func (r *Run) SaveContext(ctx context.Context, name string, value any) (api.RunContext, error) {
	b, err := json.Marshal(value)
	if err != nil {
		return api.RunContext{}, fmt.Errorf("context %s: %w", name, err)
	}
	var c api.RunContext
	err = r.Update(ctx, func(cp *Checkpoint) {
		if cp.Contexts == nil {
			cp.Contexts = map[string]api.RunContext{}
		}
		c = api.RunContext{Version: cp.Contexts[name].Version + 1, Value: b, SavedAt: time.Now().UTC()}
		cp.Contexts[name] = c
	})
	return c, err
}

// Transcript returns the mailbox messages in the run's transcript, in
// order.
func (r *Run) Transcript() []Item {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Item
	for _, it := range r.cp.Transcript {
		if m, ok := r.items[it.ID]; ok && it.Kind == api.ItemMailbox {
			out = append(out, m)
		}
	}
	return out
}

// receive takes mailbox messages the run has not seen (a redelivered one
// is skipped by its id) and, at a boundary between Turns (boundaryLocked),
// adds them to the transcript. It reports whether the transcript grew.
func (r *Run) receive(msgs []api.MailItem) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if _, ok := r.items[m.ID]; ok {
			continue
		}
		if r.items == nil {
			r.items = make(map[string]Item)
		}
		r.items[m.ID] = Item{ID: m.ID, Index: m.Index, Content: m.Content}
		if !r.cp.hasItem(m.ID) && !r.cp.delegatedResult(m.ID) {
			r.inbox = append(r.inbox, m.ID)
		}
	}
	return r.inTurn == 0 && r.boundaryLocked() && r.joinLocked()
}

// boundaryLocked reports whether the saved transcript stands between
// Turns: no Turn has begun or the last one begun has ended, and no tool
// call waits for its result. A run resumed in the middle of a Turn is not
// at a boundary until that Turn, run again, ends. r.mu is held.
func (r *Run) boundaryLocked() bool {
	return len(r.cp.PendingTools) == 0 && (r.cp.Turn == 0 || r.cp.hasItem(turnEndID(r.cp.Turn)))
}

// joinLocked adds the waiting mailbox messages to the transcript and
// reports whether there were any. Its callers are the Turn boundaries; it
// joins nothing while a dispatched tool has not settled, so every
// tool_call item stays next to its tool_result, as LLM APIs require.
// r.mu is held.
func (r *Run) joinLocked() bool {
	if len(r.cp.PendingTools) > 0 {
		return false
	}
	for _, id := range r.inbox {
		r.cp.Transcript = append(r.cp.Transcript, api.TranscriptItem{
			ID: id, Kind: api.ItemMailbox, Turn: r.cp.Turn, At: time.Now().UTC()})
	}
	joined := len(r.inbox) > 0
	r.inbox = nil
	return joined
}

// Check asks the scheduler whether to stop and collects new mailbox
// messages into the transcript. A failed check — no answer, or the
// scheduler's check_failed — keeps the run going (fail-open): it is
// logged, counted (Worker.CheckFailures) and kept (LastCheck), and the
// next background check comes sooner. It returns ErrStopped once stopped.
func (r *Run) Check(ctx context.Context) error {
	if r.stopped() {
		return ErrStopped
	}
	res, err := r.w.cfg.API.Check(ctx, r.Task.ID, r.Task.Claim.DeliveryID)
	if errors.Is(err, api.ErrClaimLost) {
		r.stop(ReasonClaimLost)
		return ErrStopped
	}
	r.checked(CheckOutcome{At: time.Now().UTC(), Reason: res.Reason, Err: err})
	if err != nil {
		return nil
	}
	if r.receive(res.Messages) {
		if err := r.save(ctx); err != nil {
			r.w.cfg.Logger.Warn().Err(err).Str("task", r.Task.ID).Msg("checkpoint not saved")
		}
	}
	if res.ShouldStop {
		r.stop(res.Reason)
		return ErrStopped
	}
	return nil
}

func (r *Run) stop(reason string) {
	r.mu.Lock()
	if r.stopReason == "" {
		r.stopReason = reason
	}
	r.mu.Unlock()
	r.cancel()
}

func (r *Run) stopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopReason != ""
}

// StopReason says why the run stopped ("" while it runs).
func (r *Run) StopReason() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopReason
}

// Step runs fn as the named step unless a completed run of it is in the
// checkpoint (a resumed run skips it). It checks stop first and refuses to
// begin once the task is no longer authorised.
func (r *Run) Step(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	r.mu.Lock()
	done := r.cp.stepDone(name)
	r.mu.Unlock()
	if done {
		return nil
	}
	if err := r.Check(ctx); err != nil {
		return err
	}
	if err := fn(r.ctx); err != nil {
		return r.interrupted("step "+name, err)
	}
	return r.Update(ctx, func(cp *Checkpoint) { cp.Steps = append(cp.Steps, name) })
}

// interrupted returns err, marked ErrStopped when a stop cut the work
// short, so a handler can tell a stop from a failure with errors.Is.
func (r *Run) interrupted(what string, err error) error {
	if r.stopped() {
		return fmt.Errorf("%s: %w (%w)", what, ErrStopped, err)
	}
	return err
}

// Effect performs an external write (a pull request, a comment, a push)
// at most once per key. The intent is saved before do runs and the
// outcome after it. A resumed run that finds an intent without an outcome
// does not repeat do blindly: lookup (e.g. find the pull request by its
// stable branch name) decides whether it happened; without a lookup the
// effect is reported as uncertain. Each outcome is reported to the
// scheduler as soon as it is known (POST /v1/tasks/{id}/effects, when the
// worker's API has ReportEffects), so a task that times out keeps the
// evidence; the result carries every outcome too.
func (r *Run) Effect(ctx context.Context, key string, do func(ctx context.Context) (events.Effect, error),
	lookup func(ctx context.Context) (events.Effect, bool, error)) (events.Effect, error) {
	r.mu.Lock()
	rec, seen := r.cp.Effects[key]
	r.mu.Unlock()
	if seen && rec.Outcome != nil {
		return *rec.Outcome, nil
	}
	if seen { // intent without outcome: the last attempt was cut off
		if lookup == nil {
			return r.settleEffect(ctx, key, events.Effect{Kind: "unknown", Ref: key, Uncertain: true})
		}
		e, found, err := lookup(r.ctx)
		if err != nil {
			return events.Effect{}, r.interrupted("effect "+key+" lookup", err)
		}
		if found {
			return r.settleEffect(ctx, key, e)
		}
	}
	if err := r.Check(ctx); err != nil {
		return events.Effect{}, err
	}
	if err := r.Update(ctx, func(cp *Checkpoint) {
		if cp.Effects == nil {
			cp.Effects = map[string]api.EffectRecord{}
		}
		cp.Effects[key] = api.EffectRecord{}
	}); err != nil {
		return events.Effect{}, err
	}
	e, err := do(r.ctx)
	if err != nil {
		return events.Effect{}, r.interrupted("effect "+key, err)
	}
	return r.settleEffect(ctx, key, e)
}

// settleEffect reports an effect's outcome to the scheduler, then saves
// it. A report that fails is logged: the result carries the effect too.
func (r *Run) settleEffect(ctx context.Context, key string, e events.Effect) (events.Effect, error) {
	if rep, ok := r.w.cfg.API.(EffectReporter); ok {
		if _, err := rep.ReportEffects(ctx, r.Task.ID, r.Task.Claim.DeliveryID, []events.Effect{e}); err != nil {
			r.w.cfg.Logger.Warn().Err(err).Str("task", r.Task.ID).Str("effect", key).Msg("effect not reported; the result will carry it")
		}
	}
	return e, r.Update(ctx, func(cp *Checkpoint) { cp.Effects[key] = api.EffectRecord{Outcome: &e, Uncertain: e.Uncertain} })
}

// EffectReporter reports effects as they happen (POST
// /v1/tasks/{id}/effects). *api.Client implements it; a worker whose API
// does not reports effects only in the result.
type EffectReporter interface {
	ReportEffects(ctx context.Context, id, deliveryID string, effects []events.Effect) (api.Task, error)
}

var _ EffectReporter = (*api.Client)(nil)

// effects returns the outcomes recorded so far, for the result.
func (r *Run) effects() []events.Effect {
	cp := r.Checkpoint()
	var out []events.Effect
	for _, key := range slices.Sorted(maps.Keys(cp.Effects)) { // a stable order
		if rec := cp.Effects[key]; rec.Outcome != nil {
			e := *rec.Outcome
			e.Uncertain = e.Uncertain || rec.Uncertain
			out = append(out, e)
		}
	}
	return out
}

// Delegate schedules a child task under this one. The child's request id
// is derived from (this task, key), so a retried delegation — in this run
// or a resumed one — finds the same child instead of creating another.
func (r *Run) Delegate(ctx context.Context, key string, req api.ScheduleRequest) (api.Task, error) {
	if err := r.Check(ctx); err != nil {
		return api.Task{}, err
	}
	req.ParentID, req.CustomerID = r.Task.ID, r.Task.CustomerID
	req.RequestID = events.DeriveID("d", r.Task.ID, key)
	child, _, err := r.w.cfg.API.Schedule(ctx, req)
	if err != nil {
		return api.Task{}, fmt.Errorf("delegate %s: %w", key, err)
	}
	return child, r.Update(ctx, func(cp *Checkpoint) {
		if cp.Children == nil {
			cp.Children = map[string]string{}
		}
		cp.Children[key] = child.ID
	})
}

// Await waits until the child's terminal result reaches this task's
// mailbox and returns it. It checks stop while it waits (ErrStopped), and
// gives up when ctx ends (its error, or the cause it was cancelled with)
// or, with AwaitTimeout, after that long: an error wrapping
// ErrAwaitTimeout and context.DeadlineExceeded. The child goes on either
// way; awaiting it again finds its result once it ends.
func (r *Run) Await(ctx context.Context, childID string, opts ...AwaitOption) (events.ChildResult, error) {
	var o awaitOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, o.timeout,
			fmt.Errorf("%w: child %s did not end within %s: %w", ErrAwaitTimeout, childID, o.timeout, context.DeadlineExceeded))
		defer cancel()
	}
	wait := 20 * time.Millisecond
	for {
		if res, ok, err := r.childResult(childID); ok {
			return res, err
		}
		if ctx.Err() != nil {
			return events.ChildResult{}, context.Cause(ctx)
		}
		if err := r.Check(ctx); err != nil {
			return events.ChildResult{}, err
		}
		if res, ok, err := r.childResult(childID); ok {
			return res, err
		}
		select {
		case <-ctx.Done():
			return events.ChildResult{}, context.Cause(ctx)
		case <-r.ctx.Done():
			return events.ChildResult{}, ErrStopped
		case <-time.After(wait):
		}
		wait = min(2*wait, r.w.cfg.CheckInterval)
	}
}

// childResult returns the result of child childID if its report has
// reached the run (ok), decoded.
func (r *Run) childResult(childID string) (res events.ChildResult, ok bool, err error) {
	r.mu.Lock()
	it, ok := r.items[events.ChildResultID(childID)]
	r.mu.Unlock()
	if !ok || len(it.Content) == 0 {
		return res, false, nil
	}
	if err := json.Unmarshal([]byte(it.Content[0].Text), &res); err != nil {
		return res, true, fmt.Errorf("child %s result: %w", childID, err)
	}
	return res, true, nil
}

// ErrAwaitTimeout is wrapped by the error Await returns when its
// AwaitTimeout passed before the child ended.
var ErrAwaitTimeout = errors.New("executor: child did not end in time")

// AwaitOption changes how Await waits.
type AwaitOption func(*awaitOptions)

type awaitOptions struct{ timeout time.Duration }

// AwaitTimeout makes Await give up after d (0: wait as long as its
// context allows).
func AwaitTimeout(d time.Duration) AwaitOption {
	return func(o *awaitOptions) { o.timeout = d }
}
