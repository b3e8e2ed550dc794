package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/ready"
)

// dispatchEnv is a ready stream with one queue's consumer and a
// Dispatcher on it, on the package's real NATS server.
type dispatchEnv struct {
	js jetstream.JetStream
	ns testnats.Namespace
	d  *Dispatcher
}

func newDispatchEnv(t *testing.T) *dispatchEnv {
	t.Helper()
	ctx := context.Background()
	ns := testnats.NewNamespace(t)
	js, err := jetstream.New(testnats.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: ns.ReadyStream, Subjects: []string{ns.Subjects.AllReady()}, Retention: jetstream.WorkQueuePolicy,
	}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, ns.ReadyStream, ready.ConsumerConfig(ns.Subjects, "q", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	d := newDispatcher(cons, zerolog.Nop())
	t.Cleanup(d.stop)
	return &dispatchEnv{js: js, ns: ns, d: d}
}

// publish puts one notification per task id on the queue.
func (e *dispatchEnv) publish(t *testing.T, customer string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		b, _ := json.Marshal(events.ReadyNotification{TaskID: id, CustomerID: customer, Queue: "q", DeliveryID: "d-" + id})
		if _, err := e.js.Publish(context.Background(), e.ns.Subjects.Ready("q"), b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDispatcherHandsEachNotificationOnce has many claimers wait on one
// queue while notifications arrive: every notification reaches exactly
// one claimer, and none is lost.
func TestDispatcherHandsEachNotificationOnce(t *testing.T) {
	t.Parallel()
	e := newDispatchEnv(t)
	const waiters, notes = 500, 300
	var mu sync.Mutex
	got := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var g errgroup.Group
	for range waiters {
		g.Go(func() error {
			for {
				msg, n, err := e.d.next(ctx, "")
				if err != nil {
					return nil // the test's end
				}
				msg.Ack()
				mu.Lock()
				got[n.TaskID]++
				all := len(got) == notes
				mu.Unlock()
				if all {
					cancel()
				}
			}
		})
	}
	ids := make([]string, notes)
	for i := range ids {
		ids[i] = fmt.Sprintf("t%03d", i)
	}
	e.publish(t, "acme", ids...)
	g.Wait()
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("notification %s reached %d claimers, want 1 (of %d seen)", id, got[id], len(got))
		}
	}
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("not every notification arrived: %d of %d (%v)", len(got), notes, err)
	}
}

// TestDispatcherRoutesByCustomer gives a customer's claimer only its own
// customer's notifications, an operator any, and loses none of them.
func TestDispatcherRoutesByCustomer(t *testing.T) {
	t.Parallel()
	e := newDispatchEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.publish(t, "globex", "g1", "g2")
	e.publish(t, "acme", "a1")
	msg, n, err := e.d.next(ctx, "acme")
	if err != nil || n.TaskID != "a1" {
		t.Fatalf("acme's claimer got %+v, %v; want a1", n, err)
	}
	msg.Ack()
	seen := map[string]bool{}
	for range 2 {
		msg, n, err := e.d.next(ctx, "")
		if err != nil || n.CustomerID != "globex" {
			t.Fatalf("operator got %+v, %v; want a globex task passed over by acme", n, err)
		}
		msg.Ack()
		seen[n.TaskID] = true
	}
	if !seen["g1"] || !seen["g2"] {
		t.Fatalf("operator got %v, want g1 and g2 (none lost)", seen)
	}
}

// TestDispatcherHandsBackWhenNobodyWaits: a notification that arrives
// after its claimer gave up is not left unacknowledged for the ack wait (a
// minute here): the next claimer gets it, from the Dispatcher's parking
// or, once that expired, from the consumer.
func TestDispatcherHandsBackWhenNobodyWaits(t *testing.T) {
	t.Parallel()
	e := newDispatchEnv(t)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := e.d.next(short, ""); err == nil {
		t.Fatal("a claimer got a notification from an empty queue")
	}
	e.publish(t, "acme", "late") // the pull started for the gone claimer may take it
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	msg, n, err := e.d.next(ctx, "")
	if err != nil || n.TaskID != "late" {
		t.Fatalf("next claimer got %+v, %v; want the notification back", n, err)
	}
	msg.Ack()
}

