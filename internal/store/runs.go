package store

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
)

// Errors of Runs.
var (
	// ErrNoRun is returned (wrapped) by Runs.Get for a revision that is
	// not stored (a task with no saved run, or a revision past its last).
	ErrNoRun = errors.New("store: no run saved")
	// ErrRunRevision is returned (wrapped) by Runs.Save when another save
	// of the same revision replaced the record it was writing: nothing of
	// this save is stored.
	ErrRunRevision = errors.New("store: run revision is not the stored one")
	// ErrRunDamaged is returned (wrapped) by Runs.Get and Runs.Changes
	// when a stored revision cannot be read back into a Run (a record
	// altered or lost).
	ErrRunDamaged = errors.New("store: stored run revision is damaged")
)

// RunSnapshotEvery is how often a revision is stored whole: revisions
// 1, 1+RunSnapshotEvery, 1+2·RunSnapshotEvery, ... hold the whole Run,
// the others only their change, so reading any revision reads at most
// RunSnapshotEvery records.
const RunSnapshotEvery = 32

// RunOrphanAge is how old a record of the revision a save writes must
// be for the save to replace it when the same claim wrote it: younger,
// that save may still be on its way to the log, and the save fails
// with ErrRunRevision. A record of another claim is replaced at once:
// that claim can no longer record a revision.
const RunOrphanAge = time.Minute

// RunsBucket is the key-value bucket of a stream's runs. It is not
// executor.KVCheckpoints' default bucket ("TASKLEDGER_RUNS").
func RunsBucket(stream string) string { return stream + "_RUN" }

// RunFeedSubject is the core NATS subject on which the servers of
// stream tell each other of task taskID's Run saves and progress lines
// (Runs.Publish, Runs.Subscribe). No stream stores it.
func RunFeedSubject(stream, taskID string) string { return "taskledger.run." + stream + "." + taskID }

// RunsConfig configures OpenRuns. The zero value of every field but
// Stream means its default.
type RunsConfig struct {
	Stream   string // the event stream the runs go with; default events.DefaultStream
	Replicas int    // default 1
	// Timeout bounds one read or write when the caller's context has no
	// deadline; default 5s. A write not acknowledged within it fails as
	// ErrUnavailable.
	Timeout time.Duration
}

// Run is one revision of a task's run.
type Run struct {
	Revision   uint64          // 1 for the first save, +1 for each after it; 0 for a run saved before revisions
	DeliveryID string          // the claim that saved it
	UpdatedAt  time.Time       // when it was saved
	Digest     string          // RunDigest of Doc
	Doc        json.RawMessage // the run object, canonical (a run saved before revisions: as the executor sent it)
	// Change is what this revision changed in the one before (Save and
	// Changes set it; Get leaves it nil).
	Change *RunDelta
}

// runRecord is what the bucket stores under key <task id>.<revision>.
type runRecord struct {
	DeliveryID string          `json:"deliveryId"`
	SavedAt    time.Time       `json:"savedAt"`
	Digest     string          `json:"digest"` // of the whole revision
	Size       int             `json:"size"`
	Full       json.RawMessage `json:"full,omitempty"`  // the whole revision (a snapshot)
	Delta      *RunDelta       `json:"delta,omitempty"` // else its change from the revision before
}

// legacyRun is what the bucket held under a task id before revisions:
// the task's latest run, rewritten by every save.
type legacyRun struct {
	DeliveryID string          `json:"deliveryId"`
	UpdatedAt  time.Time       `json:"updatedAt"`
	Run        json.RawMessage `json:"run"`
}

// Runs stores every revision of every task's run in a JetStream
// key-value bucket next to the event stream, one key per revision
// (<task id>.<revision>), each written once: a snapshot of the whole
// run every RunSnapshotEvery revisions, else the change from the
// revision before (RunDelta). Nothing expires: a run lives as long as
// the log that records its revisions (RunSaved). The log, not the
// bucket, says which revision is a task's latest. It is safe for
// concurrent use by any number of goroutines and processes.
type Runs struct {
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	nc      *nats.Conn
	stream  string
	timeout time.Duration
	// archived holds an archive's records by key (ReadRunArchive); such
	// a Runs has no bucket and only reads.
	archived map[string][]byte
}

// OpenRuns creates the runs bucket of cfg.Stream, or updates it to this
// configuration (a bucket of an older version loses its expiry), on js.
func OpenRuns(ctx context.Context, js jetstream.JetStream, cfg RunsConfig) (*Runs, error) {
	if cfg.Stream == "" {
		cfg.Stream = events.DefaultStream
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      RunsBucket(cfg.Stream),
		Description: "taskledger runs: every saved revision of each task's Run, by task id and revision",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("store: runs bucket %s: %w", RunsBucket(cfg.Stream), err)
	}
	return &Runs{kv: kv, js: js, nc: js.Conn(), stream: cfg.Stream, timeout: cfg.Timeout}, nil
}

