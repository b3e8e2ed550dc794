package projections

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// The engine reads the log through an ordered consumer, an R1 consumer
// the cluster places on one of the stream's servers. When that server is
// lost, nats.go recreates the consumer under the same name, and while the
// cluster still places that name on the lost server every attempt times
// out: the engine, and every write waiting for it, would stall until the
// server returns. So the engine watches its progress and, when it is
// behind what a caller waits for and has not moved for stallTimeout,
// follows the log with a new consumer (a new name) from where it is.
const (
	// engineHeartbeat is the idle heartbeat of the ordered consumer; two
	// missed ones make nats.go replace it.
	engineHeartbeat = time.Second
	// stallTimeout is how long the engine may make no progress while a
	// caller waits for a later sequence before it replaces its consumer.
	stallTimeout = 3 * time.Second
	// followTimeout bounds the creation of a consumer.
	followTimeout = 10 * time.Second
	// tailBuffer is how many messages the reader may run ahead of the
	// engine, so the two goroutines do not hand over every message.
	tailBuffer = 256
	// tailBatch is how many of the messages read ahead Run applies under
	// one hold of the views' lock.
	tailBatch = 64
)

// tail delivers the log, each shard in order, from one ordered consumer
// a shard, each read on its own goroutine so that a consumer stuck in
// nats.go never blocks the engine. The shards' events interleave as they
// arrive.
type tail struct {
	next   chan tailMsg
	done   chan struct{} // closed by stop
	exited chan struct{} // closed when every goroutine has returned

	mu  sync.Mutex
	its []jetstream.MessagesContext
}

// tailMsg is one event, decoded on the tail's goroutine so that decoding
// and applying run side by side (bad is why it did not decode), or a read
// error; ended means the tail stopped on its own (its consumer could not
// be created, or was closed).
type tailMsg struct {
	pos   events.Position
	ev    events.Event
	bad   error
	err   error
	ended bool
	// owned: the event at pos was folded in already (ApplyOwn), so it
	// was not decoded.
	owned bool
}

// follow starts a tail from stream sequence from[i] of each shard i (nil:
// from each one's start). owned, if set, says which positions need no
// decoding: ApplyOwn folded them in already.
func (e *Engine) follow(from []uint64, owned func(pos events.Position) bool) *tail {
	t := &tail{next: make(chan tailMsg, tailBuffer), done: make(chan struct{}), exited: make(chan struct{})}
	var running sync.WaitGroup
	for i := range e.cfg.Shards.N() {
		start := uint64(1)
		if from != nil {
			start = from[i]
		}
		running.Add(1)
		go func() {
			defer running.Done()
			t.run(e.js, e.cfg.Shards, i, e.cfg.Shards.Stream(e.cfg.Stream, i), start, owned)
		}()
	}
	go func() {
		running.Wait()
		close(t.exited)
	}()
	return t
}

// run reads shard i, whose stream is named stream, from sequence from
// until the tail stops.
func (t *tail) run(js jetstream.JetStream, shards events.Shards, i int, stream string, from uint64, owned func(pos events.Position) bool) {
	// No filter: the stream holds only the log's subjects (store.Open
	// makes it so), and a filter, even one that matches every subject,
	// makes the server match it against each message block's subject
	// tree for every message it delivers: with a subject per task that
	// cost ~100 µs an event and held reads to ~14,000 events/s.
	cfg := jetstream.OrderedConsumerConfig{}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	send := func(m tailMsg) bool {
		select {
		case t.next <- m:
			return true
		case <-t.done:
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), followTimeout)
	go func() { // stop ends the creation too
		select {
		case <-t.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	cancel()
	if err != nil {
		send(tailMsg{err: fmt.Errorf("projections: consumer: %w", err), ended: true})
		return
	}
	it, err := cons.Messages(jetstream.PullHeartbeat(engineHeartbeat))
	if err != nil {
		send(tailMsg{err: fmt.Errorf("projections: consume: %w", err), ended: true})
		return
	}
	t.mu.Lock()
	t.its = append(t.its, it)
	t.mu.Unlock()
	select {
	case <-t.done: // stopped before it was set
		it.Stop()
		return
	default:
	}
	for {
		msg, err := it.Next()
		switch {
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			send(tailMsg{err: err, ended: true})
			return
		case err != nil:
		default:
			var seq uint64
			if seq, err = streamSeq(msg); err == nil {
				pos := shards.Position(i, seq)
				if owned != nil && owned(pos) {
					if !send(tailMsg{pos: pos, owned: true}) {
						return
					}
					continue
				}
				ev, bad := decode(msg.Data(), pos)
				if !send(tailMsg{pos: ev.Seq, ev: ev, bad: bad}) {
					return
				}
				continue
			}
		}
		if !send(tailMsg{err: fmt.Errorf("projections: read: %w", err)}) {
			return
		}
	}
}

// stop ends the tail and returns at once. Its goroutine exits when its
// consumer has stopped, which takes until nats.go gives up a recreation
// in progress; wg tracks it.
func (t *tail) stop(wg *sync.WaitGroup) {
	close(t.done)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.mu.Lock()
		its := t.its
		t.mu.Unlock()
		for _, it := range its {
			it.Stop()
		}
		<-t.exited
	}()
}

// streamSeq returns the stream sequence of a message a consumer
// delivered, read from its reply subject in place: $JS.ACK.<stream>.
// <consumer>.<delivered>.<stream seq>... (9 tokens), or with a domain and
// an account hash after ACK (11 or more). Any other reply is left to
// nats.go's Metadata, which allocates the whole metadata.
func streamSeq(msg jetstream.Msg) (uint64, error) {
	reply := msg.Reply()
	pos := -1
	switch n := strings.Count(reply, ".") + 1; {
	case !strings.HasPrefix(reply, "$JS.ACK."):
	case n == 9:
		pos = 5
	case n >= 11:
		pos = 7
	}
	if pos >= 0 {
		tok := reply
		for range pos {
			tok = tok[strings.IndexByte(tok, '.')+1:]
		}
		if i := strings.IndexByte(tok, '.'); i >= 0 {
			tok = tok[:i]
		}
		if seq, err := strconv.ParseUint(tok, 10, 64); err == nil && seq > 0 {
			return seq, nil
		}
	}
	meta, err := msg.Metadata()
	if err != nil {
		return 0, err
	}
	return meta.Sequence.Stream, nil
}
