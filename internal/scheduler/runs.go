package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/internal/store"
)

// ErrStaleRevision is returned (wrapped) by SaveRun for a revision that
// is not the stored one (service.ErrStaleRevision).
var ErrStaleRevision = service.ErrStaleRevision

// runs is the part of the service that keeps the run documents of
// running tasks (PUT and GET /v1/tasks/{id}/run, the run stream and
// progress): it reads the task from the log and the revisions from docs,
// and reads no views. It is safe for concurrent use.
type runs struct {
	*core
	docs     Runs
	progress progressLimiter
}

// Runs is the run storage as the service uses it (store.Runs).
type Runs interface {
	Get(ctx context.Context, taskID string, revision uint64) (store.Run, error)
	Changes(ctx context.Context, taskID string, after, upto uint64, fn func(store.Run) error) error
	Save(ctx context.Context, taskID string, base uint64, run store.Run) (store.Run, error)
	Publish(taskID string, data []byte) error
	Subscribe(taskID string, buffer int, fn func(data []byte)) (stop func(), err error)
}

var _ Runs = (*store.Runs)(nil)

// Run is a task's run document as stored (service.Run).
type Run = service.Run

// RunSave is a request to save a task's run (service.RunSave).
type RunSave = service.RunSave

// SaveRun stores req.Run as the next revision of task id's run when the
// task is running under req.DeliveryID and req.Revision is its latest
// revision, records the revision's digest in the task's log (RunSaved)
// and returns the revision as stored (canonical JSON). A save whose
// answer was lost, repeated with the same revision and bytes, answers
// the revision it stored. It checks nothing else of the run but that it
// is a JSON object whose known fields (api.RunState) have their types,
// and its size. It fails, changing nothing the log shows, with
// aggregate.ErrInvalid, aggregate.ErrTooLarge, aggregate.ErrNotFound (no
// such task for p), aggregate.ErrClaimLost (the claim under
// req.DeliveryID was lost or released: another executor may hold the
// task and resume its Run), aggregate.ErrTerminal,
// aggregate.ErrTokenMismatch (not running, or under another claim),
// ErrStaleRevision or ErrUnavailable.
func (s *runs) SaveRun(ctx context.Context, p Principal, id string, req RunSave) (Run, error) {
	if err := validIDs("task id", id, "deliveryId", req.DeliveryID); err != nil {
		return Run{}, err
	}
	if err := checkRun(req.Run); err != nil {
		return Run{}, err
	}
	doc, err := store.Canonical(req.Run)
	if err != nil {
		return Run{}, invalid("run: %v", err)
	}
	st, err := s.get(ctx, p, id)
	if err != nil {
		return Run{}, err
	}
	if err := runningUnder(st, req.DeliveryID); err != nil {
		return Run{}, err
	}
	if head := st.Run; req.Revision != head.Revision {
		if req.Revision+1 == head.Revision && head.Digest == store.RunDigest(doc) {
			run, err := s.docs.Get(ctx, id, head.Revision) // a retry of the latest save
			return serviceRun(run), s.fromRuns(err)
		}
		return Run{}, fmt.Errorf("%w: revision %d, the latest is %d", ErrStaleRevision, req.Revision, head.Revision)
	}
	saved, err := s.docs.Save(ctx, id, req.Revision, store.Run{DeliveryID: req.DeliveryID, UpdatedAt: s.store.Now().UTC(), Doc: doc})
	if err != nil {
		return Run{}, s.fromRuns(err)
	}
	cmd := aggregate.SaveRun{DeliveryID: req.DeliveryID, Revision: saved.Revision, Digest: saved.Digest, Size: len(saved.Doc)}
	if _, err := s.execute(ctx, p, id, "", cmd, nil); err != nil {
		return Run{}, s.fromRuns(err)
	}
	s.notify(id, runNote{Kind: service.RunItemSaved, Revision: saved.Revision})
	return serviceRun(saved), nil
}

