package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/internal/store"
)

// ErrStaleRevision is returned (wrapped) by SaveRun for a revision that
// is not the stored one (service.ErrStaleRevision).
var ErrStaleRevision = service.ErrStaleRevision

// runs is the part of the service that keeps the run documents of
// running tasks (PUT and GET /v1/tasks/{id}/run): it reads the task from
// the log and the document from docs, and reads no views. It is safe for
// concurrent use.
type runs struct {
	*core
	docs Runs
}

// Runs is the run storage as the service uses it (store.Runs).
type Runs interface {
	Get(ctx context.Context, taskID string) (store.Run, error)
	Save(ctx context.Context, taskID string, revision uint64, run store.Run) (store.Run, error)
}

var _ Runs = (*store.Runs)(nil)

// Run is a task's run document as stored (service.Run).
type Run = service.Run

// RunSave is a request to replace a task's run (service.RunSave).
type RunSave = service.RunSave

// SaveRun replaces task id's run when the task is running under
// req.DeliveryID and req.Revision is the stored revision, and returns the
// run as stored. The claim is checked on the task as the log has it now,
// right before the write; the revision by JetStream's compare-and-set.
// It checks nothing else of the run but that it is a JSON object whose
// known fields (api.RunState) have their types, and its size. It fails,
// changing nothing, with aggregate.ErrInvalid, aggregate.ErrTooLarge,
// aggregate.ErrNotFound (no such task for p), aggregate.ErrClaimLost (the
// claim under req.DeliveryID was lost or released: another executor may
// hold the task and resume its Run), aggregate.ErrTerminal,
// aggregate.ErrTokenMismatch (not running, or under another claim),
// ErrStaleRevision or ErrUnavailable.
func (s *runs) SaveRun(ctx context.Context, p Principal, id string, req RunSave) (Run, error) {
	if err := validIDs("task id", id, "deliveryId", req.DeliveryID); err != nil {
		return Run{}, err
	}
	if err := checkRun(req.Run); err != nil {
		return Run{}, err
	}
	st, err := s.get(ctx, p, id)
	if err != nil {
		return Run{}, err
	}
	switch {
	case st.LostClaim(req.DeliveryID):
		return Run{}, fmt.Errorf("%w: the claim under %s of task %s ended", aggregate.ErrClaimLost, req.DeliveryID, id)
	case st.Status.Terminal():
		return Run{}, fmt.Errorf("%w: task %s is %s", aggregate.ErrTerminal, id, st.Status)
	case st.Status != aggregate.StatusRunning:
		return Run{}, fmt.Errorf("%w: task %s is %s, not running", aggregate.ErrTokenMismatch, id, st.Status)
	case st.Claim.DeliveryID != req.DeliveryID:
		return Run{}, fmt.Errorf("%w: deliveryId is not the current claim of task %s", aggregate.ErrTokenMismatch, id)
	}
	run, err := s.docs.Save(ctx, id, req.Revision, store.Run{DeliveryID: req.DeliveryID, UpdatedAt: s.store.Now().UTC(), Doc: req.Run})
	return Run(run), s.fromRuns(err)
}

// GetRun returns task id's latest run, to anyone who may see the task,
// also after it ended (for the retention). aggregate.ErrNotFound when
// there is no such task for p or no run was saved.
func (s *runs) GetRun(ctx context.Context, p Principal, id string) (Run, error) {
	if _, err := s.get(ctx, p, id); err != nil {
		return Run{}, err
	}
	run, err := s.docs.Get(ctx, id)
	return Run(run), s.fromRuns(err)
}

// checkRun checks that doc is a JSON object of at most api.MaxRunBytes
// whose known fields decode into api.RunState.
func checkRun(doc json.RawMessage) error {
	if len(doc) > api.MaxRunBytes {
		return fmt.Errorf("%w: run is %d bytes, at most %d", aggregate.ErrTooLarge, len(doc), api.MaxRunBytes)
	}
	if t := bytes.TrimLeft(doc, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return invalid("run must be a JSON object")
	}
	var rs api.RunState
	if err := json.Unmarshal(doc, &rs); err != nil {
		return invalid("run: %v", err)
	}
	return nil
}

// fromRuns maps the run storage's errors to the service's.
func (s *runs) fromRuns(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNoRun):
		return fmt.Errorf("%w: %v", aggregate.ErrNotFound, err)
	case errors.Is(err, store.ErrRunRevision):
		return fmt.Errorf("%w: %v", ErrStaleRevision, err)
	}
	return s.fromStore(err)
}

// noRuns is the run storage of a service configured without one: always
// unavailable.
type noRuns struct{}

var errNoRuns = fmt.Errorf("%w: no run storage configured", store.ErrUnavailable)

func (noRuns) Get(context.Context, string) (store.Run, error) { return store.Run{}, errNoRuns }
func (noRuns) Save(context.Context, string, uint64, store.Run) (store.Run, error) {
	return store.Run{}, errNoRuns
}
