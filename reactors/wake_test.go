package reactors

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

// TestAlarmWakeModel checks the alarm's wake-up against what it would
// act on, over random timer contents folded into a real projection
// engine (no server: the engine's Apply, as offline tools use it):
// tasks released, claimed, ended and freed at random, keyed ones on keys
// of limit 1 and 2, children reporting to their parents, and random
// items in flight. The sleep wait returns must never end after the
// earliest instant at which some timer queue's Due (with the alarm's own
// skip) hands out an item, or a failed action may be retried: else a due
// waiter on a full key (or any item the alarm skips) would delay every
// later item of its queue. And it must not be zero unless a round now
// acts: else the alarm would spin on items it does not act on.
func TestAlarmWakeModel(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		m := newWakeModel(rt)
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			m.step(rt)
		}
		m.check(rt)
	})
}

// wakeModel drives a projection engine through the aggregate, as the
// store would, and builds an alarm on it whose clocks stand still at now.
type wakeModel struct {
	now   time.Time
	eng   *projections.Engine
	seq   events.Position
	tasks map[string]aggregate.State
	keys  map[string]aggregate.KeyState
	ids   []string // the tasks, in the order they were scheduled
}

func newWakeModel(rt *rapid.T) *wakeModel {
	eng, err := projections.New(projections.Config{})
	if err != nil {
		rt.Fatal(err)
	}
	return &wakeModel{now: time.Unix(1_700_000_000, 0).UTC(), eng: eng,
		tasks: map[string]aggregate.State{}, keys: map[string]aggregate.KeyState{}}
}

// append folds the events a decision returned into the engine and the
// model's own states; a refused decision appends nothing.
func (m *wakeModel) append(rt *rapid.T, evs []events.Event, err error) bool {
	if err != nil {
		return false
	}
	for _, ev := range evs {
		m.seq++
		ev.ID = fmt.Sprintf("ev%d", m.seq)
		b, err := events.Encode(ev)
		if err != nil {
			rt.Fatalf("encode %s: %v", ev.Type(), err)
		}
		m.eng.Apply(m.seq, b)
		ev.Seq = m.seq
		if events.KeyEvent(ev.Type()) {
			m.keys[ev.TaskID] = aggregate.ApplyKey(m.keys[ev.TaskID], ev)
		} else {
			m.tasks[ev.TaskID] = aggregate.Apply(m.tasks[ev.TaskID], ev)
		}
	}
	return len(evs) > 0
}

// at is a time within a few seconds of now, whole tenths so ties occur.
func (m *wakeModel) at(rt *rapid.T, label string) time.Time {
	return m.now.Add(time.Duration(rapid.IntRange(-30, 30).Draw(rt, label)) * 100 * time.Millisecond)
}

func (m *wakeModel) pick(rt *rapid.T, ok func(aggregate.State) bool) (aggregate.State, bool) {
	var from []string
	for _, id := range m.ids {
		if ok(m.tasks[id]) {
			from = append(from, id)
		}
	}
	if len(from) == 0 {
		return aggregate.State{}, false
	}
	return m.tasks[rapid.SampledFrom(from).Draw(rt, "task")], true
}

func (m *wakeModel) step(rt *rapid.T) {
	decided := m.now.Add(-time.Minute)
	switch rapid.IntRange(0, 5).Draw(rt, "op") {
	case 0, 1: // schedule a root, or a child of a live task
		id := fmt.Sprintf("task%03d", len(m.ids)) // fixed ids: ties between due times break by id
		spec := events.TaskSpec{RootID: id, Queue: "q", TimeoutSeconds: rapid.IntRange(1, 5).Draw(rt, "timeout"), RunAt: m.at(rt, "runAt")}
		if p, ok := m.pick(rt, func(s aggregate.State) bool { return !s.Status.Terminal() }); ok && rapid.Bool().Draw(rt, "child") {
			spec.ParentID, spec.RootID = p.TaskID, p.Spec.RootID
		}
		switch rapid.IntRange(0, 2).Draw(rt, "key") {
		case 1:
			spec.Concurrency = &events.Concurrency{Key: "k1", Limit: 1}
		case 2:
			spec.Concurrency = &events.Concurrency{Key: "k2", Limit: 2}
		}
		customer := rapid.SampledFrom([]string{"c1", "c2"}).Draw(rt, "customer")
		if spec.ParentID != "" {
			customer = m.tasks[spec.ParentID].CustomerID
		}
		evs, err := aggregate.Decide(aggregate.State{}, aggregate.Schedule{TaskID: id, CustomerID: customer, Spec: spec}, decided)
		if m.append(rt, evs, err) {
			m.ids = append(m.ids, id)
		}
	case 2: // release a scheduled task as the alarm does: its slot first
		s, ok := m.pick(rt, func(s aggregate.State) bool { return s.Status == aggregate.StatusScheduled && s.Delivery.ID == "" })
		if !ok {
			return
		}
		cmd := aggregate.ReleaseDue{DeliveryID: "d" + s.TaskID, NextAt: m.at(rt, "nextAt")}
		if c := s.Spec.Concurrency; c != nil {
			cmd.Attempt = s.Attempt()
			kid := events.KeyID(s.CustomerID, c.Key)
			evs, err := aggregate.DecideKey(m.keys[kid], aggregate.AcquireSlot{CustomerID: s.CustomerID, Key: c.Key, TaskID: s.TaskID, Limit: c.Limit, Attempt: cmd.Attempt}, decided)
			if err != nil {
				return
			}
			m.append(rt, evs, nil)
		}
		evs, err := aggregate.Decide(s, cmd, decided)
		m.append(rt, evs, err)
	case 3: // its notification published, or the task claimed
		s, ok := m.pick(rt, func(s aggregate.State) bool {
			return s.Status == aggregate.StatusScheduled && s.Delivery.ID != "" || s.Status == aggregate.StatusQueued
		})
		if !ok {
			return
		}
		var cmd aggregate.Command = aggregate.MarkReadyPublished{DeliveryID: s.Delivery.ID, ReadySeq: uint64(m.seq) + 1}
		if s.Status == aggregate.StatusQueued && rapid.Bool().Draw(rt, "claim") {
			cmd = aggregate.Claim{DeliveryID: s.Delivery.ID, ExecutorID: "w"}
		}
		evs, err := aggregate.Decide(s, cmd, m.at(rt, "decided"))
		m.append(rt, evs, err)
	case 4: // a task ends
		s, ok := m.pick(rt, func(s aggregate.State) bool { return !s.Status.Terminal() })
		if !ok {
			return
		}
		var cmd aggregate.Command = aggregate.Cancel{Reason: "model"}
		if s.Status == aggregate.StatusRunning && rapid.Bool().Draw(rt, "result") {
			cmd = aggregate.RecordResult{DeliveryID: s.Delivery.ID, Result: events.Result{Success: true}}
		}
		evs, err := aggregate.Decide(s, cmd, m.at(rt, "ended"))
		m.append(rt, evs, err)
	case 5: // a finished holder's slot freed
		s, ok := m.pick(rt, func(s aggregate.State) bool { return s.Status.Terminal() && s.Spec.Concurrency != nil })
		if !ok {
			return
		}
		c := s.Spec.Concurrency
		evs, err := aggregate.DecideKey(m.keys[events.KeyID(s.CustomerID, c.Key)], aggregate.ReleaseSlot{CustomerID: s.CustomerID, Key: c.Key, TaskID: s.TaskID, Status: s.Status}, decided)
		m.append(rt, evs, err)
	}
}

