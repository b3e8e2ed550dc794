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

// Item is one transcript item: a mailbox message delivered to the run.
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
	items      map[string]Item
	stopReason string
}

// Context returns the run's context: it is cancelled when a stop check
// says stop or the worker shuts down.
func (r *Run) Context() context.Context { return r.ctx }

// Checkpoint returns a copy of the run's durable progress.
func (r *Run) Checkpoint() Checkpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, _ := json.Marshal(r.cp)
	var cp Checkpoint
	json.Unmarshal(b, &cp)
	return cp
}

// Update changes the checkpoint (phase, turn, pending tools) with fn and
// saves it.
func (r *Run) Update(ctx context.Context, fn func(cp *Checkpoint)) error {
	r.mu.Lock()
	fn(&r.cp)
	r.mu.Unlock()
	return r.save(ctx)
}

func (r *Run) save(ctx context.Context) error {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	cp := r.Checkpoint()
	if err := r.w.cfg.Checkpoints.Save(ctx, cp); err != nil {
		return fmt.Errorf("save checkpoint of %s: %w", cp.TaskID, err)
	}
	return nil
}

// Transcript returns the mailbox items delivered to the run, in order.
func (r *Run) Transcript() []Item {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Item, 0, len(r.cp.Transcript))
	for _, id := range r.cp.Transcript {
		if it, ok := r.items[id]; ok {
			out = append(out, it)
		}
	}
	return out
}

// addItems appends mailbox messages to the transcript under their message
// ids, skipping ids it already holds (a redelivered message), and reports
// whether any was new.
func (r *Run) addItems(msgs []api.MailItem) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	added := false
	for _, m := range msgs {
		if _, ok := r.items[m.ID]; !ok {
			r.items[m.ID] = Item{ID: m.ID, Index: m.Index, Content: m.Content}
		}
		if !r.cp.hasItem(m.ID) {
			r.cp.Transcript = append(r.cp.Transcript, m.ID)
			added = true
		}
	}
	return added
}

// Check asks the scheduler whether to stop and collects new mailbox
// messages into the transcript. A failed check keeps the run going
// (fail-open); the error is logged. It returns ErrStopped once stopped.
func (r *Run) Check(ctx context.Context) error {
	if r.stopped() {
		return ErrStopped
	}
	res, err := r.w.cfg.API.Check(ctx, r.Task.ID)
	if err != nil {
		r.w.cfg.Logger.Warn().Err(err).Str("task", r.Task.ID).Msg("stop check failed; continuing (fail-open)")
		return nil
	}
	if r.addItems(res.Messages) {
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
// effect is reported as uncertain. Effects go into the task's result.
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
			e := events.Effect{Kind: "unknown", Ref: key, Uncertain: true}
			return e, r.Update(ctx, func(cp *Checkpoint) { cp.Effects[key] = &EffectRecord{Outcome: &e, Uncertain: true} })
		}
		e, found, err := lookup(r.ctx)
		if err != nil {
			return events.Effect{}, r.interrupted("effect "+key+" lookup", err)
		}
		if found {
			return e, r.Update(ctx, func(cp *Checkpoint) { cp.Effects[key] = &EffectRecord{Outcome: &e} })
		}
	}
	if err := r.Check(ctx); err != nil {
		return events.Effect{}, err
	}
	if err := r.Update(ctx, func(cp *Checkpoint) {
		if cp.Effects == nil {
			cp.Effects = map[string]*EffectRecord{}
		}
		cp.Effects[key] = &EffectRecord{}
	}); err != nil {
		return events.Effect{}, err
	}
	e, err := do(r.ctx)
	if err != nil {
		return events.Effect{}, r.interrupted("effect "+key, err)
	}
	return e, r.Update(ctx, func(cp *Checkpoint) { cp.Effects[key] = &EffectRecord{Outcome: &e} })
}

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
// mailbox and returns it. It checks stop while it waits.
func (r *Run) Await(ctx context.Context, childID string) (events.ChildResult, error) {
	itemID := events.ChildResultID(childID)
	wait := 20 * time.Millisecond
	for {
		r.mu.Lock()
		it, ok := r.items[itemID]
		r.mu.Unlock()
		if ok && len(it.Content) > 0 {
			var out events.ChildResult
			if err := json.Unmarshal([]byte(it.Content[0].Text), &out); err != nil {
				return out, fmt.Errorf("child %s result: %w", childID, err)
			}
			return out, nil
		}
		if err := r.Check(ctx); err != nil {
			return events.ChildResult{}, err
		}
		select {
		case <-ctx.Done():
			return events.ChildResult{}, ctx.Err()
		case <-r.ctx.Done():
			return events.ChildResult{}, ErrStopped
		case <-time.After(wait):
		}
		wait = min(2*wait, r.w.cfg.CheckInterval)
	}
}