// LookupRuns opens the runs bucket of stream on js without creating or
// changing it (an auditor's read): ErrNoRun when there is none.
func LookupRuns(ctx context.Context, js jetstream.JetStream, stream string) (*Runs, error) {
	kv, err := js.KeyValue(ctx, RunsBucket(stream))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: no runs bucket %s", ErrNoRun, RunsBucket(stream))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: runs bucket %s: %w", ErrUnavailable, RunsBucket(stream), err)
	}
	return &Runs{kv: kv, js: js, nc: js.Conn(), stream: stream, timeout: 5 * time.Second}, nil
}

func runKey(taskID string, revision uint64) string {
	return taskID + "." + strconv.FormatUint(revision, 10)
}

// Get returns revision revision of task taskID's run; revision 0 is the
// run a task saved before revisions, if it has one. It fails with
// ErrNoRun when that revision is not stored, ErrRunDamaged when it
// cannot be read back, and an error wrapping ErrUnavailable when the
// bucket could not answer.
func (r *Runs) Get(ctx context.Context, taskID string, revision uint64) (Run, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	if revision == 0 {
		return r.legacy(ctx, taskID)
	}
	var recs []runRecord // from revision back to a snapshot
	for n := revision; ; n-- {
		rec, err := r.record(ctx, taskID, n)
		if err != nil {
			if n != revision && errors.Is(err, ErrNoRun) {
				err = fmt.Errorf("%w: revision %d of task %s needs revision %d: %w", ErrRunDamaged, revision, taskID, n, err)
			}
			return Run{}, err
		}
		recs = append(recs, rec)
		if rec.Full != nil || n == 1 {
			break
		}
	}
	var doc []byte
	for i := len(recs) - 1; i >= 0; i-- {
		next, err := recs[i].apply(doc)
		if err != nil {
			return Run{}, fmt.Errorf("%w: task %s revision %d: %w", ErrRunDamaged, taskID, revision-uint64(i), err)
		}
		doc = next
	}
	last := recs[0]
	return Run{Revision: revision, DeliveryID: last.DeliveryID, UpdatedAt: last.SavedAt, Digest: RunDigest(doc), Doc: doc}, nil
}

// Changes calls fn with revisions after+1 to upto of task taskID's run
// in order, each with its Change (and Doc), and stops at fn's first
// error, which it returns. Errors as Get's.
func (r *Runs) Changes(ctx context.Context, taskID string, after, upto uint64, fn func(Run) error) error {
	var doc []byte
	if after > 0 {
		base, err := r.Get(ctx, taskID, after)
		if err != nil {
			return err
		}
		doc = base.Doc
	}
	for n := after + 1; n <= upto; n++ {
		rctx, cancel := r.bound(ctx)
		rec, err := r.record(rctx, taskID, n)
		cancel()
		if err != nil {
			return err
		}
		next, err := rec.apply(doc)
		if err != nil {
			return fmt.Errorf("%w: task %s revision %d: %w", ErrRunDamaged, taskID, n, err)
		}
		change := rec.Delta
		if change == nil {
			d, err := diffRun(doc, next)
			if err != nil {
				return fmt.Errorf("%w: task %s revision %d: %w", ErrRunDamaged, taskID, n, err)
			}
			change = &d
		}
		doc = next
		if err := fn(Run{Revision: n, DeliveryID: rec.DeliveryID, UpdatedAt: rec.SavedAt, Digest: RunDigest(doc), Doc: doc, Change: change}); err != nil {
			return err
		}
	}
	return nil
}

// Revisions calls fn with the canonical bytes of revisions after+1 to
// upto of task taskID's run, as Changes (replay.RunReader).
func (r *Runs) Revisions(ctx context.Context, taskID string, after, upto uint64, fn func(revision uint64, doc []byte) error) error {
	return r.Changes(ctx, taskID, after, upto, func(run Run) error { return fn(run.Revision, run.Doc) })
}