// GetRun returns revision revision of task id's run (0: the latest), to
// anyone who may see the task, also after it ended. The latest is
// checked against the digest the log records. aggregate.ErrNotFound when
// there is no such task for p or no such revision.
func (s *runs) GetRun(ctx context.Context, p Principal, id string, revision uint64) (Run, error) {
	st, err := s.get(ctx, p, id)
	if err != nil {
		return Run{}, err
	}
	head := st.Run
	switch {
	case revision > head.Revision:
		return Run{}, fmt.Errorf("%w: task %s has %d run revisions", aggregate.ErrNotFound, id, head.Revision)
	case revision == 0:
		revision = head.Revision // 0 still: a run saved before revisions, if any
	}
	run, err := s.docs.Get(ctx, id, revision)
	if err == nil && revision == head.Revision && head.Revision > 0 && run.Digest != head.Digest {
		err = fmt.Errorf("%w: run of task %s revision %d hashes to %s, the log records %s", store.ErrRunDamaged, id, revision, run.Digest, head.Digest)
	}
	return serviceRun(run), s.fromRuns(err)
}

// Progress sends a progress line of the run under req.DeliveryID to
// the task's run streams, on every server, at most once and without
// writing the log. It fails with aggregate.ErrInvalid (text not UTF-8),
// aggregate.ErrTooLarge (over api.MaxProgressBytes),
// aggregate.ErrNotFound, aggregate.ErrTerminal,
// aggregate.ErrTokenMismatch (not running under that claim),
// service.ErrProgressRate (past api.ProgressRate lines a second, with
// a burst of api.ProgressBurst, for the task on this server) or
// ErrUnavailable.
func (s *runs) Progress(ctx context.Context, p Principal, id string, req service.RunProgress) error {
	if err := validIDs("task id", id, "deliveryId", req.DeliveryID); err != nil {
		return err
	}
	switch {
	case len(req.Text) > api.MaxProgressBytes:
		return fmt.Errorf("%w: progress text is %d bytes, at most %d", aggregate.ErrTooLarge, len(req.Text), api.MaxProgressBytes)
	case !utf8.ValidString(req.Text):
		return invalid("progress text must be UTF-8")
	}
	st, err := s.get(ctx, p, id)
	if err != nil {
		return err
	}
	if err := runningUnder(st, req.DeliveryID); err != nil {
		return err
	}
	if !s.progress.allow(id, s.store.Now()) {
		return fmt.Errorf("%w: task %s sent more than %d progress lines a second", service.ErrProgressRate, id, api.ProgressRate)
	}
	return s.notify(id, runNote{Kind: service.RunItemProgress, Text: req.Text, At: s.store.Now().UTC()})
}

// DefaultRunPoll is how often FollowRun looks at the log for a save it
// was not told of (a feed message lost) and for the task's end.
const DefaultRunPoll = 5 * time.Second

// FollowRun calls fn with every revision of task id's run after after,
// then live with each new revision and each progress line, in order,
// from one goroutine, and with a RunItemEnd once the task is terminal
// and every revision was sent. It returns nil when ctx ends or after
// the end, fn's error when fn fails, and otherwise the errors of
// GetRun. At most buffer progress lines wait for fn; more are dropped
// (saves never are: they are read again from the store).
func (s *runs) FollowRun(ctx context.Context, p Principal, id string, after uint64, buffer int, fn func(service.RunItem) error) error {
	if _, err := s.get(ctx, p, id); err != nil {
		return err
	}
	notes := make(chan runNote, buffer)
	stop, err := s.docs.Subscribe(id, buffer, func(b []byte) {
		var n runNote
		if json.Unmarshal(b, &n) == nil {
			select {
			case notes <- n:
			default: // fn is behind: a progress line is lost, a save is read again below
			}
		}
	})
	if err != nil {
		return s.fromRuns(err)
	}
	defer stop()
	sent := after
	// catchUp sends the revisions after sent that the log records, and
	// the end once the task is terminal.
	catchUp := func() (ended bool, err error) {
		st, err := s.get(ctx, p, id)
		if err != nil {
			return false, err
		}
		if st.Run.Revision > sent {
			err := s.docs.Changes(ctx, id, sent, st.Run.Revision, func(r store.Run) error {
				item := service.RunItem{Kind: service.RunItemSaved, Run: serviceRun(r)}
				item.Run.Doc = nil
				var err error
				if item.Run.Change, err = json.Marshal(r.Change); err != nil {
					return err
				}
				sent = r.Revision
				return fn(item)
			})
			if err != nil {
				return false, s.fromRuns(err)
			}
		}
		if st.Status.Terminal() {
			return true, fn(service.RunItem{Kind: service.RunItemEnd, Status: string(st.Status)})
		}
		return false, nil
	}
	poll := time.NewTicker(DefaultRunPoll)
	defer poll.Stop()
	ended, err := catchUp()
	for !ended && err == nil {
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
			ended, err = catchUp()
		case n := <-notes:
			switch {
			case n.Kind == service.RunItemProgress:
				err = fn(service.RunItem{Kind: n.Kind, Text: n.Text, At: n.At})
			case n.Revision > sent:
				ended, err = catchUp()
			}
		}
	}
	return err
}

