package projections

import (
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// TestHeartbeatExpiry: a claim with heartbeats is due in the Expire queue
// one interval after it was made; Renew moves it later without an event,
// never past the running deadline and never earlier, and only for the
// claim's own token; once the claim is lost the task leaves the queue.
func TestHeartbeatExpiry(t *testing.T) {
	t.Parallel()
	v := newViews(DefaultRetain, events.Shards{})
	e := &Engine{Views: Views{v: v}}
	var seq events.Position
	var s aggregate.State
	apply := func(cmd aggregate.Command, now time.Time) {
		t.Helper()
		evs, err := aggregate.Decide(s, cmd, now)
		if err != nil || len(evs) != 1 {
			t.Fatalf("%T: %v", cmd, err)
		}
		seq++
		evs[0].Seq = seq
		s = aggregate.Apply(s, evs[0])
		v.apply(evs[0])
	}
	expiry := func() time.Time {
		t.Helper()
		due, ok := e.DueOf(Expire, "t1")
		if !ok {
			t.Fatal("task not in the Expire queue")
		}
		return due
	}
	apply(aggregate.Schedule{TaskID: "t1", CustomerID: "c", Spec: events.TaskSpec{RootID: "t1", Queue: "q", TimeoutSeconds: 60, RunAt: at(0)}}, at(0))
	apply(aggregate.ReleaseDue{DeliveryID: "d1"}, at(0))
	apply(aggregate.Claim{DeliveryID: "d1", ExecutorID: "x", HeartbeatSeconds: 5}, at(1))
	if got := expiry(); !got.Equal(at(6)) {
		t.Fatalf("heartbeat due %v, want one interval after the claim %v", got, at(6))
	}
	if _, ok := e.Renew("t1", "other", at(3)); ok {
		t.Fatal("renewed under another token")
	}
	claimed := e.Digest()
	if _, ok := e.Renew("t1", "d1", at(3)); !ok || !expiry().Equal(at(8)) {
		t.Fatalf("renewed at 3: due %v, want %v", expiry(), at(8))
	}
	if e.Digest() != claimed {
		t.Fatal("a renewal (no event) changed the digest: a rebuild would not match it")
	}
	if _, ok := e.Renew("t1", "d1", at(2)); !ok || !expiry().Equal(at(8)) {
		t.Fatalf("an older renewal moved the due time to %v", expiry())
	}
	if _, ok := e.Renew("t1", "d1", at(59)); !ok || !expiry().Equal(at(61)) {
		t.Fatalf("renewed near the deadline: due %v, want the deadline %v", expiry(), at(61))
	}
	apply(aggregate.AppendMail{Message: events.Message{ID: "m1", Content: []events.ContentPart{{Type: "text", Text: "hi"}}}}, at(59))
	if got := expiry(); !got.Equal(at(61)) {
		t.Fatalf("an event that keeps the claim moved the renewed due time to %v", got)
	}
	apply(aggregate.LoseClaim{DeliveryID: "d1", Reason: events.ClaimLostReleased}, at(60))
	if _, ok := e.DueOf(Expire, "t1"); ok {
		t.Fatal("a released task is still in the Expire queue")
	}
	if _, ok := e.Renew("t1", "d1", at(60)); ok {
		t.Fatal("renewed a released claim")
	}
	if due, ok := e.DueOf(Release, "t1"); !ok || !due.Equal(at(60)) {
		t.Fatalf("released task due for release at %v %v, want at once", due, ok)
	}
}
