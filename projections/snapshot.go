package projections

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// SnapshotFormat is the version of the snapshot encoding. A snapshot of
// another format is ignored (and the projections rebuilt from the log).
// Format 3 added the State's Effects, which a format 2 snapshot lacks even
// for tasks whose results had effects. Format 4 added the concurrency
// keys' states, the spec's concurrency and the schedules; format 5 each
// key holder's attempt and the retried holders of the Free queue; format
// 6 the spec's labels, which the search index is rebuilt from (a build
// with labels and without the holders' attempts wrote a format 4 or 5 of
// its own: those are ignored too); format 7 the spec's kind, which the
// kind index is rebuilt from.
const SnapshotFormat = 7

// Snapshot errors; a snapshot that fails any check is ignored.
var (
	ErrSnapshotChecksum = errors.New("projections: snapshot checksum mismatch")
	ErrSnapshotFormat   = errors.New("projections: unknown snapshot format")
	ErrSnapshotAhead    = errors.New("projections: snapshot is ahead of the stream")
)

// SnapshotStore keeps the newest projection snapshot.
type SnapshotStore interface {
	// Load returns the stored snapshot; ok is false when there is none.
	Load(ctx context.Context) (data []byte, ok bool, err error)
	Save(ctx context.Context, data []byte) error
	Delete(ctx context.Context) error
}

// snapshot is the stored form: the applied sequence (one shard) or the
// applied positions by shard (several: Applied is then 0), the format,
// and a checksum of the body. The derived views (timers, status sets,
// active roots, reports, retention) are recomputed from the body on load.
type snapshot struct {
	Format    int               `msgpack:"format"`
	Applied   events.Position   `msgpack:"applied"`
	Positions []events.Position `msgpack:"positions,omitempty"`
	Sum       []byte            `msgpack:"sum"`
	Body      []byte            `msgpack:"body"`
}

// body holds every task record and the usage view's recent admissions,
// which count tasks that retention may have evicted since.
type body struct {
	Tasks      []record               `msgpack:"tasks"`
	Admissions map[string][]time.Time `msgpack:"admissions"`
	Keys       []aggregate.KeyState   `msgpack:"keys,omitempty"`
	Freeing    []aggregate.State      `msgpack:"freeing,omitempty"` // the Free queue's tasks, as the views keep them
	Schedules  []scheduleRecord       `msgpack:"schedules,omitempty"`
	// Quarantined and QuarantinedCount are the views' quarantine.
	Quarantined      []Quarantined `msgpack:"quarantined,omitempty"`
	QuarantinedCount uint64        `msgpack:"quarantinedCount,omitempty"`
}

type record struct {
	State     aggregate.State `msgpack:"state"`
	Children  []string        `msgpack:"children"`
	ClosedSeq events.Position `msgpack:"closed,omitempty"`
}

// encodeSnapshot captures the views at the applied positions, by shard.
func encodeSnapshot(applied []events.Position, b body) ([]byte, error) {
	data, err := msgpack.Marshal(b)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	snap := snapshot{Format: SnapshotFormat, Sum: sum[:], Body: data}
	if len(applied) == 1 {
		snap.Applied = applied[0] // the format of the unsharded log
	} else {
		snap.Positions = applied
	}
	return msgpack.Marshal(snap)
}

// decodeSnapshot checks and decodes a snapshot; last are the shards' last
// positions, which a valid snapshot cannot be ahead of (nor have another
// number of).
func decodeSnapshot(data []byte, last []events.Position) (applied []events.Position, b body, err error) {
	var s snapshot
	if err := msgpack.Unmarshal(data, &s); err != nil {
		return nil, b, fmt.Errorf("%w: %v", ErrSnapshotChecksum, err)
	}
	if s.Format != SnapshotFormat {
		return nil, b, fmt.Errorf("%w: %d", ErrSnapshotFormat, s.Format)
	}
	if sum := sha256.Sum256(s.Body); !bytes.Equal(sum[:], s.Sum) {
		return nil, b, ErrSnapshotChecksum
	}
	applied = s.Positions
	if applied == nil {
		applied = []events.Position{s.Applied}
	}
	if len(applied) != len(last) {
		return nil, b, fmt.Errorf("%w: a snapshot of %d shards, the log has %d", ErrSnapshotFormat, len(applied), len(last))
	}
	shards := events.Shards{K: len(applied)}
	for i := range applied {
		if applied[i] != 0 && applied[i].Part(shards) != i {
			return nil, b, fmt.Errorf("%w: position %d in shard %d's place", ErrSnapshotFormat, applied[i], i)
		}
		if applied[i] > last[i] {
			return nil, b, fmt.Errorf("%w: snapshot at %d, stream ends at %d", ErrSnapshotAhead, applied[i], last[i])
		}
	}
	if err := msgpack.Unmarshal(s.Body, &b); err != nil {
		return nil, b, fmt.Errorf("%w: body: %v", ErrSnapshotChecksum, err)
	}
	return applied, b, nil
}

