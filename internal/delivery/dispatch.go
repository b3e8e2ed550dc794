package delivery

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/events"
)

// Limits of one queue's Dispatcher.
const (
	// fetchSlice is the longest single pull: a pull that found nothing
	// ends after it and, while claimers still wait, another starts.
	fetchSlice = time.Second
	// maxFetchBatch is the most notifications one pull asks for.
	maxFetchBatch = 1000
	// maxFetches bounds the pulls in flight per queue and process, far
	// below the server's MaxWaiting (512) per consumer.
	maxFetches = 16
)

// A notification that arrives when no waiter here may claim it is parked
// for the next one for up to parkFor, at most maxParked of them; then it
// goes back to the consumer for other processes. Parking, not handing
// back at once, keeps a pull that outlives its waiters from cycling the
// same notifications through the consumer.
const (
	parkFor   = 100 * time.Millisecond
	maxParked = maxFetchBatch
)

// A delivery the alarm released while no waiter here may claim it, but
// one joined the line within holdFor, is held for the next one for up to
// holdFor, at most maxHeld of them; then it is published. Holding, not
// publishing at once, lets a burst of releases go to claimers that are
// busy claiming the burst's first tasks: a claim, not a notification, a
// ReadyPublished and a claim.
const (
	holdFor = 50 * time.Millisecond
	maxHeld = maxFetchBatch
)

// Dispatcher hands one queue's ready notifications to the claimers waiting
// in this process. It pulls from the queue's shared durable consumer only
// while claimers wait, asking for as many notifications as they want, and
// gives each notification to exactly one waiter: the first in line that
// may claim it (an operator any, a customer only its own), or parks it
// for the next one. A waiting claimer costs a list element and a channel,
// never a pull request of its own. It is safe for concurrent use.
type Dispatcher struct {
	log zerolog.Logger

	mu        sync.Mutex
	cons      jetstream.Consumer
	lastPull  time.Time // when the last pull ended; zero after one failed
	waiters   list.List // of *waiter, in arrival order
	wanted    int       // notifications the waiters still want, summed
	requested int       // notifications asked for by pulls in flight, not yet received
	fetches   int       // pulls in flight
	stopped   bool      // no new pulls start
	pulls     sync.WaitGroup
	parked    list.List            // of parkedOffer, oldest first
	expiry    *time.Timer          // hands back expired parked offers; nil when none are parked
	held      list.List            // of heldOffer, oldest first
	holdEnd   *time.Timer          // publishes expired held deliveries; nil when none are held
	lastJoin  map[string]time.Time // when a waiter of each customer ("" for operators) last joined the line
	holdFor   time.Duration        // holdFor, but for tests
	holdPubs  sync.WaitGroup       // publishes of held deliveries whose hold ended
	handed    func()               // called for each delivery given without a notification; may be nil
}

type parkedOffer struct {
	Offer
	at time.Time
}

// heldOffer is a released delivery held for a waiter, and how to publish
// it once the hold ends.
type heldOffer struct {
	note    events.ReadyNotification
	publish func()
	at      time.Time
}

// waiter is one claimer waiting for up to cap(got) notifications.
type waiter struct {
	customer string        // "" for an operator: takes any customer's
	got      chan Offer    // never blocks: it has room for every Offer a registration gets
	want     int           // offers still wanted while it waits
	elem     *list.Element // in Dispatcher.waiters while it waits
}

// Offer is a ready notification a Dispatcher hands to one claimer.
type Offer struct {
	// Msg is the notification's message, which the claimer settles: Ack
	// once claimed or stale, Nak when the log could not answer. It is nil
	// for a delivery handed off without a notification (see Queues):
	// there is nothing to settle.
	Msg  jetstream.Msg
	Note events.ReadyNotification
	err  error // ended the pull the claimer waited on; only inside Take
}

func newDispatcher(cons jetstream.Consumer, log zerolog.Logger) *Dispatcher {
	return &Dispatcher{cons: cons, log: log, lastPull: time.Now(), holdFor: holdFor, lastJoin: map[string]time.Time{}}
}

// idleFor reports whether no pull is in flight and none ended within d
// (or the last one failed): the server may have deleted the consumer.
func (d *Dispatcher) idleFor(dur time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fetches == 0 && time.Since(d.lastPull) > dur
}

// setConsumer makes the Dispatcher pull from cons from now on.
func (d *Dispatcher) setConsumer(cons jetstream.Consumer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cons, d.lastPull = cons, time.Now()
}

// next waits until a notification that customer ("" for any) may claim
// arrives, or ctx ends (then it returns ctx's error). The caller owns the
// returned message: it must Ack, Nak or Term it.
func (d *Dispatcher) next(ctx context.Context, customer string) (jetstream.Msg, events.ReadyNotification, error) {
	offers, err := d.Take(ctx, customer, 1, 0)
	if err != nil {
		return nil, events.ReadyNotification{}, err
	}
	return offers[0].Msg, offers[0].Note, nil
}

