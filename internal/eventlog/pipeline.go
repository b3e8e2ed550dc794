package eventlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrAckTimeout is a pipeline's answer when an append's ack did not come
// back within the write timeout: the append may have landed.
var ErrAckTimeout = errors.New("eventlog: no ack within the write timeout")

// Pipeline sends appends on one connection without waiting for each
// other's acks and hands each ack to its caller by the token of its reply
// subject: nats.go's asynchronous publish with less per append. An append
// takes a pooled waiter (its channel and timer are reused) instead of a
// future, two channels and a timer, and its ack is read in place instead
// of through encoding/json. It is safe for concurrent use.
type Pipeline struct {
	nc      *nats.Conn
	prefix  string        // reply subjects: prefix + token
	slots   chan struct{} // one per append awaiting its ack
	timeout time.Duration
	sub     *nats.Subscription
	status  chan nats.Status

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]*ackWaiter
}

// ackWaiter is where one append's answer arrives. Its channel holds one
// answer, so the ack handler never blocks on it.
type ackWaiter struct {
	answer chan ackAnswer
	timer  *time.Timer
}

type ackAnswer struct {
	seq uint64
	err error
}

var ackWaiters = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &ackWaiter{answer: make(chan ackAnswer, 1), timer: t}
}}

// NewPipeline subscribes to the acks of the appends it will send: at most
// maxPending at once, each answered within timeout or failed with
// ErrAckTimeout. A lost connection fails the appends awaiting acks with
// nats.ErrDisconnected at once, as nats.go does.
func NewPipeline(nc *nats.Conn, maxPending int, timeout time.Duration) (*Pipeline, error) {
	p := &Pipeline{
		nc: nc, prefix: nc.NewInbox() + ".", slots: make(chan struct{}, maxPending), timeout: timeout,
		waiting: make(map[uint64]*ackWaiter),
	}
	sub, err := nc.Subscribe(p.prefix+"*", p.acked)
	if err != nil {
		return nil, fmt.Errorf("eventlog: ack subscription: %w", err)
	}
	sub.SetPendingLimits(-1, -1) // an ack dropped here would fail a write that landed
	p.sub = sub
	p.status = nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	go p.watch()
	return p, nil
}

// Close ends the subscription and the status watch; appends still
// awaiting acks time out.
func (p *Pipeline) Close() error {
	p.nc.RemoveStatusListener(p.status) // closes p.status: watch returns
	return p.sub.Unsubscribe()
}

// watch fails every append awaiting an ack when the connection is lost:
// its ack will not come. It returns once the connection is closed or
// Close removed its listener.
func (p *Pipeline) watch() {
	for status := range p.status {
		p.mu.Lock()
		for tok, w := range p.waiting {
			delete(p.waiting, tok)
			w.answer <- ackAnswer{err: nats.ErrDisconnected}
		}
		p.mu.Unlock()
		if status == nats.CLOSED {
			return
		}
	}
}

// Like nats.go's, a publish that found no stream to take it (a stream
// leader being elected) is sent again, noResponderRetries times
// noResponderWait apart, within the write timeout.
const (
	noResponderRetries = 2
	noResponderWait    = 250 * time.Millisecond
)

// Publish sends msg (its Reply is set here) and waits for its ack, for
// room in the pipeline, or for ctx, within the write timeout; it returns
// the stream sequence the ack names, the server's error
// (*jetstream.APIError), nats.ErrNoResponders, ErrAckTimeout, or the
// transport's or ctx's error.
func (p *Pipeline) Publish(ctx context.Context, msg *nats.Msg) (uint64, error) {
	deadline := time.Now().Add(p.timeout)
	for retries := 0; ; retries++ {
		seq, err := p.send(ctx, msg, time.Until(deadline))
		if !errors.Is(err, nats.ErrNoResponders) || retries == noResponderRetries || time.Until(deadline) < noResponderWait {
			return seq, err
		}
		select {
		case <-time.After(noResponderWait):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// send is one publish of msg, its ack awaited for at most timeout.
func (p *Pipeline) send(ctx context.Context, msg *nats.Msg, timeout time.Duration) (uint64, error) {
	w := ackWaiters.Get().(*ackWaiter)
	w.timer.Reset(timeout)
	select {
	case p.slots <- struct{}{}:
	case <-w.timer.C:
		ackWaiters.Put(w)
		return 0, ErrAckTimeout
	case <-ctx.Done():
		w.timer.Stop()
		ackWaiters.Put(w)
		return 0, ctx.Err()
	}
	defer func() { <-p.slots }()
	p.mu.Lock()
	p.next++
	tok := p.next
	p.waiting[tok] = w
	p.mu.Unlock()
	msg.Reply = p.prefix + strconv.FormatUint(tok, 36)
	var a ackAnswer
	if err := p.nc.PublishMsg(msg); err != nil {
		a = p.abandon(tok, w, err)
	} else {
		select {
		case a = <-w.answer:
		case <-w.timer.C:
			a = p.abandon(tok, w, ErrAckTimeout)
		case <-ctx.Done():
			a = p.abandon(tok, w, ctx.Err())
		}
	}
	w.timer.Stop()
	ackWaiters.Put(w) // answered or abandoned: nothing sends to it again
	return a.seq, a.err
}

// abandon stops waiting for tok's answer and returns err, or the answer
// when it arrived meanwhile.
func (p *Pipeline) abandon(tok uint64, w *ackWaiter, err error) ackAnswer {
	p.mu.Lock()
	_, ok := p.waiting[tok]
	delete(p.waiting, tok)
	p.mu.Unlock()
	if !ok { // answered, or failed by watch, before it was taken out
		return <-w.answer
	}
	return ackAnswer{err: err}
}

// acked hands an ack to its append; a late one (the append gave up) is
// dropped.
func (p *Pipeline) acked(m *nats.Msg) {
	tok, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, p.prefix), 36, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	w := p.waiting[tok]
	delete(p.waiting, tok)
	p.mu.Unlock()
	if w != nil {
		w.answer <- parseAck(m)
	}
}

// parseAck reads a JetStream publish ack: {"stream":…,"seq":N,…} or
// {"error":{…}}, or a no-responders status (no stream takes the subject
// now).
func parseAck(m *nats.Msg) ackAnswer {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return ackAnswer{err: nats.ErrNoResponders}
	}
	if !bytes.Contains(m.Data, []byte(`"error"`)) {
		// The ack's other fields (stream, domain, duplicate, batch) are
		// strings, booleans and numbers without a quote in them, so
		// "seq": occurs once.
		if i := bytes.Index(m.Data, []byte(`"seq":`)); i >= 0 {
			if seq, ok := parseSeq(bytes.TrimLeft(m.Data[i+len(`"seq":`):], " ")); ok {
				return ackAnswer{seq: seq}
			}
		}
	}
	var res struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &res); err != nil || res.Error == nil {
		return ackAnswer{err: fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, m.Data)}
	}
	return ackAnswer{err: res.Error}
}

// parseSeq reads the decimal sequence that b starts with, above 0 and
// followed by the end of its JSON value.
func parseSeq(b []byte) (uint64, bool) {
	var seq uint64
	n := 0
	for ; n < len(b) && '0' <= b[n] && b[n] <= '9'; n++ {
		d := uint64(b[n] - '0')
		if seq > (math.MaxUint64-d)/10 {
			return 0, false
		}
		seq = seq*10 + d
	}
	if n == 0 || n < len(b) && b[n] != ',' && b[n] != '}' && b[n] != ' ' {
		return 0, false
	}
	return seq, seq > 0
}
