package replay

import (
	"errors"
	"fmt"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Concurrency is the kind of violation of a concurrency key's promise: a
// slot taken past its limit or for an attempt the task has not reached, a
// keyed task released without holding a slot, a slot given back by a task
// that is still live and not waiting for a later attempt's release (the
// slot of a retried task's earlier attempt), or a slot event for a task
// that is not the key's customer's.
const Concurrency = "concurrency"

// addKey checks a concurrency key's event: on its key's subject, numbered
// and chained as a task's, and exactly what DecideKey decides on the key
// as its earlier events left it, for a task of the key's customer.
//
// On a sharded log a task and its key may be in two shards, read one
// after the other: there the verifier checks the key's own rules (its
// subject, numbers, chain and limit) in its stream's order, and that the
// task exists with that key at the log's end; what the task's state was
// at the key event's moment has no order across shards to check against.
func (v *Verifier) addKey(ev events.Event, subject string, shard int) {
	var cmd aggregate.KeyCommand
	var taskID, key string
	var attempt int // the slot's attempt
	switch p := ev.Data.(type) {
	case events.SlotAcquired:
		taskID, key, attempt = p.TaskID, p.Key, max(p.Attempt, 1)
		cmd = aggregate.AcquireSlot{CustomerID: ev.CustomerID, Key: p.Key, TaskID: p.TaskID, Limit: p.Limit, Attempt: p.Attempt}
	case events.SlotReleased:
		taskID, key, attempt = p.TaskID, p.Key, max(p.Attempt, 1)
		cmd = aggregate.ReleaseSlot{CustomerID: ev.CustomerID, Key: p.Key, TaskID: p.TaskID, Status: aggregate.Status(p.Status)}
	}
	if _, dup := v.ids[ev.ID]; dup {
		v.fail(ev.Seq, ev.TaskID, DuplicateEvent, "event id %s seen before", ev.ID)
	}
	v.ids[ev.ID] = struct{}{}
	keyID := events.KeyID(ev.CustomerID, key)
	if want := v.shards.Subjects(v.subjects, shard).Key(ev.CustomerID, keyID); subject != want || ev.TaskID != keyID {
		v.fail(ev.Seq, ev.TaskID, WrongSubject, "key event of %q stored on %s as %s, belongs on %s", key, subject, ev.TaskID, want)
	}
	if want := v.shards.Of(ev.CustomerID, keyID); want != shard {
		v.fail(ev.Seq, ev.TaskID, WrongSubject, "key event of %q stored in shard %d, belongs in shard %d", key, shard, want)
	}
	k := v.keys[ev.TaskID]
	if k == nil {
		k = &aggregate.KeyState{}
		v.keys[ev.TaskID] = k
	}
	if prev := v.numbers[ev.TaskID]; ev.Number != prev+1 {
		v.fail(ev.Seq, ev.TaskID, Gap, "event number %d after %d", ev.Number, prev)
	}
	v.numbers[ev.TaskID] = ev.Number
	if ev.Version >= 2 && ev.Prev != k.LastHash {
		v.fail(ev.Seq, ev.TaskID, BrokenLink, "event %d names previous hash %s, the key's previous event hashes to %s", ev.Number, short(ev.Prev), short(k.LastHash))
	}
	defer func() { *k = aggregate.ApplyKey(*k, ev) }()
	st := v.tasks[taskID]
	if v.shards.N() > 1 && (st == nil || v.partOfTask(*st) != shard) {
		v.slotUsers = append(v.slotUsers, slotUser{seq: ev.Seq, keyID: ev.TaskID, taskID: taskID, customerID: ev.CustomerID, key: key})
		if _, err := aggregate.DecideKey(*k, cmd, ev.At); errors.Is(err, aggregate.ErrKeyFull) {
			v.fail(ev.Seq, ev.TaskID, Concurrency, "task %s took a slot of %q past its limit: %v", taskID, key, err)
		}
		return
	}
	switch {
	case st == nil || !st.Exists() || st.CustomerID != ev.CustomerID:
		v.fail(ev.Seq, ev.TaskID, Concurrency, "%s for task %s, which customer %s has not scheduled", ev.Type(), taskID, ev.CustomerID)
		return
	case st.Spec.Concurrency == nil || st.Spec.Concurrency.Key != key:
		v.fail(ev.Seq, ev.TaskID, Concurrency, "%s for task %s, which has no concurrency key %q", ev.Type(), taskID, key)
		return
	case ev.Type() == events.TypeSlotReleased && !st.Status.Terminal() &&
		(attempt >= st.Attempt() || st.Status != aggregate.StatusScheduled || st.Delivery.ID != ""):
		v.fail(ev.Seq, ev.TaskID, Concurrency, "task %s gave the slot of its attempt %d back while %s at attempt %d", taskID, attempt, st.Status, st.Attempt())
		return
	case ev.Type() == events.TypeSlotAcquired && attempt > st.Attempt():
		v.fail(ev.Seq, ev.TaskID, Concurrency, "task %s took a slot for attempt %d at attempt %d", taskID, attempt, st.Attempt())
		return
	}
	if c, ok := cmd.(aggregate.ReleaseSlot); ok && !st.Status.Terminal() {
		c.Before = st.Attempt()
		cmd = c
	}
	got, err := aggregate.DecideKey(*k, cmd, ev.At)
	switch {
	case errors.Is(err, aggregate.ErrKeyFull):
		v.fail(ev.Seq, ev.TaskID, Concurrency, "task %s took a slot of %q past its limit: %v", taskID, key, err)
	case err != nil:
		v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s: %v", ev.Type(), err)
	case len(got) != 1:
		v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s for task %s changes nothing (a duplicate)", ev.Type(), taskID)
	case got[0].Data != ev.Data:
		v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s for task %s is %+v, its key decides %+v", ev.Type(), taskID, ev.Data, got[0].Data)
	}
}

// checkSlot reports a keyed task released (DeliveryPending) without
// holding a slot of its key at that point of the log. (The slot is for
// the task's attempt, except in logs written before a retried task gave
// its last attempt's slot back, where it kept that slot.)
func (v *Verifier) checkSlot(st aggregate.State, ev events.Event, shard int) {
	c := st.Spec.Concurrency
	if _, ok := ev.Data.(events.DeliveryPending); !ok || c == nil {
		return
	}
	if v.shards.Of(st.CustomerID, events.KeyID(st.CustomerID, c.Key)) != shard {
		return // the key's stream has no order against this one (addKey)
	}
	if k := v.keys[events.KeyID(st.CustomerID, c.Key)]; k == nil || !k.Holds(st.TaskID) {
		v.fail(ev.Seq, ev.TaskID, Concurrency, "released without a slot of its concurrency key %q", c.Key)
	}
}

// slotUser is a task a key event names from another shard of a sharded
// log.
type slotUser struct {
	seq                            events.Position
	keyID, taskID, customerID, key string
}

// slotUserProblem says what is wrong with u at the log's end, or
// returns "".
func (v *Verifier) slotUserProblem(u slotUser) string {
	switch st := v.tasks[u.taskID]; {
	case (st == nil || !st.Exists()) && v.partial:
		return ""
	case st == nil || !st.Exists() || st.CustomerID != u.customerID:
		return fmt.Sprintf("a slot of %q for task %s, which customer %s has not scheduled", u.key, u.taskID, u.customerID)
	case st.Spec.Concurrency == nil || st.Spec.Concurrency.Key != u.key:
		return fmt.Sprintf("a slot of %q for task %s, which has no such concurrency key", u.key, u.taskID)
	}
	return ""
}