// Save stores run.Doc, which must be canonical (Canonical), as revision
// base+1 of task taskID's run, base being the latest revision the log
// records (0: none yet), and returns it with its Revision, Digest and
// Change. The caller records the revision in the log (RunSaved) after
// Save returns: a record without one is left by a save whose event was
// refused or never appended, and a later save of that revision
// replaces it (see RunOrphanAge). A retry of a save that was stored
// (same claim, same bytes) returns it again. It fails, storing nothing,
// with ErrRunRevision when another save of the revision wrote it
// first, aggregate.ErrTooLarge when the record is larger than the bucket
// takes, ErrNoRun or ErrRunDamaged when revision base cannot be read,
// and an error wrapping ErrUnavailable when the bucket did not answer in
// time.
func (r *Runs) Save(ctx context.Context, taskID string, base uint64, run Run) (Run, error) {
	if r.kv == nil {
		return Run{}, errReadOnly
	}
	var prev []byte
	if base > 0 {
		b, err := r.Get(ctx, taskID, base)
		if err != nil {
			return Run{}, err
		}
		prev = b.Doc
	}
	change, err := diffRun(prev, run.Doc)
	if err != nil {
		return Run{}, fmt.Errorf("store: run of %s: %w", taskID, err)
	}
	run.Revision, run.Digest, run.Change = base+1, RunDigest(run.Doc), &change
	rec := runRecord{DeliveryID: run.DeliveryID, SavedAt: run.UpdatedAt, Digest: run.Digest, Size: len(run.Doc)}
	if run.Revision%RunSnapshotEvery == 1 {
		rec.Full = run.Doc
	} else {
		rec.Delta = &change
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return Run{}, fmt.Errorf("store: encode run %s: %w", taskID, err)
	}
	ctx, cancel := r.bound(ctx)
	defer cancel()
	key := runKey(taskID, run.Revision)
	_, err = r.kv.Create(ctx, key, data)
	if eventlog.IsConflict(err) || errors.Is(err, jetstream.ErrKeyExists) {
		var e jetstream.KeyValueEntry
		if e, err = r.kv.Get(ctx, key); err == nil {
			var old runRecord
			_ = json.Unmarshal(e.Value(), &old) // a record that does not decode is replaced
			switch {
			case old.Digest == rec.Digest && old.DeliveryID == rec.DeliveryID:
				run.UpdatedAt = old.SavedAt
				return run, nil // a retry of a save that was stored
			case old.DeliveryID == rec.DeliveryID && run.UpdatedAt.Sub(old.SavedAt) < RunOrphanAge:
				// Another save of this claim may be on its way to the log.
				return Run{}, fmt.Errorf("%w: task %s, revision %d is being saved by another request of the claim", ErrRunRevision, taskID, run.Revision)
			}
			_, err = r.kv.Update(ctx, key, data, e.Revision())
		}
	}
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return run, nil
	case eventlog.IsConflict(err):
		return Run{}, fmt.Errorf("%w: task %s, revision %d", ErrRunRevision, taskID, run.Revision)
	case errors.Is(err, nats.ErrMaxPayload) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return Run{}, fmt.Errorf("%w: revision %d of the run of task %s is %d bytes stored, more than the runs bucket takes", aggregate.ErrTooLarge, run.Revision, taskID, len(data))
	}
	return Run{}, fmt.Errorf("%w: save run %s: %w", ErrUnavailable, taskID, err)
}

// Publish sends data to the servers following task taskID's run
// (Subscribe), at most once: a server that is slow or away misses it.
func (r *Runs) Publish(taskID string, data []byte) error {
	if r.nc == nil {
		return errReadOnly
	}
	return r.nc.Publish(RunFeedSubject(r.stream, taskID), data)
}

// Subscribe calls fn with each message Publish sends for task taskID,
// in order, from one goroutine, until stop is called. A message fn is
// not ready for (more than buffer behind) is dropped.
func (r *Runs) Subscribe(taskID string, buffer int, fn func(data []byte)) (stop func(), err error) {
	if r.nc == nil {
		return nil, errReadOnly
	}
	ch := make(chan *nats.Msg, buffer)
	sub, err := r.nc.ChanSubscribe(RunFeedSubject(r.stream, taskID), ch)
	if err != nil {
		return nil, fmt.Errorf("%w: follow run %s: %w", ErrUnavailable, taskID, err)
	}
	// A flush makes sure the server has the subscription before a save
	// the caller reads after Subscribe returns is published.
	if err := r.nc.FlushTimeout(r.timeout); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("%w: follow run %s: %w", ErrUnavailable, taskID, err)
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case m := <-ch:
				fn(m.Data)
			case <-quit:
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			sub.Unsubscribe()
			close(quit)
			<-done
		})
	}, nil
}

// record reads the record of one revision.
func (r *Runs) record(ctx context.Context, taskID string, revision uint64) (runRecord, error) {
	b, err := r.value(ctx, runKey(taskID, revision))
	if err != nil {
		return runRecord{}, err
	}
	var rec runRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Full == nil && rec.Delta == nil {
		return runRecord{}, fmt.Errorf("%w: task %s revision %d: %v", ErrRunDamaged, taskID, revision, err)
	}
	return rec, nil
}