// body copies every task of the views, in creation order, and the
// recent admissions. The caller holds the views' lock throughout; a
// snapshot holds it only for freeze, and builds the body after.
func (v *views) body() body { return v.freeze().body() }

// frozen is the views' content copied as it is, cheaply enough to hold
// the views' lock for: the task records by value (the States, many times
// their size, are built from them after the lock is released) and the
// small rest as the body has it.
type frozen struct {
	tasks []frozenTask
	b     body // all but Tasks
}

// frozenTask is a task's record with copies of what changes in place
// (its extra fields and lists), so that t.state() gives the task as it
// was when it was frozen. What the record points to otherwise is never
// changed, only replaced.
type frozenTask struct {
	t      task
	labels map[string]string
	kind   string
}

// frozenExtra is a frozen task's extra fields and lists, copied.
type frozenExtra struct {
	x taskExtra
	l taskLists
}

// freeze copies the views' content; the caller holds their lock.
func (v *views) freeze() frozen {
	f := frozen{tasks: make([]frozenTask, len(v.tasks)), b: body{Admissions: make(map[string][]time.Time, len(v.admissions))}}
	i := 0
	for _, t := range v.tasks {
		ft := &f.tasks[i]
		ft.t, ft.labels, ft.kind = *t, v.labels.of[t.id], v.kinds.of[t.id]
		if t.extra != nil {
			fx := &frozenExtra{x: *t.extra}
			if t.extra.lists != nil {
				fx.l, fx.x.lists = *t.extra.lists, &fx.l
			}
			ft.t.extra = &fx.x
		}
		i++
	}
	for c, at := range v.admissions {
		f.b.Admissions[c] = slices.Clone(at)
	}
	f.b.Keys, f.b.Freeing = v.keyStates(), v.freeingStates()
	f.b.Schedules = v.records()
	f.b.Quarantined, f.b.QuarantinedCount = slices.Clone(v.quarantine.list), v.quarantine.count
	return f
}

// body builds the snapshot body from f; it needs no lock.
func (f frozen) body() body {
	b := f.b
	b.Tasks = make([]record, len(f.tasks))
	for i := range f.tasks {
		ft := &f.tasks[i]
		s := ft.t.state()
		s.Spec.Labels, s.Spec.Kind = ft.labels, ft.kind
		b.Tasks[i] = record{State: s, Children: slices.Clone(ft.t.children()), ClosedSeq: ft.t.closedSeq()}
	}
	slices.SortFunc(b.Tasks, func(a, b record) int { return cmp.Compare(a.State.FirstSeq, b.State.FirstSeq) })
	return b
}

// restore builds views from task records, recomputing every derived view
// exactly as applying the log would have.
func restore(b body, retain int, shards events.Shards) *views {
	v := newViews(retain, shards)
	records := b.Tasks
	for _, r := range records {
		t := &task{}
		t.setLists(nil, r.Children)
		t.setClosedSeq(r.ClosedSeq)
		t.set(&r.State)
		v.tasks[r.State.TaskID] = t
		v.labels.add(r.State.TaskID, r.State.Spec.Labels)
		v.kinds.add(r.State.TaskID, r.State.Spec.Kind)
		v.indexID(t)
	}
	var zero aggregate.State
	for _, r := range records {
		t, s := v.tasks[r.State.TaskID], &r.State
		v.reindex(t, &zero, s)
		if s.Status.Terminal() && s.Spec.ParentID != "" {
			if p := v.tasks[s.Spec.ParentID]; p != nil && awaitsReport(p, s.TaskID) {
				v.timers[Report].set(s.TaskID, s.CustomerID, s.CompletedAt)
			}
		}
		h := v.head(t)
		h.members++
		if !s.Status.Terminal() || v.timers[Report].has(s.TaskID) {
			h.open++
		}
	}
	for _, r := range records {
		if t := v.tasks[r.State.TaskID]; t.closedSeq() != 0 {
			p := v.part(t.closedSeq())
			p.closed = append(p.closed, closedLineage{head: r.State.TaskID, seq: t.closedSeq()})
			v.account(t.closedSeq(), int(t.members))
		}
	}
	for i := range v.parts {
		slices.SortFunc(v.parts[i].closed, func(a, b closedLineage) int { return cmp.Compare(a.seq, b.seq) })
	}
	for c, at := range b.Admissions {
		if len(at) > 0 {
			v.admissions[c] = at
		}
	}
	v.restoreKeys(b.Keys, b.Freeing)
	v.evict() // in case retain is smaller than when the snapshot was taken
	v.restoreSchedules(b.Schedules, v.timers[Fire])
	v.quarantine = quarantine{list: b.Quarantined, count: b.QuarantinedCount}
	return v
}

