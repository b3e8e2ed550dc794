package reactors_test

import (
	"sync"
	"testing"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/reactors"
)

// handPartitions owns the keys it is given; Give adds some and signals
// Changed, as a lease taken would.
type handPartitions struct {
	mu      sync.Mutex
	owned   map[string]bool
	changed chan struct{}
}

var _ reactors.Partitions = (*handPartitions)(nil)

func (h *handPartitions) Owns() func(string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	owned := make(map[string]bool, len(h.owned))
	for k := range h.owned {
		owned[k] = true
	}
	return func(key string) bool { return owned[key] }
}

func (h *handPartitions) Changed() <-chan struct{} { return h.changed }

func (h *handPartitions) Give(keys ...string) {
	h.mu.Lock()
	for _, k := range keys {
		h.owned[k] = true
	}
	h.mu.Unlock()
	h.changed <- struct{}{}
}

// TestAlarmActsOnOwnedPartitionsOnly: the alarm releases only the tasks
// its Partitions owns; a task it gains later is released once Changed is
// signalled, though nothing else wakes the alarm.
func TestAlarmActsOnOwnedPartitionsOnly(t *testing.T) {
	t.Parallel()
	p := alStart(t, testnats.NewNamespace(t))
	parts := &handPartitions{owned: map[string]bool{}, changed: make(chan struct{}, 1)}
	var mine, others []string
	for i := range 10 {
		id := p.schedule(alSpec{}).TaskID
		if i%2 == 0 {
			mine = append(mine, id)
			parts.owned[id] = true
		} else {
			others = append(others, id)
		}
	}
	p.startAlarm(reactors.AlarmConfig{Partitions: parts}, nil)
	for _, id := range mine {
		p.waitStatus(id, aggregate.StatusQueued)
	}
	// The alarm released its own in rounds that saw the others due too.
	for _, id := range others {
		if st := p.status(id); st != aggregate.StatusScheduled {
			t.Fatalf("task %s of another partition is %s: the alarm acted on it", id, st)
		}
	}
	parts.Give(others...)
	for _, id := range others {
		p.waitStatus(id, aggregate.StatusQueued)
	}
}
