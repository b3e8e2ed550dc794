package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// Errors of Runs.
var (
	// ErrNoRun is returned (wrapped) by Runs.Get for a task with no saved
	// run (none yet, or expired after the retention).
	ErrNoRun = errors.New("store: no run saved")
	// ErrRunRevision is returned (wrapped) by Runs.Save when the revision
	// it was given is not the stored one: JetStream's compare-and-set
	// refused the write, and nothing changed.
	ErrRunRevision = errors.New("store: run revision is not the stored one")
)

// DefaultRunRetention is how long a run is kept after its task ends by
// default (serve --run-retention): 30 days.
const DefaultRunRetention = 720 * time.Hour

// RunsBucket is the key-value bucket of a stream's runs. It is not
// executor.KVCheckpoints' default bucket ("TASKLEDGER_RUNS").
func RunsBucket(stream string) string { return stream + "_RUN" }

// RunsConfig configures OpenRuns. The zero value of every field but
// Stream means its default.
type RunsConfig struct {
	Stream   string // the event stream the runs go with; default events.DefaultStream
	Replicas int    // default 1
	// Retention is how long a run is kept at least after its task ends;
	// default DefaultRunRetention.
	Retention time.Duration
	// Timeout bounds one read or write when the caller's context has no
	// deadline; default 5s. A write not acknowledged within it fails as
	// ErrUnavailable.
	Timeout time.Duration
}

// Run is one task's saved run as the bucket holds it.
type Run struct {
	Revision   uint64          // the bucket's sequence of the save; grows with every save
	DeliveryID string          // the claim that saved it
	UpdatedAt  time.Time       // when it was saved
	Doc        json.RawMessage // the run object, byte for byte as the executor sent it
}

// runValue is what the bucket stores under a task id.
type runValue struct {
	DeliveryID string          `json:"deliveryId"`
	UpdatedAt  time.Time       `json:"updatedAt"`
	Run        json.RawMessage `json:"run"`
}

// Runs stores every task's latest run in a JetStream key-value bucket
// next to the event stream: one key per task id, history 1, file
// storage. Each save is a compare-and-set on the key's revision, done by
// JetStream, so it is safe for concurrent use by any number of
// goroutines and processes. A run expires MaxAge after its last save:
// the retention plus the longest a task can run
// (events.MaxTimeoutSeconds), so it outlives its task's end by at least
// the retention.
type Runs struct {
	kv      jetstream.KeyValue
	timeout time.Duration
}

// OpenRuns creates the runs bucket of cfg.Stream, or updates it to this
// configuration, on js.
func OpenRuns(ctx context.Context, js jetstream.JetStream, cfg RunsConfig) (*Runs, error) {
	if cfg.Stream == "" {
		cfg.Stream = events.DefaultStream
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRunRetention
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("store: run retention %s is negative", cfg.Retention)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      RunsBucket(cfg.Stream),
		Description: "taskledger runs: each task's latest Run state, by task id",
		History:     1,
		TTL:         cfg.Retention + events.MaxTimeoutSeconds*time.Second,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("store: runs bucket %s: %w", RunsBucket(cfg.Stream), err)
	}
	return &Runs{kv: kv, timeout: cfg.Timeout}, nil
}

// Get returns task taskID's latest run, ErrNoRun when it has none, or an
// error wrapping ErrUnavailable when the bucket could not answer.
func (r *Runs) Get(ctx context.Context, taskID string) (Run, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	e, err := r.kv.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Run{}, fmt.Errorf("%w for task %s", ErrNoRun, taskID)
	}
	if err != nil {
		return Run{}, fmt.Errorf("%w: get run %s: %w", ErrUnavailable, taskID, err)
	}
	var v runValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return Run{}, fmt.Errorf("store: run %s revision %d: %w", taskID, e.Revision(), err)
	}
	return Run{Revision: e.Revision(), DeliveryID: v.DeliveryID, UpdatedAt: v.UpdatedAt, Doc: v.Run}, nil
}

// Save stores run as task taskID's latest if revision is the stored
// one's (0: the task has none yet) and returns it with its new revision
// (run.Revision is ignored). It fails, changing nothing, with
// ErrRunRevision on another revision, aggregate.ErrTooLarge when the
// value is larger than the bucket takes, and an error wrapping
// ErrUnavailable when the bucket did not acknowledge the write in time
// (it may have landed; a retry with the same revision then fails with
// ErrRunRevision).
func (r *Runs) Save(ctx context.Context, taskID string, revision uint64, run Run) (Run, error) {
	data, err := json.Marshal(runValue{DeliveryID: run.DeliveryID, UpdatedAt: run.UpdatedAt, Run: run.Doc})
	if err != nil {
		return Run{}, fmt.Errorf("store: encode run %s: %w", taskID, err)
	}
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if revision == 0 {
		run.Revision, err = r.kv.Create(ctx, taskID, data)
	} else {
		run.Revision, err = r.kv.Update(ctx, taskID, data, revision)
	}
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return run, nil
	case eventlog.IsConflict(err):
		return Run{}, fmt.Errorf("%w: task %s, revision %d", ErrRunRevision, taskID, revision)
	case errors.Is(err, nats.ErrMaxPayload) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return Run{}, fmt.Errorf("%w: the run of task %s is %d bytes stored, more than the runs bucket takes", aggregate.ErrTooLarge, taskID, len(data))
	}
	return Run{}, fmt.Errorf("%w: save run %s: %w", ErrUnavailable, taskID, err)
}

// bound gives ctx the timeout when it has no deadline.
func (r *Runs) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, r.timeout)
}