// TestDispatcherPullsStayBounded: ten thousand waiting claimers share a
// bounded number of pull requests, far below the server's MaxWaiting.
func TestDispatcherPullsStayBounded(t *testing.T) {
	t.Parallel()
	e := newDispatchEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const waiters = 10_000
	var g errgroup.Group
	for range waiters {
		g.Go(func() error {
			msg, _, err := e.d.next(ctx, "")
			if err == nil {
				msg.Ack()
				cancel()
			}
			return nil
		})
	}
	e.d.mu.Lock()
	fetches := e.d.fetches
	e.d.mu.Unlock()
	if fetches > maxFetches {
		t.Fatalf("%d pulls in flight, want at most %d", fetches, maxFetches)
	}
	e.publish(t, "acme", "one")
	g.Wait()
	info, err := e.d.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumWaiting > maxFetches {
		t.Fatalf("consumer has %d waiting pulls, want at most %d", info.NumWaiting, maxFetches)
	}
}

// TestDispatcherParkingExpires: a parked notification nobody here takes
// goes back to the consumer, where another process's claimer (a second
// Dispatcher on the same consumer) gets it.
func TestDispatcherParkingExpires(t *testing.T) {
	t.Parallel()
	e := newDispatchEnv(t)
	other := newDispatcher(e.d.cons, zerolog.Nop())
	t.Cleanup(other.stop)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := e.d.next(short, "globex"); err == nil {
		t.Fatal("globex's claimer got a notification from an empty queue")
	}
	e.publish(t, "acme", "a1") // the gone claimer's pull may park it here
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	msg, n, err := other.next(ctx, "")
	if err != nil || n.TaskID != "a1" {
		t.Fatalf("the other process's claimer got %+v, %v; want a1 back from the consumer", n, err)
	}
	msg.Ack()
}

// TestDispatcherHandoff gives a delivery handed off (no notification) to
// the first waiter that may claim it, exactly once, mixed with pulled
// notifications, and to nobody when nobody here may claim it or the
// Dispatcher stopped.
func TestDispatcherHandoff(t *testing.T) {
	t.Parallel()
	e := newDispatchEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.d.handoff(events.ReadyNotification{TaskID: "h0", CustomerID: "acme"}, nil) {
		t.Fatal("a delivery was handed off with no claimer waiting")
	}
	type got struct {
		offers []Offer
		err    error
	}
	waiting := func() int {
		e.d.mu.Lock()
		defer e.d.mu.Unlock()
		return e.d.waiters.Len()
	}
	// wait starts a claimer and returns once it is in line.
	wait := func(customer string, max int) chan got {
		ch, before := make(chan got, 1), waiting()
		go func() {
			offers, err := e.d.Take(ctx, customer, max, 10*time.Second) // ends as soon as max arrived
			ch <- got{offers, err}
		}()
		for waiting() == before {
			time.Sleep(time.Millisecond)
		}
		return ch
	}
	globex := wait("globex", 1)
	if e.d.handoff(events.ReadyNotification{TaskID: "h1", CustomerID: "acme"}, nil) {
		t.Fatal("acme's delivery was handed to globex's claimer")
	}
	operator := wait("", 3)
	for _, id := range []string{"h2", "h3"} {
		if !e.d.handoff(events.ReadyNotification{TaskID: id, CustomerID: "acme"}, nil) {
			t.Fatalf("delivery %s not handed off with an operator waiting", id)
		}
	}
	e.publish(t, "acme", "p1")
	g := <-operator
	if g.err != nil || len(g.offers) != 3 {
		t.Fatalf("the operator's claimer got %d offers, %v; want h2, h3 and p1", len(g.offers), g.err)
	}
	for i, want := range []string{"h2", "h3", "p1"} {
		o := g.offers[i]
		if o.Note.TaskID != want || (o.Msg == nil) != (want != "p1") {
			t.Fatalf("Offer %d is %s (message %v), want %s", i, o.Note.TaskID, o.Msg != nil, want)
		}
	}
	g.offers[2].Msg.Ack()
	if !e.d.handoff(events.ReadyNotification{TaskID: "g1", CustomerID: "globex"}, nil) {
		t.Fatal("globex's delivery not handed to globex's claimer")
	}
	if g := <-globex; g.err != nil || len(g.offers) != 1 || g.offers[0].Note.TaskID != "g1" {
		t.Fatalf("globex's claimer got %+v, %v; want g1", g.offers, g.err)
	}
	e.d.stop()
	if e.d.handoff(events.ReadyNotification{TaskID: "h4"}, nil) {
		t.Fatal("a stopped Dispatcher took a delivery")
	}
}