// ObjectSnapshots keeps the snapshot in a JetStream object store bucket.
type ObjectSnapshots struct {
	os   jetstream.ObjectStore
	name string
}

var _ SnapshotStore = (*ObjectSnapshots)(nil)

// OpenObjectSnapshots creates or opens bucket and keeps the snapshot in it
// under name.
func OpenObjectSnapshots(ctx context.Context, js jetstream.JetStream, bucket, name string, replicas int) (*ObjectSnapshots, error) {
	os, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: bucket, Description: "taskledger projection snapshots", Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("projections: snapshot bucket %s: %w", bucket, err)
	}
	return &ObjectSnapshots{os: os, name: name}, nil
}

// Load implements SnapshotStore.
func (s *ObjectSnapshots) Load(ctx context.Context) ([]byte, bool, error) {
	return ReadObject(ctx, s.os, s.name)
}

// The time ReadObject gives one read: readBase, and a second for every
// readRate bytes.
const (
	readBase  = 5 * time.Second
	readRate  = 10 << 20
	readTries = 5 // reads of an object replaced while being read
)

// ReadObject reads object name of os whole; false when there is none.
// nats.go reads the chunks of the version it looked up, and a save that
// replaces the object meanwhile purges them: the read then waits for them
// until its deadline, and a read given none would wait nats.go's default
// of a few seconds, which a large object can need more than. So each read
// has a deadline by the object's size, and a read that failed is tried
// again while the object it read has been replaced (at most readTries
// times).
func ReadObject(ctx context.Context, os jetstream.ObjectStore, name string) ([]byte, bool, error) {
	for try := 1; ; try++ {
		info, err := os.GetInfo(ctx, name)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		data, err := readVersion(ctx, os, name, readBase+time.Duration(info.Size/readRate)*time.Second)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return nil, false, nil
		}
		if err == nil {
			return data, true, nil
		}
		now, ierr := os.GetInfo(ctx, name)
		if ierr != nil || now.NUID == info.NUID || try == readTries {
			return nil, false, err
		}
	}
}

// readVersion reads the object's current version within timeout.
func readVersion(ctx context.Context, os jetstream.ObjectStore, name string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := os.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// Save implements SnapshotStore.
func (s *ObjectSnapshots) Save(ctx context.Context, data []byte) error {
	_, err := s.os.PutBytes(ctx, s.name, data)
	return err
}

// Delete implements SnapshotStore.
func (s *ObjectSnapshots) Delete(ctx context.Context) error {
	err := s.os.Delete(ctx, s.name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil
	}
	return err
}

// MemorySnapshots keeps the snapshot in memory: a restarted process has
// none. For tests, benchmarks and offline tools. The zero value is ready.
type MemorySnapshots struct {
	mu   sync.Mutex
	data []byte
	ok   bool
}

var _ SnapshotStore = (*MemorySnapshots)(nil)

// Load implements SnapshotStore.
func (s *MemorySnapshots) Load(context.Context) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.data), s.ok, nil
}

// Save implements SnapshotStore.
func (s *MemorySnapshots) Save(_ context.Context, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data, s.ok = bytes.Clone(data), true
	return nil
}

// Delete implements SnapshotStore.
func (s *MemorySnapshots) Delete(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data, s.ok = nil, false
	return nil
}

// snapshotPolicy says when the engine writes a snapshot.
type snapshotPolicy struct {
	every    uint64
	interval time.Duration
	lastSeq  uint64
	lastAt   time.Time
}

func (p *snapshotPolicy) due(applied uint64, now time.Time) bool {
	return applied > p.lastSeq && (applied-p.lastSeq >= p.every || now.Sub(p.lastAt) >= p.interval)
}