// apply returns the revision rec stores, doc being the one before.
func (rec runRecord) apply(doc []byte) ([]byte, error) {
	if rec.Full != nil {
		return Canonical(rec.Full)
	}
	return applyRun(doc, *rec.Delta)
}

// legacy reads the run a task saved before revisions.
func (r *Runs) legacy(ctx context.Context, taskID string) (Run, error) {
	b, err := r.value(ctx, taskID)
	if err != nil {
		return Run{}, err
	}
	var v legacyRun
	if err := json.Unmarshal(b, &v); err != nil {
		return Run{}, fmt.Errorf("%w: run %s: %w", ErrRunDamaged, taskID, err)
	}
	return Run{DeliveryID: v.DeliveryID, UpdatedAt: v.UpdatedAt, Digest: RunDigest(v.Run), Doc: v.Run}, nil
}

// value reads the bytes stored under key: ErrNoRun when there are none.
func (r *Runs) value(ctx context.Context, key string) ([]byte, error) {
	if r.kv == nil {
		if b, ok := r.archived[key]; ok {
			return b, nil
		}
		return nil, fmt.Errorf("%w: %s", ErrNoRun, key)
	}
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNoRun, key)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: get run %s: %w", ErrUnavailable, key, err)
	}
	return e.Value(), nil
}

var errReadOnly = errors.New("store: an archive's runs are read only")

// MaxRunArchiveLine bounds one line of a runs archive (ReadRunArchive):
// a record and its key.
const MaxRunArchiveLine = 8 << 20

// archivedRun is one line of a runs archive.
type archivedRun struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// ExportRuns writes every stored revision of each task of tasks (task
// id → its latest revision the log records), 1 to that revision, to w as
// a runs archive: one JSON line {"key", "value"} a record, the value as
// stored. A revision that is not stored is left out (a verifier reports
// it). It returns the records written.
func (r *Runs) ExportRuns(ctx context.Context, w io.Writer, tasks map[string]uint64) (int, error) {
	n := 0
	for _, id := range slices.Sorted(maps.Keys(tasks)) {
		for rev := uint64(1); rev <= tasks[id]; rev++ {
			rctx, cancel := r.bound(ctx)
			b, err := r.value(rctx, runKey(id, rev))
			cancel()
			if errors.Is(err, ErrNoRun) {
				continue
			}
			if err != nil {
				return n, err
			}
			line, err := json.Marshal(archivedRun{Key: runKey(id, rev), Value: b})
			if err != nil {
				return n, fmt.Errorf("store: run record %s: %w", runKey(id, rev), err)
			}
			if _, err := w.Write(append(line, '\n')); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// ReadRunArchive reads a runs archive (ExportRuns) into a Runs that only
// reads (Get, Changes, Revisions).
func ReadRunArchive(rd io.Reader) (*Runs, error) {
	sc := bufio.NewScanner(rd)
	sc.Buffer(nil, MaxRunArchiveLine)
	out := &Runs{archived: map[string][]byte{}, timeout: 5 * time.Second}
	for line := 1; sc.Scan(); line++ {
		var a archivedRun
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil || a.Key == "" {
			return nil, fmt.Errorf("store: runs archive line %d: not a record (%v)", line, err)
		}
		out.archived[a.Key] = a.Value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("store: runs archive: %w", err)
	}
	return out, nil
}

// Remove deletes every stored revision of the runs of tasks, and the
// run each saved before revisions, leaving no marker: for runs an
// archive holds, once the log that records them is removed.
func (r *Runs) Remove(ctx context.Context, tasks []string) error {
	if r.kv == nil {
		return errReadOnly
	}
	sctx, cancel := r.bound(ctx)
	st, err := r.js.Stream(sctx, "KV_"+RunsBucket(r.stream))
	cancel()
	if err != nil {
		return fmt.Errorf("%w: runs bucket: %w", ErrUnavailable, err)
	}
	prefix := "$KV." + RunsBucket(r.stream) + "."
	for _, id := range tasks {
		for _, subject := range []string{prefix + id + ".>", prefix + id} {
			pctx, cancel := r.bound(ctx)
			err := st.Purge(pctx, jetstream.WithPurgeSubject(subject))
			cancel()
			if err != nil {
				return fmt.Errorf("%w: remove runs of %s: %w", ErrUnavailable, id, err)
			}
		}
	}
	return nil
}

// bound gives ctx the timeout when it has no deadline.
func (r *Runs) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, r.timeout)
}
