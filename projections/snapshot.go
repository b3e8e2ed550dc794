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
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/taskledger/taskledger/aggregate"
)

// SnapshotFormat is the version of the snapshot encoding. A snapshot of
// another format is ignored (and the projections rebuilt from the log).
const SnapshotFormat = 1

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

// snapshot is the stored form: the applied sequence, the format, and a
// checksum of the body, which holds every task record. The derived views
// (timers, status sets, usage, reports) are recomputed on load.
type snapshot struct {
	Format  int    `msgpack:"format"`
	Applied uint64 `msgpack:"applied"`
	Sum     []byte `msgpack:"sum"`
	Body    []byte `msgpack:"body"`
}

type record struct {
	State    aggregate.State `msgpack:"state"`
	Children []string        `msgpack:"children"`
}

// encodeSnapshot captures the views at applied.
func encodeSnapshot(applied uint64, records []record) ([]byte, error) {
	body, err := msgpack.Marshal(records)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	return msgpack.Marshal(snapshot{Format: SnapshotFormat, Applied: applied, Sum: sum[:], Body: body})
}

// decodeSnapshot checks and decodes a snapshot; lastSeq is the stream's
// last sequence, which a valid snapshot cannot be ahead of.
func decodeSnapshot(data []byte, lastSeq uint64) (applied uint64, records []record, err error) {
	var s snapshot
	if err := msgpack.Unmarshal(data, &s); err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrSnapshotChecksum, err)
	}
	if s.Format != SnapshotFormat {
		return 0, nil, fmt.Errorf("%w: %d", ErrSnapshotFormat, s.Format)
	}
	if sum := sha256.Sum256(s.Body); !bytes.Equal(sum[:], s.Sum) {
		return 0, nil, ErrSnapshotChecksum
	}
	if s.Applied > lastSeq {
		return 0, nil, fmt.Errorf("%w: snapshot at %d, stream ends at %d", ErrSnapshotAhead, s.Applied, lastSeq)
	}
	if err := msgpack.Unmarshal(s.Body, &records); err != nil {
		return 0, nil, fmt.Errorf("%w: body: %v", ErrSnapshotChecksum, err)
	}
	return s.Applied, records, nil
}

// records returns every task of the views, in creation order.
func (v *views) records() []record {
	out := make([]record, 0, len(v.tasks))
	for _, t := range v.tasks {
		out = append(out, record{State: t.state, Children: slices.Clone(t.children)})
	}
	slices.SortFunc(out, func(a, b record) int { return cmp.Compare(a.State.FirstSeq, b.State.FirstSeq) })
	return out
}

// restore builds views from task records, recomputing every derived view
// exactly as applying the log would have.
func restore(records []record) *views {
	v := newViews()
	for _, r := range records {
		t := &task{state: r.State, children: r.Children}
		v.tasks[r.State.TaskID] = t
	}
	var zero aggregate.State
	for _, r := range records {
		t := v.tasks[r.State.TaskID]
		v.admit(&t.state, t.state.CreatedAt)
		v.reindex(&zero, &t.state)
		if s := &t.state; s.Status.Terminal() && s.Spec.ParentID != "" {
			if p := v.tasks[s.Spec.ParentID]; p != nil && !p.state.Status.Terminal() && p.state.MailIndex(ChildResultID(s.TaskID)) == 0 {
				v.timers[Report].set(s.TaskID, s.CustomerID, s.CompletedAt)
			}
		}
	}
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
	r, err := s.os.Get(ctx, s.name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, false, err
	}
	return data, true, nil
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
