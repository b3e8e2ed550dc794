package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
	"github.com/taskledger/taskledger/projections"
)

// The log's health: its chain head, the damage found at start, and the
// watch that recovers from storage errors.

// headObject is the object of the snapshot bucket that holds the log's
// chain head (eventlog.Head as JSON; a sharded log's, a JSON array of one
// head a shard).
const headObject = "chainhead"

// LoadHead returns the chain head saved for stream, the first when a
// sharded log saved one a shard (LoadHeads); ok is false when none was.
func LoadHead(ctx context.Context, js jetstream.JetStream, stream string) (h eventlog.Head, ok bool, err error) {
	hs, err := LoadHeads(ctx, js, stream)
	if err != nil || len(hs) == 0 {
		return h, false, err
	}
	return hs[0], true, nil
}

// LoadHeads returns the chain heads saved for stream: one, or on a
// sharded log one a shard that held events; none when none was saved (no
// snapshot bucket, or nothing saved yet). It creates nothing.
func LoadHeads(ctx context.Context, js jetstream.JetStream, stream string) ([]eventlog.Head, error) {
	bucket, err := js.ObjectStore(ctx, SnapshotBucket(stream))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node: snapshot bucket: %w", err)
	}
	data, ok, err := projections.ReadObject(ctx, bucket, headObject)
	if err != nil {
		return nil, fmt.Errorf("node: chain head: %w", err)
	}
	if !ok {
		return nil, nil
	}
	var hs []eventlog.Head
	if len(data) > 0 && data[0] == '[' {
		err = json.Unmarshal(data, &hs)
	} else {
		hs = make([]eventlog.Head, 1)
		err = json.Unmarshal(data, &hs[0])
	}
	if err != nil {
		return nil, fmt.Errorf("node: chain head: %w", err)
	}
	return hs, nil
}

// SaveHead saves the chain heads of stream at positions (by shard; nil:
// at every shard's last event) in heads: one head as an object, as
// before sharding, several as an array. An empty log saves nothing.
func SaveHead(ctx context.Context, log eventlog.Log, heads projections.SnapshotStore, positions []events.Position) error {
	hs, err := log.HeadsAt(ctx, positions)
	if err != nil || len(hs) == 0 {
		return err
	}
	var data []byte
	if log.Shards.N() == 1 {
		data, err = json.Marshal(hs[0])
	} else {
		data, err = json.Marshal(hs)
	}
	if err != nil {
		return err
	}
	return heads.Save(ctx, data)
}

// ErrLogLost is returned by New for a log whose streams hold no event
// though its saved chain head says they held some (eventlog.ErrLogEmpty),
// unless Config.AllowEmptyLog: the stream was deleted or purged, and
// starting would serve an empty log as if nothing had happened.
var ErrLogLost = errors.New("node: the event stream is empty or was deleted, but its saved chain head says it held events: restore the stream (from a backup of the data directory or a NATS stream backup) and start again, or start with --allow-empty-log to accept the loss and begin an empty log")

// checkHead checks the log for holes and compares it with its saved
// chain head; it returns a warning, also logged, when the log is damaged,
// and ErrLogLost (wrapped) when it lost every event, unless
// Config.AllowEmptyLog.
func checkHead(ctx context.Context, cfg Config, st *store.Store) (string, error) {
	hs, err := LoadHeads(ctx, st.JetStream(), cfg.Stream)
	if err == nil {
		err = st.Log().CheckHeads(ctx, hs)
	}
	switch {
	case errors.Is(err, eventlog.ErrLogEmpty) && !cfg.AllowEmptyLog:
		return "", fmt.Errorf("%w: %w", ErrLogLost, err)
	case errors.Is(err, eventlog.ErrEventsMissing) || errors.Is(err, eventlog.ErrLogTruncated) || errors.Is(err, eventlog.ErrHeadMismatch):
		cfg.Logger.Warn().Err(err).Msg("the log is damaged: events were lost or changed; run taskledger replay verify")
		return err.Error() + "; run taskledger replay verify", nil
	case err != nil:
		cfg.Logger.Warn().Err(err).Msg("chain head not checked")
	}
	return "", nil
}