// Take waits until a notification that customer ("" for any) may claim
// arrives, or ctx ends (then it returns ctx's error), and then collects
// more, up to max in all, for at most linger. It fails with the pull's
// error when the ready stream could not be read. The caller owns the
// returned messages: it must Ack, Nak or Term each (see Offer.Msg). It
// is safe for concurrent use; max is bounded by the caller.
func (d *Dispatcher) Take(ctx context.Context, customer string, max int, linger time.Duration) ([]Offer, error) {
	d.mu.Lock()
	if got := d.unparkLocked(customer, max); len(got) > 0 {
		d.mu.Unlock()
		return got, nil
	}
	if got := d.unholdLocked(customer, max); len(got) > 0 {
		d.mu.Unlock()
		return got, nil
	}
	w := &waiter{customer: customer, got: make(chan Offer, max), want: max}
	w.elem = d.waiters.PushBack(w)
	d.lastJoin[customer] = time.Now()
	d.wanted += max
	d.pullLocked()
	d.mu.Unlock()
	out := make([]Offer, 0, max) // max is bounded (api.MaxBatchItems)
	var err error
	select {
	case o := <-w.got:
		out, err = append(out, o), o.err
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil && len(out) < max && linger > 0 {
		timer := time.NewTimer(linger)
	collect:
		for len(out) < max {
			select {
			case o := <-w.got:
				out = append(out, o)
			case <-timer.C:
				break collect
			}
		}
		timer.Stop()
	}
	d.mu.Lock()
	d.leaveLocked(w)
	d.mu.Unlock()
	close(w.got) // out of line: every Offer it got is in the buffer
	for o := range w.got {
		out = append(out, o)
	}
	msgs := out[:0]
	for _, o := range out {
		if o.err == nil {
			msgs = append(msgs, o)
		} else if err == nil {
			err = o.err
		}
	}
	if len(msgs) == 0 {
		return nil, err
	}
	return msgs, nil
}

// leaveLocked takes w out of line; d.mu is held.
func (d *Dispatcher) leaveLocked(w *waiter) {
	if w.elem != nil {
		d.waiters.Remove(w.elem)
		w.elem = nil
		d.wanted -= w.want
		w.want = 0
	}
}

// pullLocked starts pulls until the notifications asked for cover the
// waiters, within maxFetches. d.mu is held.
func (d *Dispatcher) pullLocked() {
	if d.stopped || d.parked.Len() >= maxParked {
		return // with maxParked parked, the waiters want only others' notifications
	}
	for need := d.wanted - d.requested; need > 0 && d.fetches < maxFetches; need = d.wanted - d.requested {
		n := min(need, maxFetchBatch)
		d.requested += n
		d.fetches++
		d.pulls.Add(1)
		go d.fetch(d.cons, n)
	}
}

// fetch pulls up to n notifications from cons and offers each as it
// arrives.
func (d *Dispatcher) fetch(cons jetstream.Consumer, n int) {
	defer d.pulls.Done()
	received := 0
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(fetchSlice))
	if err == nil {
		for msg := range batch.Messages() {
			received++
			d.mu.Lock()
			d.requested--
			d.mu.Unlock()
			d.receive(msg)
		}
		err = batch.Error()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requested -= n - received
	d.fetches--
	d.lastPull = time.Now()
	if err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
		d.lastPull = time.Time{} // the next claimer makes sure the consumer exists
		// The log cannot be read: every waiter hears it now rather than
		// at its deadline, and a new claimer starts a new pull.
		for e := d.waiters.Front(); e != nil; e = d.waiters.Front() {
			w := e.Value.(*waiter)
			d.leaveLocked(w)
			w.got <- Offer{err: err}
		}
		return
	}
	d.pullLocked()
}

// receive decodes a pulled notification and gives it to a waiter.
func (d *Dispatcher) receive(msg jetstream.Msg) {
	n, err := events.UnmarshalReady(msg.Data(), msg.Headers().Get(events.ContentTypeHeader))
	if err == nil {
		err = events.ValidID(n.TaskID)
	}
	if err != nil {
		d.log.Error().Err(err).Msg("claims/next: malformed ready notification dropped")
		msg.Term()
		return
	}
	d.give(msg, n)
}

// give hands msg to the first waiter that may claim it, or parks it.
func (d *Dispatcher) give(msg jetstream.Msg, n events.ReadyNotification) {
	d.mu.Lock()
	if d.offerLocked(Offer{Msg: msg, Note: n}) {
		d.mu.Unlock()
		return
	}
	if d.parked.Len() < maxParked && !d.stopped {
		d.parked.PushBack(parkedOffer{Offer{Msg: msg, Note: n}, time.Now()})
		if d.expiry == nil {
			d.expiry = time.AfterFunc(parkFor, d.expire)
		}
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	msg.Nak()
}

// handoff gives the delivery of n, released but not published, to the
// first waiter that may claim it, and reports whether one was waiting.
// With publish set it also holds the delivery when no waiter may take it
// now but one joined the line within holdFor: the next waiter that may
// claim it takes it, or publish runs once the hold ends (or never, should
// the Dispatcher stop first: the alarm publishes the delivery after its
// grace, as after a crash). A delivery neither given nor held is the
// caller's to publish.
func (d *Dispatcher) handoff(n events.ReadyNotification, publish func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.stopped:
		return false
	case d.offerLocked(Offer{Note: n}):
		return true
	case publish == nil || d.held.Len() >= maxHeld || !d.joinedLately(n.CustomerID):
		return false
	}
	d.held.PushBack(heldOffer{note: n, publish: publish, at: time.Now()})
	if d.holdEnd == nil {
		d.holdEnd = time.AfterFunc(d.holdFor, d.endHolds)
	}
	return true
}