// runNote is a message of a task's run feed (store.Runs.Publish): a
// save's revision or a progress line.
type runNote struct {
	Kind     string    `json:"kind"`
	Revision uint64    `json:"revision,omitempty"`
	Text     string    `json:"text,omitempty"`
	At       time.Time `json:"at,omitzero"`
}

// notify publishes n on task id's run feed.
func (s *runs) notify(id string, n runNote) error {
	b, err := json.Marshal(n)
	if err == nil {
		err = s.docs.Publish(id, b)
	}
	if err != nil {
		return fmt.Errorf("%w: run feed of %s: %v", ErrUnavailable, id, err)
	}
	return nil
}

// runningUnder fails unless st is running under claim deliveryID.
func runningUnder(st aggregate.State, deliveryID string) error {
	switch {
	case st.LostClaim(deliveryID):
		return fmt.Errorf("%w: the claim under %s of task %s ended", aggregate.ErrClaimLost, deliveryID, st.TaskID)
	case st.Status.Terminal():
		return fmt.Errorf("%w: task %s is %s", aggregate.ErrTerminal, st.TaskID, st.Status)
	case st.Status != aggregate.StatusRunning:
		return fmt.Errorf("%w: task %s is %s, not running", aggregate.ErrTokenMismatch, st.TaskID, st.Status)
	case st.Claim.DeliveryID != deliveryID:
		return fmt.Errorf("%w: deliveryId is not the current claim of task %s", aggregate.ErrTokenMismatch, st.TaskID)
	}
	return nil
}

// serviceRun is r as the service answers it, without its change.
func serviceRun(r store.Run) Run {
	return Run{Revision: r.Revision, DeliveryID: r.DeliveryID, UpdatedAt: r.UpdatedAt, Digest: r.Digest, Doc: r.Doc}
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
	case errors.Is(err, store.ErrRunRevision), errors.Is(err, aggregate.ErrRunRevision):
		return fmt.Errorf("%w: %v", ErrStaleRevision, err)
	}
	return s.fromStore(err)
}

// progressLimiter bounds each task's progress lines with a token bucket
// of api.ProgressBurst lines refilled at api.ProgressRate a second. It
// forgets every task once it holds maxProgressTasks. Safe for concurrent
// use; the zero value is ready.
type progressLimiter struct {
	mu    sync.Mutex
	tasks map[string]*progressBucket
}

type progressBucket struct {
	tokens float64
	at     time.Time
}

const maxProgressTasks = 10000

// allow takes a line for task id at now, or reports that none is left.
func (l *progressLimiter) allow(id string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tasks == nil || len(l.tasks) >= maxProgressTasks {
		l.tasks = map[string]*progressBucket{}
	}
	b := l.tasks[id]
	if b == nil {
		b = &progressBucket{tokens: api.ProgressBurst, at: now}
		l.tasks[id] = b
	}
	b.tokens = min(api.ProgressBurst, b.tokens+now.Sub(b.at).Seconds()*api.ProgressRate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// noRuns is the run storage of a service configured without one: always
// unavailable.
type noRuns struct{}

var errNoRuns = fmt.Errorf("%w: no run storage configured", store.ErrUnavailable)

func (noRuns) Get(context.Context, string, uint64) (store.Run, error) {
	return store.Run{}, errNoRuns
}
func (noRuns) Changes(context.Context, string, uint64, uint64, func(store.Run) error) error {
	return errNoRuns
}
func (noRuns) Save(context.Context, string, uint64, store.Run) (store.Run, error) {
	return store.Run{}, errNoRuns
}
func (noRuns) Publish(string, []byte) error { return errNoRuns }
func (noRuns) Subscribe(string, int, func([]byte)) (func(), error) {
	return nil, errNoRuns
}
