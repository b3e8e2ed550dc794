package aggregate_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

const repoKey = "repo:example/storefront"

func keyEv(p events.Payload) events.Event {
	return events.Event{TaskID: events.KeyID(custID, repoKey), CustomerID: custID, At: t0, Data: p}
}

func acquire(task string, limit int) aggregate.AcquireSlot {
	return aggregate.AcquireSlot{CustomerID: custID, Key: repoKey, TaskID: task, Limit: limit}
}

func releaseSlot(task string) aggregate.ReleaseSlot {
	return aggregate.ReleaseSlot{CustomerID: custID, Key: repoKey, TaskID: task, Status: aggregate.StatusSucceeded}
}

func TestDecideKey(t *testing.T) {
	t.Parallel()
	one := []events.Event{keyEv(events.SlotAcquired{Key: repoKey, TaskID: "a", Limit: 2})}
	two := append(slices.Clone(one), keyEv(events.SlotAcquired{Key: repoKey, TaskID: "b", Limit: 2}))
	freed := append(slices.Clone(two), keyEv(events.SlotReleased{Key: repoKey, TaskID: "a", Status: "succeeded"}))
	second := []events.Event{keyEv(events.SlotAcquired{Key: repoKey, TaskID: "a", Limit: 2, Attempt: 2})}
	retried := func(before int) aggregate.ReleaseSlot {
		return aggregate.ReleaseSlot{CustomerID: custID, Key: repoKey, TaskID: "a", Status: aggregate.StatusScheduled, Before: before}
	}
	forAttempt := func(cmd aggregate.AcquireSlot, attempt int) aggregate.AcquireSlot { cmd.Attempt = attempt; return cmd }
	for _, tc := range []struct {
		name  string
		given []events.Event
		cmd   aggregate.KeyCommand
		want  events.Payload // nil: satisfied, nothing appended
		err   error
	}{
		{"FirstSlot", nil, acquire("a", 1), events.SlotAcquired{Key: repoKey, TaskID: "a", Limit: 1}, nil},
		{"SecondSlotUnderLimit", one, acquire("b", 2), events.SlotAcquired{Key: repoKey, TaskID: "b", Limit: 2}, nil},
		{"HolderAgainIsSatisfied", one, acquire("a", 1), nil, nil},
		{"Full", two, acquire("c", 2), nil, aggregate.ErrKeyFull},
		{"FullForASmallerLimit", one, acquire("c", 1), nil, aggregate.ErrKeyFull},
		{"RoomForALargerLimit", two, acquire("c", 3), events.SlotAcquired{Key: repoKey, TaskID: "c", Limit: 3}, nil},
		{"FreedSlotIsTaken", freed, acquire("c", 2), events.SlotAcquired{Key: repoKey, TaskID: "c", Limit: 2}, nil},
		{"Release", two, releaseSlot("a"), events.SlotReleased{Key: repoKey, TaskID: "a", Status: "succeeded"}, nil},
		{"ReleaseOfNoHolderIsSatisfied", freed, releaseSlot("a"), nil, nil},
		{"ReleaseOnEmptyKey", nil, releaseSlot("a"), nil, nil},
		{"RetriedReleasesItsLastAttemptsSlot", one, retried(2), events.SlotReleased{Key: repoKey, TaskID: "a", Status: "scheduled"}, nil},
		{"RetriedKeepsItsCurrentAttemptsSlot", second, retried(2), nil, nil},
		{"RetriedReleaseOfALaterAttemptsSlot", second, retried(3), events.SlotReleased{Key: repoKey, TaskID: "a", Status: "scheduled", Attempt: 2}, nil},
		{"TerminalReleasesAnyAttemptsSlot", second, releaseSlot("a"), events.SlotReleased{Key: repoKey, TaskID: "a", Status: "succeeded", Attempt: 2}, nil},
		{"SlotForASecondAttempt", freed, forAttempt(acquire("a", 2), 2), events.SlotAcquired{Key: repoKey, TaskID: "a", Limit: 2, Attempt: 2}, nil},
		{"FirstAttemptStoredAsZero", nil, forAttempt(acquire("a", 1), 1), events.SlotAcquired{Key: repoKey, TaskID: "a", Limit: 1}, nil},
		{"HolderOfAnEarlierAttemptWaits", one, forAttempt(acquire("a", 5), 2), nil, aggregate.ErrKeyFull},
		{"HolderOfALaterAttemptIsSatisfied", second, acquire("a", 2), nil, nil},
		{"EmptyKey", nil, aggregate.AcquireSlot{CustomerID: custID, TaskID: "a", Limit: 1}, nil, aggregate.ErrInvalid},
		{"HugeKey", nil, aggregate.AcquireSlot{CustomerID: custID, Key: strings.Repeat("k", 257), TaskID: "a", Limit: 1}, nil, aggregate.ErrInvalid},
		{"LimitZero", nil, acquire("a", 0), nil, aggregate.ErrInvalid},
		{"LimitTooLarge", nil, acquire("a", 1001), nil, aggregate.ErrInvalid},
		{"BadTaskID", nil, acquire("a b", 1), nil, aggregate.ErrInvalid},
		{"AnotherCustomersKeyState", one, aggregate.AcquireSlot{CustomerID: "cust-2", Key: repoKey, TaskID: "b", Limit: 2}, nil, aggregate.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var k aggregate.KeyState
			for _, e := range tc.given {
				k = aggregate.ApplyKey(k, e)
			}
			evs, err := aggregate.DecideKey(k, tc.cmd, t0)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if tc.want == nil {
				if len(evs) != 0 {
					t.Fatalf("appends %v, want nothing", evs)
				}
				return
			}
			if len(evs) != 1 || !reflect.DeepEqual(evs[0].Data, tc.want) {
				t.Fatalf("appends %v, want %v", evs, tc.want)
			}
			customer, _ := tc.cmd.Target()
			if e := evs[0]; e.TaskID != events.KeyID(customer, repoKey) || e.CustomerID != customer || e.Number != k.Version+1 {
				t.Fatalf("envelope %+v", e)
			}
		})
	}
}

