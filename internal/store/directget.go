package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// batchSize is how many messages one direct-get request asks for. A task
// with more events is read in several requests.
const batchSize = 256

// directGetter reads messages by subject with JetStream's batch direct
// get ($JS.API.DIRECT.GET.<stream>, next_by_subj): one request and one
// stream of replies per batch, no consumer to create. Replies for all
// requests arrive on one wildcard inbox subscription and are routed to the
// waiting caller by the last inbox token. It is safe for concurrent use.
type directGetter struct {
	nc      *nats.Conn
	api     string
	prefix  string
	sub     *nats.Subscription
	next    atomic.Uint64
	mu      sync.Mutex
	waiting map[string]chan *nats.Msg
}

func newDirectGetter(nc *nats.Conn, stream string) (*directGetter, error) {
	g := &directGetter{
		nc:      nc,
		api:     "$JS.API.DIRECT.GET." + stream,
		prefix:  nats.NewInbox() + ".",
		waiting: make(map[string]chan *nats.Msg),
	}
	sub, err := nc.Subscribe(g.prefix+"*", g.route)
	if err != nil {
		return nil, fmt.Errorf("store: direct get inbox: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	g.sub = sub
	return g, nil
}

func (g *directGetter) route(m *nats.Msg) {
	token := m.Subject[len(g.prefix):]
	g.mu.Lock()
	ch := g.waiting[token]
	g.mu.Unlock()
	if ch != nil {
		ch <- m // never blocks: ch holds a whole batch plus its end marker
	}
}

func (g *directGetter) close() error { return g.sub.Unsubscribe() }

type directGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	NextFor string `json:"next_by_subj"`
	Batch   int    `json:"batch"`
}

// fetch calls fn for every message on subject (wildcards allowed) from
// stream sequence from on, in order, with the message's stream sequence.
func (g *directGetter) fetch(ctx context.Context, subject string, from uint64, fn func(seq uint64, data []byte) error) error {
	token := strconv.FormatUint(g.next.Add(1), 36)
	ch := make(chan *nats.Msg, batchSize+1)
	g.mu.Lock()
	g.waiting[token] = ch
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.waiting, token)
		g.mu.Unlock()
	}()

	for {
		req, _ := json.Marshal(directGetRequest{Seq: from, NextFor: subject, Batch: batchSize})
		if err := g.nc.PublishRequest(g.api, g.prefix+token, req); err != nil {
			return fmt.Errorf("store: direct get %s: %w", subject, err)
		}
		more, last, err := g.receive(ctx, ch, fn)
		if err != nil || !more {
			return err
		}
		from = last + 1
	}
}

// receive consumes one batch. more reports that the server has further
// matching messages after last.
func (g *directGetter) receive(ctx context.Context, ch chan *nats.Msg, fn func(uint64, []byte) error) (more bool, last uint64, err error) {
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return false, 0, fmt.Errorf("store: direct get: %w", ctx.Err())
		}
		switch m.Header.Get("Status") {
		case "":
		case "404":
			return false, 0, nil
		case "204": // end of batch
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return pending > 0, last, nil
		default:
			return false, 0, fmt.Errorf("store: direct get: status %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
		}
		seq, perr := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if perr != nil {
			return false, 0, fmt.Errorf("store: direct get: bad sequence header: %w", perr)
		}
		last = seq
		if err := fn(seq, m.Data); err != nil {
			return false, 0, err
		}
	}
}