// check builds an alarm on the engine with random items in flight and
// compares its wake-up with the earliest instant it would act on.
func (m *wakeModel) check(rt *rapid.T) {
	a, err := NewAlarm(AlarmConfig{Store: unusedStore{}, Projection: m.eng, Publisher: unusedPublisher{}, Now: func() time.Time { return m.now }})
	if err != nil {
		rt.Fatal(err)
	}
	var retry time.Time // the earliest retry of a failed action, if any
	for _, id := range m.ids {
		for t := range projections.Fire {
			var f flight
			switch rapid.IntRange(0, 9).Draw(rt, fmt.Sprintf("flight %s %s", t, id)) {
			case 0:
				f.running = true
			case 1:
				f.parked = true
			case 2:
				f.retryAt = m.at(rt, "retryAt")
				if f.retryAt.After(m.now) && (retry.IsZero() || f.retryAt.Before(retry)) {
					retry = f.retryAt
				}
			case 3:
				f.untilSeq = m.seq + 1 // an append the engine has not applied
			default:
				continue
			}
			a.inflight[key{t, id}] = f
		}
	}
	sk := a.newSkipper()
	sk.now, sk.wall, sk.owns = m.now, m.now, a.owns()
	got := a.wait(sk, 0, false)

	want := time.Hour
	if !retry.IsZero() {
		want = retry.Sub(m.now)
	}
	acts := !retry.IsZero() && want <= 0
	for t := range projections.Fire { // no Schedules: the alarm does not fire
		sk.timer = t
		if at, ok := m.firstActed(t, a.delay(t), sk.skip); ok {
			want = min(want, max(at.Sub(m.now), 0))
		}
		acts = acts || len(m.eng.Due(t, m.now.Add(-a.delay(t)), 1, sk.skip)) > 0
	}
	if got > want {
		rt.Fatalf("alarm sleeps %v, want at most %v (the earliest item it would act on, or retry)", got, want)
	}
	if got <= 0 && !acts {
		rt.Fatalf("alarm sleeps %v, but a round now acts on nothing: it would spin", got)
	}
}

// firstActed returns the earliest instant at which a round of the alarm
// would act on an item of timer queue t: the least T at which Due (at T
// less the queue's delay) hands out an item. Due's items only grow with T,
// so a binary search over the model's span of time finds it.
func (m *wakeModel) firstActed(t projections.Timer, delay time.Duration, skip func(string) bool) (time.Time, bool) {
	acts := func(at time.Time) bool { return len(m.eng.Due(t, at.Add(-delay), 1<<20, skip)) > 0 }
	lo, hi := m.now.Add(-time.Hour), m.now.Add(2*time.Hour)
	if !acts(hi) {
		return time.Time{}, false
	}
	for hi.Sub(lo) > time.Nanosecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if acts(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, true
}

var errUnused = errors.New("not used by the alarm's wake-up")

// unusedStore and unusedPublisher stand in for parts the wake-up never
// calls; every call fails.
type unusedStore struct{}

func (unusedStore) Execute(context.Context, string, string, aggregate.Command) (aggregate.State, []events.Event, error) {
	return aggregate.State{}, nil, errUnused
}
func (unusedStore) ExecuteSeen(context.Context, string, string, aggregate.Command, events.Position) (aggregate.State, []events.Event, error) {
	return aggregate.State{}, nil, errUnused
}
func (unusedStore) Load(context.Context, string) (aggregate.State, error) {
	return aggregate.State{}, errUnused
}
func (unusedStore) ExecuteKey(context.Context, aggregate.KeyCommand) (aggregate.KeyState, []events.Event, error) {
	return aggregate.KeyState{}, nil, errUnused
}

type unusedPublisher struct{}

func (unusedPublisher) PublishReady(context.Context, aggregate.State, string) (uint64, error) {
	return 0, errUnused
}
func (unusedPublisher) ReadyStored(context.Context, aggregate.State) (bool, error) {
	return false, errUnused
}