func TestApplyKeyNeverDoublesAHolder(t *testing.T) {
	t.Parallel()
	k := aggregate.KeyState{}
	for _, e := range []events.Event{
		keyEv(events.SlotAcquired{Key: repoKey, TaskID: "a", Limit: 1}),
		keyEv(events.SlotAcquired{Key: repoKey, TaskID: "a", Limit: 1}),
		keyEv(events.SlotReleased{Key: repoKey, TaskID: "b"}),
	} {
		k = aggregate.ApplyKey(k, e)
	}
	if !reflect.DeepEqual(k.Holders, []string{"a"}) || k.Version != 3 {
		t.Fatalf("holders %v version %d", k.Holders, k.Version)
	}
}

// TestKeyModel runs random acquire and release commands against a key and
// a reference model (a set of holders and the limit rule), checking that
// the decided events, applied, agree with the model and that the holders
// never exceed the limit of the task that acquired last.
func TestKeyModel(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		var k aggregate.KeyState
		var holders []string              // the model: holders in acquisition order
		held := map[string]int{}          // and the attempt each holder's slot is for
		stored := func(attempt int) int { // as slot events store it: 0 for the first
			if attempt == 1 {
				return 0
			}
			return attempt
		}
		tasks := []string{"a", "b", "c", "d", "e", "f"}
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			task := rapid.SampledFrom(tasks).Draw(t, "task")
			var cmd aggregate.KeyCommand
			var want events.Payload
			var wantErr error
			if rapid.Bool().Draw(t, "acquire") {
				limit := rapid.IntRange(0, 4).Draw(t, "limit")
				attempt := rapid.IntRange(1, 3).Draw(t, "attempt")
				c := acquire(task, limit)
				c.Attempt = attempt
				cmd = c
				switch {
				case limit < 1:
					wantErr = aggregate.ErrInvalid
				case held[task] >= attempt:
				case held[task] > 0:
					wantErr = aggregate.ErrKeyFull
				case len(holders) >= limit:
					wantErr = aggregate.ErrKeyFull
				default:
					want = events.SlotAcquired{Key: repoKey, TaskID: task, Limit: limit, Attempt: stored(attempt)}
					holders, held[task] = append(holders, task), attempt
				}
			} else {
				c := releaseSlot(task)
				c.Before = rapid.IntRange(0, 3).Draw(t, "before") // 0: terminal
				cmd = c
				if i := slices.Index(holders, task); i >= 0 && (c.Before == 0 || held[task] < c.Before) {
					want = events.SlotReleased{Key: repoKey, TaskID: task, Status: "succeeded", Attempt: stored(held[task])}
					holders = slices.Delete(holders, i, i+1)
					delete(held, task)
				}
			}
			evs, err := aggregate.DecideKey(k, cmd, t0)
			if !errors.Is(err, wantErr) || (wantErr == nil) != (err == nil) {
				t.Fatalf("%+v: err = %v, want %v", cmd, err, wantErr)
			}
			if (want == nil) != (len(evs) == 0) || want != nil && !reflect.DeepEqual(evs[0].Data, want) {
				t.Fatalf("%+v: appends %v, want %v", cmd, evs, want)
			}
			for _, e := range evs {
				k = aggregate.ApplyKey(k, e)
			}
			if !slices.Equal(k.Holders, holders) {
				t.Fatalf("holders %v, model %v", k.Holders, holders)
			}
			for _, id := range tasks {
				if k.HeldFor(id) != held[id] {
					t.Fatalf("%s holds for attempt %d, model %d", id, k.HeldFor(id), held[id])
				}
			}
			if a, ok := want.(events.SlotAcquired); ok && len(k.Holders) > a.Limit {
				t.Fatalf("%d holders past limit %d", len(k.Holders), a.Limit)
			}
		}
	})
}
