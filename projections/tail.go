package projections

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/taskledger/taskledger/events"
)

// The engine reads the log through Config.Log's Tail, one ordered
// consumer a part, an R1 consumer the cluster places on one of the
// stream's servers. When that server is
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
	// tailBuffer is how many messages the reader may run ahead of the
	// engine, so the two goroutines do not hand over every message.
	tailBuffer = 256
	// tailBatch is how many of the messages read ahead Run applies under
	// one hold of the views' lock.
	tailBatch = 64
)

// tail delivers the log, each part in order, from one Log.Tail a part,
// each read on its own goroutine so that a consumer stuck in nats.go
// never blocks the engine. The parts' events interleave as they arrive.
type tail struct {
	next   chan tailMsg
	done   chan struct{} // closed by stop
	exited chan struct{} // closed when every goroutine has returned
	cancel context.CancelFunc
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

// errTailStopped ends a part's Tail once the tail is stopped.
var errTailStopped = errors.New("projections: tail stopped")

// follow starts a tail from stream sequence from[i] of each part i (nil:
// from each one's start). owned, if set, says which positions need no
// decoding: ApplyOwn folded them in already.
func (e *Engine) follow(from []uint64, owned func(pos events.Position) bool) *tail {
	ctx, cancel := context.WithCancel(context.Background())
	t := &tail{next: make(chan tailMsg, tailBuffer), done: make(chan struct{}), exited: make(chan struct{}), cancel: cancel}
	var running sync.WaitGroup
	for i := range e.cfg.Shards.N() {
		start := uint64(1)
		if from != nil {
			start = from[i]
		}
		running.Add(1)
		go func() {
			defer running.Done()
			t.run(ctx, e.cfg.Log, i, start, owned)
		}()
	}
	go func() {
		running.Wait()
		close(t.exited)
	}()
	return t
}

// run reads part i of log from sequence from until the tail stops.
func (t *tail) run(ctx context.Context, log Log, i int, from uint64, owned func(pos events.Position) bool) {
	send := func(m tailMsg) error {
		select {
		case t.next <- m:
			return nil
		case <-t.done:
			return errTailStopped
		}
	}
	err := log.Tail(ctx, i, from, engineHeartbeat, func(pos events.Position, data []byte, err error) error {
		switch {
		case err != nil:
			return send(tailMsg{err: fmt.Errorf("projections: read: %w", err)})
		case owned != nil && owned(pos):
			return send(tailMsg{pos: pos, owned: true})
		}
		ev, bad := decode(data, pos)
		return send(tailMsg{pos: ev.Seq, ev: ev, bad: bad})
	})
	if !errors.Is(err, errTailStopped) && ctx.Err() == nil {
		send(tailMsg{err: fmt.Errorf("projections: %w", err), ended: true})
	}
}

// stop ends the tail and returns at once. Its goroutines exit when their
// consumers have stopped, which takes until nats.go gives up a
// recreation in progress; wg tracks them.
func (t *tail) stop(wg *sync.WaitGroup) {
	close(t.done)
	t.cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-t.exited
	}()
}