// joinedLately reports whether a waiter that may claim a task of customer
// joined the line within holdFor; d.mu is held.
func (d *Dispatcher) joinedLately(customer string) bool {
	return time.Since(d.lastJoin[""]) < d.holdFor || time.Since(d.lastJoin[customer]) < d.holdFor
}

// unholdLocked takes up to max held deliveries customer may claim,
// oldest first; d.mu is held.
func (d *Dispatcher) unholdLocked(customer string, max int) []Offer {
	var out []Offer
	for e := d.held.Front(); e != nil && len(out) < max; {
		next := e.Next()
		if h := e.Value.(heldOffer); customer == "" || customer == h.note.CustomerID {
			out = append(out, Offer{Note: h.note})
			d.held.Remove(e)
			d.countHanded()
		}
		e = next
	}
	return out
}

// endHolds publishes the deliveries held for holdFor.
func (d *Dispatcher) endHolds() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return // stop dropped them
	}
	var due []func()
	now := time.Now()
	for e := d.held.Front(); e != nil && now.Sub(e.Value.(heldOffer).at) >= d.holdFor; e = d.held.Front() {
		due = append(due, d.held.Remove(e).(heldOffer).publish)
	}
	d.holdEnd = nil
	if e := d.held.Front(); e != nil {
		d.holdEnd = time.AfterFunc(d.holdFor-now.Sub(e.Value.(heldOffer).at), d.endHolds)
	}
	d.holdPubs.Add(len(due))
	d.mu.Unlock()
	for _, publish := range due {
		go func() { // at most maxHeld at once
			defer d.holdPubs.Done()
			publish()
		}()
	}
}

// countHanded counts a delivery given without a notification; d.mu is
// held.
func (d *Dispatcher) countHanded() {
	if d.handed != nil {
		d.handed()
	}
}

// offerLocked gives o to the first waiter that may claim it and reports
// whether there was one; d.mu is held.
func (d *Dispatcher) offerLocked(o Offer) bool {
	for e := d.waiters.Front(); e != nil; e = e.Next() {
		if w := e.Value.(*waiter); w.customer == "" || w.customer == o.Note.CustomerID {
			if o.Msg == nil {
				d.countHanded()
			}
			w.got <- o
			w.want--
			d.wanted--
			if w.want == 0 {
				d.leaveLocked(w)
			}
			return true
		}
	}
	return false
}

// unparkLocked takes up to max parked offers customer may claim, oldest
// first; d.mu is held.
func (d *Dispatcher) unparkLocked(customer string, max int) []Offer {
	var out []Offer
	for e := d.parked.Front(); e != nil && len(out) < max; {
		next := e.Next()
		if p := e.Value.(parkedOffer); customer == "" || customer == p.Note.CustomerID {
			out = append(out, p.Offer)
			d.parked.Remove(e)
		}
		e = next
	}
	return out
}

// expire hands the offers parked for parkFor back to the consumer.
func (d *Dispatcher) expire() {
	d.mu.Lock()
	var old []jetstream.Msg
	now := time.Now()
	for e := d.parked.Front(); e != nil && now.Sub(e.Value.(parkedOffer).at) >= parkFor; e = d.parked.Front() {
		old = append(old, d.parked.Remove(e).(parkedOffer).Msg)
	}
	d.expiry = nil
	if e := d.parked.Front(); e != nil {
		d.expiry = time.AfterFunc(parkFor-now.Sub(e.Value.(parkedOffer).at), d.expire)
	}
	d.pullLocked() // room again for the waiters' pulls
	d.mu.Unlock()
	for _, msg := range old {
		msg.Nak()
	}
}

// stop starts no more pulls, waits until those in flight have ended (at
// most fetchSlice), hands every parked notification back, drops the
// held deliveries and waits for the publishes of those whose hold ended.
func (d *Dispatcher) stop() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
	d.pulls.Wait()
	d.mu.Lock()
	if d.expiry != nil {
		d.expiry.Stop()
		d.expiry = nil
	}
	if d.holdEnd != nil {
		d.holdEnd.Stop()
		d.holdEnd = nil
	}
	d.held.Init() // released and unpublished: the alarm publishes them after their grace
	var parked []jetstream.Msg
	for e := d.parked.Front(); e != nil; e = d.parked.Front() {
		parked = append(parked, d.parked.Remove(e).(parkedOffer).Msg)
	}
	d.mu.Unlock()
	for _, msg := range parked {
		msg.Nak()
	}
	d.holdPubs.Wait()
}
