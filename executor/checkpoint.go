package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
)

// Checkpoint is an executor's durable progress on one task: the Run of
// the package doc ("The Run and Turn contract") in the shape every SDK and the
// scheduler share (api.RunState), plus the claim it belongs to. The
// worker saves it after every change, so a restarted executor resumes the
// run instead of starting over.
type Checkpoint struct {
	TaskID     string `json:"taskId"`
	DeliveryID string `json:"deliveryId"`
	api.RunState
	Done bool `json:"done,omitempty"` // the result was reported
}

// item returns the transcript item with id.
func (c *Checkpoint) item(id string) (api.TranscriptItem, bool) {
	for _, it := range c.Transcript {
		if it.ID == id {
			return it, true
		}
	}
	return api.TranscriptItem{}, false
}

func (c *Checkpoint) hasItem(id string) bool {
	_, ok := c.item(id)
	return ok
}

func (c *Checkpoint) stepDone(name string) bool { return slices.Contains(c.Steps, name) }

// clone returns a deep copy of c: c itself while it refers to nothing
// (a run that recorded nothing yet, the usual first and last save), a
// JSON round trip otherwise.
func (c *Checkpoint) clone() Checkpoint {
	if c.Transcript == nil && c.Contexts == nil && c.PendingTools == nil && c.Steps == nil && c.Effects == nil && c.Children == nil {
		return *c
	}
	b, _ := json.Marshal(c)
	var out Checkpoint
	json.Unmarshal(b, &out)
	return out
}

// CheckpointStore keeps checkpoints by task id. Implementations are safe
// for concurrent use. A Done checkpoint ends its run (the worker saves one
// once it reported the result or stopped): the executor-side stores
// delete the task's checkpoint, so Load then reports none and List omits
// it; SchedulerRuns writes nothing, as the scheduler keeps the last Run
// for audit and List omits the task once it has ended.
type CheckpointStore interface {
	// Load returns the checkpoint of taskID; ok is false if there is none.
	Load(ctx context.Context, taskID string) (cp Checkpoint, ok bool, err error)
	// Save stores cp under cp.TaskID, replacing what was there; a Done cp
	// ends it. ErrSuperseded (wrapped) means cp's claim no longer holds
	// the task: nothing was saved and the run must stop.
	Save(ctx context.Context, cp Checkpoint) error
	// List returns every stored checkpoint.
	List(ctx context.Context) ([]Checkpoint, error)
}

// KVCheckpoints stores checkpoints in a JetStream key-value bucket of the
// executor's own, an alternative to the scheduler's run routes
// (SchedulerRuns) for executors with NATS access.
type KVCheckpoints struct {
	kv jetstream.KeyValue
}

var _ CheckpointStore = (*KVCheckpoints)(nil)

// CheckpointTTL is how long a checkpoint is kept after its last save: a
// day past the longest run, whose task has timed out by then, so finished
// runs' checkpoints do not pile up.
const CheckpointTTL = (events.MaxTimeoutSeconds + 24*3600) * time.Second

// OpenKVCheckpoints creates or opens the bucket (default "TASKLEDGER_RUNS").
// Its entries expire CheckpointTTL after their last save.
func OpenKVCheckpoints(ctx context.Context, js jetstream.JetStream, bucket string) (*KVCheckpoints, error) {
	if bucket == "" {
		bucket = "TASKLEDGER_RUNS"
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: bucket, Description: "taskledger executor run checkpoints", Storage: jetstream.FileStorage, History: 1,
		TTL: CheckpointTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("executor: checkpoint bucket %s: %w", bucket, err)
	}
	return &KVCheckpoints{kv: kv}, nil
}

// Load implements CheckpointStore.
func (s *KVCheckpoints) Load(ctx context.Context, taskID string) (Checkpoint, bool, error) {
	e, err := s.kv.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, err
	}
	var cp Checkpoint
	if err := json.Unmarshal(e.Value(), &cp); err != nil {
		return Checkpoint{}, false, fmt.Errorf("checkpoint %s: %w", taskID, err)
	}
	return cp, true, nil
}

// Save implements CheckpointStore.
func (s *KVCheckpoints) Save(ctx context.Context, cp Checkpoint) error {
	if cp.Done {
		err := s.kv.Delete(ctx, cp.TaskID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		return err
	}
	b, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	_, err = s.kv.Put(ctx, cp.TaskID, b)
	return err
}

// undecodable reports whether err is a checkpoint's JSON that does not
// decode (written by an older SDK, whose transcript held ids only).
func undecodable(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syntax) || errors.As(err, &typ)
}

// List implements CheckpointStore; it skips entries that do not decode as
// a Checkpoint.
func (s *KVCheckpoints) List(ctx context.Context) ([]Checkpoint, error) {
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Checkpoint
	for k := range keys.Keys() {
		cp, ok, err := s.Load(ctx, k)
		if undecodable(err) {
			continue // not a checkpoint this SDK can resume (an older SDK's); its task times out
		}
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, cp)
		}
	}
	return out, nil
}

// MemoryCheckpoints keeps checkpoints in memory, for tests: runs survive
// a handler error, not a process restart. The zero value is ready to use.
type MemoryCheckpoints struct {
	mu sync.Mutex
	m  map[string][]byte
}

var _ CheckpointStore = (*MemoryCheckpoints)(nil)

// Load implements CheckpointStore.
func (s *MemoryCheckpoints) Load(_ context.Context, taskID string) (Checkpoint, bool, error) {
	s.mu.Lock()
	b, ok := s.m[taskID]
	s.mu.Unlock()
	var cp Checkpoint
	if ok {
		if err := json.Unmarshal(b, &cp); err != nil {
			return cp, false, err
		}
	}
	return cp, ok, nil
}

// Save implements CheckpointStore.
func (s *MemoryCheckpoints) Save(_ context.Context, cp Checkpoint) error {
	b, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string][]byte)
	}
	if cp.Done {
		delete(s.m, cp.TaskID)
	} else {
		s.m[cp.TaskID] = b
	}
	return nil
}

// List implements CheckpointStore.
func (s *MemoryCheckpoints) List(ctx context.Context) ([]Checkpoint, error) {
	s.mu.Lock()
	keys := make([]string, 0, len(s.m))
	for k := range s.m {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	var out []Checkpoint
	for _, k := range keys {
		if cp, ok, err := s.Load(ctx, k); err == nil && ok {
			out = append(out, cp)
		}
	}
	return out, nil
}
