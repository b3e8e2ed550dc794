package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/internal/eventlog"
)

// Epochs returns the epoch slots as the store last read them (the zero
// value without epochs).
func (s *Store) Epochs() eventlog.Epochs {
	if e := s.epochs.Load(); e != nil {
		return *e
	}
	return eventlog.Epochs{}
}

// RefreshEpochs reads the epoch slots again (a process that advanced,
// sealed or removed one changed them). The node calls it every epoch
// check.
func (s *Store) RefreshEpochs(ctx context.Context) error {
	if s.shards.Slots == 0 {
		return nil
	}
	e, ok, err := eventlog.ReadEpochs(ctx, s.js, s.cfg.Stream)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("eventlog: the log's epochs entry is gone")
	}
	s.epochs.Store(&e)
	return nil
}

// creationPart returns the part a new task of customerID starts in: a
// new lineage (taskID is rootID) in the current epoch's slot, a child in
// its root's part.
func (s *Store) creationPart(ctx context.Context, customerID, taskID, rootID string) (int, error) {
	shard := s.shards.Of(customerID, rootID)
	if s.shards.Slots == 0 {
		return shard, nil
	}
	if taskID == rootID {
		return s.shards.Part(s.Epochs().Current, shard), nil
	}
	part, ok, err := s.rootPart(ctx, customerID, rootID)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("eventlog: the root %s of task %s is in no live epoch", rootID, taskID)
	}
	return part, nil
}

// rootPart returns the part holding root task rootID of customerID: the
// projections' (Locate), else the first slot whose shard Of(customerID,
// rootID) holds its subject; false when no slot does.
func (s *Store) rootPart(ctx context.Context, customerID, rootID string) (int, bool, error) {
	if s.cfg.Locate != nil {
		if _, _, first, ok := s.cfg.Locate(rootID); ok {
			part, _ := s.shards.Split(first)
			return part, true, nil
		}
	}
	shard := s.shards.Of(customerID, rootID)
	for _, slot := range s.Epochs().SlotsToRead() {
		part := s.shards.Part(slot, shard)
		_, _, ok, err := s.parts[part].Get.NextMsg(ctx, s.parts[part].Subjects.Event(customerID, rootID), 1)
		if err != nil || ok {
			return part, ok, err
		}
	}
	return 0, false, nil
}