// TestDispatcherHolds: a released delivery no waiter may take now, while
// one joined the line within holdFor, is held: the next waiter that may
// claim it takes it, or it is published once the hold ends; with no
// waiter lately, or after stop, nothing is held (and stop publishes
// nothing it dropped: the alarm does, after the grace).
func TestDispatcherHolds(t *testing.T) {
	t.Parallel()
	e := newDispatchEnv(t)
	published := make(chan string, 10)
	publish := func(id string) func() { return func() { published <- id } }
	note := func(id string) events.ReadyNotification {
		return events.ReadyNotification{TaskID: id, CustomerID: "acme"}
	}
	e.d.holdFor = time.Minute // no hold ends while the test looks
	// A waiter joins the line and gives up: claimers were here a moment ago.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.d.Take(gone, "", 1, 0); err == nil {
		t.Fatal("a waiter whose context ended got an Offer")
	}
	if !e.d.handoff(note("held"), publish("held")) {
		t.Fatal("a delivery was not held right after a waiter left the line")
	}
	if e.d.handoff(note("not-held"), nil) {
		t.Fatal("a delivery was held without a way to publish it")
	}
	if got, err := e.d.Take(gone, "globex", 1, 0); err == nil || len(got) > 0 {
		t.Fatalf("globex took acme's held delivery: %+v, %v", got, err)
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	got, err := e.d.Take(ctx, "acme", 1, 0)
	if err != nil || len(got) != 1 || got[0].Note.TaskID != "held" || got[0].Msg != nil {
		t.Fatalf("the next waiter got %+v, %v; want the held delivery, no message", got, err)
	}
	// A hold ends: on a Dispatcher of its own, whose first hold it is.
	e = newDispatchEnv(t)
	e.d.holdFor = 50 * time.Millisecond
	e.d.mu.Lock()
	e.d.lastJoin[""] = time.Now()
	e.d.mu.Unlock()
	if !e.d.handoff(note("expires"), publish("expires")) {
		t.Fatal("a delivery was not held right after a waiter joined the line")
	}
	select {
	case id := <-published:
		if id != "expires" {
			t.Fatalf("published %s, want expires", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a held delivery nobody took was not published after its hold")
	}
	time.Sleep(100 * time.Millisecond)
	if e.d.handoff(note("late"), publish("late")) {
		t.Fatal("a delivery was held with no waiter for longer than holdFor")
	}
	e.d.mu.Lock()
	e.d.lastJoin["globex"] = time.Now()
	e.d.mu.Unlock()
	if e.d.handoff(note("theirs"), publish("theirs")) {
		t.Fatal("acme's delivery was held for globex's claimers, who may not claim it")
	}
	e.d.mu.Lock()
	e.d.lastJoin[""] = time.Now()
	e.d.mu.Unlock()
	if !e.d.handoff(note("dropped"), publish("dropped")) {
		t.Fatal("a delivery was not held")
	}
	e.d.stop()
	time.Sleep(100 * time.Millisecond)
	select {
	case id := <-published:
		t.Fatalf("stop published %s", id)
	default:
	}
	if e.d.handoff(note("stopped"), publish("stopped")) {
		t.Fatal("a stopped Dispatcher held a delivery")
	}
}
