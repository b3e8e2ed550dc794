package projections

import (
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
)

// TestDigestOfThePositionAlone: the alarm postponing a queued task's
// republish check (no event) leaves the digest as the log gives it, so
// the live projections, a fold of the same log and a snapshot restored
// from them agree.
func TestDigestOfThePositionAlone(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	spec := events.TaskSpec{RootID: "r1", Queue: "q", RunAt: at, TimeoutSeconds: 60,
		Message: events.Message{CreatedAt: at, Content: []events.ContentPart{{Type: "text", Text: "x"}}}}
	var log [][]byte
	for i, p := range []events.Payload{
		events.TaskScheduled{Spec: spec},
		events.DeliveryPending{DeliveryID: "d1", Attempt: 1, NextAt: at},
		events.ReadyPublished{DeliveryID: "d1", ReadySeq: 1},
	} {
		b, err := events.Encode(events.Event{ID: "e" + string(rune('1'+i)), TaskID: "r1", CustomerID: "a", Number: i + 1, At: at, Data: p})
		if err != nil {
			t.Fatal(err)
		}
		log = append(log, b)
	}
	fold := func() *Engine {
		e, _ := New(Config{})
		for i, b := range log {
			e.Apply(events.Position(i+1), b)
		}
		return e
	}
	live := fold()
	if live.TimerLen(Republish) != 1 {
		t.Fatalf("the queued task is not in the republish queue")
	}
	before := live.Digest()
	live.Postpone(Republish, "r1", at.Add(5*time.Minute))
	if next, ok := live.Next(Republish, at.Add(time.Hour), nil); !ok || !next.Equal(at.Add(5*time.Minute)) {
		t.Fatalf("republish check due %v %v, want postponed", next, ok)
	}
	if got := live.Digest(); got != before {
		t.Fatal("postponing the republish check changed the digest")
	}
	if got := fold().Digest(); got != before {
		t.Fatal("a fold of the same log has another digest")
	}
	data, err := encodeSnapshot(live.Positions(), live.v.body())
	if err != nil {
		t.Fatal(err)
	}
	applied, b, err := decodeSnapshot(data, live.Positions())
	if err != nil {
		t.Fatal(err)
	}
	restored, _ := New(Config{})
	restored.v = restore(b, live.cfg.Retain, events.Shards{})
	restored.setApplied(applied[0])
	if got := restored.Digest(); got != before {
		t.Fatal("the projections restored from a snapshot have another digest")
	}
}