// StreamsError implements httpapi.LogHealth: nil while every stream of
// the log exists and holds the events the projections applied
// (eventlog.Log.CheckStreams), else what is wrong — a stream deleted or
// emptied under the running process, which answers 503 to every call
// that needs it. It costs one JetStream API request a page of 256
// streams; ctx bounds it.
func (n *Node) StreamsError(ctx context.Context) error {
	return n.Store.Log().CheckStreams(ctx, n.Engine.Positions())
}

// WriteError implements httpapi.LogHealth: the store's failed appends,
// or the server's storage error as watchStorage last saw it.
func (n *Node) WriteError() error {
	if err := n.Store.WriteError(); err != nil {
		return err
	}
	if err := n.serverErr.Load(); err != nil {
		return *err
	}
	return nil
}

// LogWarning implements httpapi.LogHealth: why the log was found damaged
// at start (no saved chain head, a hole) or while the projections read
// it, and the events its keyed chain's checks found forged, or "".
func (n *Node) LogWarning() string {
	warning := n.logWarning
	if m := n.Engine.Missing(); m > 0 {
		warning = strings.TrimPrefix(warning+"; ", "; ") + fmt.Sprintf("%d sequences of the log hold no event; run taskledger replay verify", m)
	}
	if q, _ := n.Engine.Quarantined(0); q > 0 {
		warning = strings.TrimPrefix(warning+"; ", "; ") + fmt.Sprintf("messages of the log that do not decode, quarantined (skipped): %d; run taskledger replay quarantine", q)
	}
	if c := n.chain.warning(); c != "" {
		warning = strings.TrimPrefix(warning+"; ", "; ") + c
	}
	return warning
}

// Quarantine implements httpapi.LogHealth: the messages of the log the
// projections skipped because they do not decode, the first
// api.MaxQuarantined of them listed.
func (n *Node) Quarantine() api.QuarantineStats {
	count, list := n.Engine.Quarantined(api.MaxQuarantined)
	out := api.QuarantineStats{Count: count, Sequences: make([]api.QuarantinedEntry, len(list))}
	for i, q := range list {
		out.Sequences[i] = api.QuarantinedEntry{Seq: uint64(q.Pos), Reason: q.Reason}
	}
	return out
}

// storageError is cfg.StorageError's answer, nil without one.
func (n *Node) storageError() error {
	if n.cfg.StorageError == nil {
		return nil
	}
	return n.cfg.StorageError()
}

// watchStorage runs until ctx ends. Every StorageRetry it asks the
// server for its storage error and, while appends fail, probes the log (a
// probe that succeeds makes the store take writes again). While the
// server reports an error or the probe fails, it calls RecoverStorage
// (a JetStream restart: it reopens a stream that keeps a write error)
// and checks both again. It logs when writes start failing and when they
// recover, never per request or per attempt.
func (n *Node) watchStorage(ctx context.Context) {
	tick := time.NewTicker(n.cfg.StorageRetry)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		serverErr := n.storageError()
		// A probe that succeeds clears the store's error.
		appendsFail := n.Store.WriteError() != nil && n.Store.Probe(ctx) != nil
		if (serverErr != nil || appendsFail) && n.cfg.RecoverStorage != nil {
			if err := n.cfg.RecoverStorage(); err != nil {
				n.cfg.Logger.Debug().Err(err).Msg("storage recovery failed")
			}
			if serverErr = n.storageError(); n.Store.WriteError() != nil {
				n.Store.Probe(ctx)
			}
		}
		if serverErr != nil {
			n.serverErr.Store(&serverErr)
		} else {
			n.serverErr.Store(nil)
		}
		err := n.WriteError()
		switch {
		case err != nil && !failing:
			n.cfg.Logger.Error().Err(err).Msg("the log does not take writes: appends answer 503 and /readyz 503 until it does")
		case err == nil && failing:
			n.cfg.Logger.Info().Msg("the log takes writes again")
		}
		failing = err != nil
	}
}
