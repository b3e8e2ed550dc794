package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
	"github.com/taskledger/taskledger/replay"
)

// KeyView is a concurrency key's holders and waiters (service.KeyView).
type KeyView = service.KeyView

// Concurrency returns customerID's concurrency key named key. A customer
// sees only its own keys: another customer's is ErrNotFound. An empty
// customerID is the caller's (the default customer for the operator). A
// key the log never saw has no holders and no waiters. It is safe for
// concurrent use.
func (s *feed) Concurrency(p Principal, customerID, key string) (KeyView, error) {
	if customerID == "" {
		customerID = p.CustomerID
		if p.IsOperator() {
			customerID = events.DefaultCustomer
		}
	}
	if err := events.ValidID(customerID); err != nil {
		return KeyView{}, invalid("customerId: %v", err)
	}
	if !p.IsOperator() && p.CustomerID != customerID {
		return KeyView{}, fmt.Errorf("%w: customer %s", aggregate.ErrNotFound, customerID)
	}
	if err := aggregate.ValidConcurrency(events.Concurrency{Key: key, Limit: events.MinConcurrencyLimit}); err != nil {
		return KeyView{}, err
	}
	_, holders, waiters := s.views.ConcurrencyKey(customerID, key, s.now())
	return KeyView{CustomerID: customerID, Key: key, Holders: holders, Waiters: waiters}, nil
}

// withSlots merges into a task's events, in log order, the events of its
// concurrency key that name it (when it took and gave back its slot).
func (s *feed) withSlots(ctx context.Context, st aggregate.State, evs []events.Event) ([]events.Event, error) {
	c := st.Spec.Concurrency
	if c == nil {
		return evs, nil
	}
	keyEvs, err := s.store.KeyHistory(ctx, st.CustomerID, c.Key)
	if err != nil {
		return nil, s.unavailable(err)
	}
	for _, ev := range keyEvs {
		if replay.SlotTask(ev) == st.TaskID {
			evs = append(evs, ev)
		}
	}
	slices.SortStableFunc(evs, func(a, b events.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	return evs, nil
}
