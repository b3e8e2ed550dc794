package executor

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/taskledger/taskledger/api"
)

// ErrSuperseded is returned (wrapped) by CheckpointStore.Save when the
// run's claim no longer holds the task: the task ended, is gone, or
// another claim saved it. Nothing was saved; the Run stops with
// ErrStopped and saves nothing more.
var ErrSuperseded = errors.New("executor: run superseded")

// ReasonSuperseded is the StopReason of a run whose save was refused
// because its claim no longer holds the task.
const ReasonSuperseded = "superseded"

// RunAPI is the part of the scheduler's API that keeps Runs: the run
// routes and the task list. *api.Client implements it.
type RunAPI interface {
	List(ctx context.Context, o api.ListOptions) (api.TaskList, error)
	GetRun(ctx context.Context, id string) (api.RunDocument, error)
	SaveRun(ctx context.Context, id string, s api.RunSave) (api.RunDocument, error)
}

var _ RunAPI = (*api.Client)(nil)

// SchedulerRuns keeps checkpoints in the scheduler, as the Run documents
// of PUT and GET /v1/tasks/{id}/run, so an executor needs nothing but the
// HTTP API to resume after a restart. It is the default store of a worker
// whose API implements RunAPI. It is safe for concurrent use, with one
// writer per task (the Run's saves are ordered).
//
// It remembers the revision it last read or wrote of each task and sends
// it with the next save. A save the scheduler refuses as stale (the
// answer to an earlier save was lost, or an earlier process of this
// executor saved) is read again and, when the stored document is still
// this claim's, retried on its revision; a refused claim (claim_lost,
// token_mismatch, terminal, not found) or a document of another claim is
// ErrSuperseded (wrapping api.ErrClaimLost for a lost claim).
// A Run with nothing in it is not written (List finds its task by the
// claim), and a Done save writes nothing: the scheduler keeps the last
// document for audit.
type SchedulerRuns struct {
	api               RunAPI
	queue, executorID string

	mu   sync.Mutex
	revs map[string]uint64 // task id → revision last read or written
}

var _ CheckpointStore = (*SchedulerRuns)(nil)

// NewSchedulerRuns returns a store over a; List finds the running tasks
// of queue claimed by executorID.
func NewSchedulerRuns(a RunAPI, queue, executorID string) *SchedulerRuns {
	return &SchedulerRuns{api: a, queue: queue, executorID: executorID, revs: map[string]uint64{}}
}

// Load implements CheckpointStore.
func (s *SchedulerRuns) Load(ctx context.Context, taskID string) (Checkpoint, bool, error) {
	d, err := s.api.GetRun(ctx, taskID)
	if errors.Is(err, api.ErrNotFound) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("run of %s: %w", taskID, err)
	}
	s.setRev(taskID, d.Revision)
	return Checkpoint{TaskID: d.TaskID, DeliveryID: d.DeliveryID, RunState: d.Run}, true, nil
}

// Save implements CheckpointStore.
func (s *SchedulerRuns) Save(ctx context.Context, cp Checkpoint) error {
	s.mu.Lock()
	rev, known := s.revs[cp.TaskID]
	if cp.Done {
		delete(s.revs, cp.TaskID)
	}
	s.mu.Unlock()
	if cp.Done || (!known && emptyRun(cp.RunState)) {
		return nil
	}
	for range 2 { // the second try is on the revision read after a stale one
		d, err := s.api.SaveRun(ctx, cp.TaskID, api.RunSave{DeliveryID: cp.DeliveryID, Revision: rev, Run: cp.RunState})
		switch {
		case err == nil:
			s.setRev(cp.TaskID, d.Revision)
			return nil
		case errors.Is(err, api.ErrClaimLost), errors.Is(err, api.ErrTokenMismatch), errors.Is(err, api.ErrTerminal), errors.Is(err, api.ErrNotFound):
			return fmt.Errorf("save run of %s: %w: %w", cp.TaskID, ErrSuperseded, err)
		case !errors.Is(err, api.ErrStaleRevision):
			return fmt.Errorf("save run of %s: %w", cp.TaskID, err)
		}
		d, err = s.api.GetRun(ctx, cp.TaskID)
		if err != nil {
			return fmt.Errorf("reread run of %s: %w", cp.TaskID, err)
		}
		if d.DeliveryID != cp.DeliveryID {
			return fmt.Errorf("save run of %s: saved by claim %s: %w", cp.TaskID, d.DeliveryID, ErrSuperseded)
		}
		rev = d.Revision
	}
	return fmt.Errorf("save run of %s: %w", cp.TaskID, api.ErrStaleRevision)
}

// List implements CheckpointStore: the running tasks of the store's queue
// claimed by its executor, each with its saved Run (an empty one when it
// has none yet).
func (s *SchedulerRuns) List(ctx context.Context) ([]Checkpoint, error) {
	var out []Checkpoint
	o := api.ListOptions{Status: api.StatusRunning, Queue: s.queue, Limit: api.MaxListLimit}
	for {
		page, err := s.api.List(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("listing running tasks: %w", err)
		}
		for _, t := range page.Tasks {
			if t.Claim == nil || t.Claim.ExecutorID != s.executorID {
				continue
			}
			cp, _, err := s.Load(ctx, t.ID)
			if err != nil {
				return nil, err
			}
			cp.TaskID, cp.DeliveryID = t.ID, t.Claim.DeliveryID
			cp.ExecutorID = s.executorID
			out = append(out, cp)
		}
		if page.Next == "" {
			return out, nil
		}
		o.After = page.Next
	}
}

func (s *SchedulerRuns) setRev(taskID string, rev uint64) {
	s.mu.Lock()
	s.revs[taskID] = rev
	s.mu.Unlock()
}

// emptyRun reports whether r holds nothing but its executor id.
func emptyRun(r api.RunState) bool {
	return r.Phase == "" && r.Turn == 0 && len(r.Transcript) == 0 && len(r.Contexts) == 0 &&
		len(r.PendingTools) == 0 && len(r.Steps) == 0 && len(r.Effects) == 0 && len(r.Children) == 0
}
