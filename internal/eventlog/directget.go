package eventlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// batchSize is how many messages one direct-get request asks for. A task
// with more events is read in several requests.
const batchSize = 256

// DirectGetter reads messages by subject with JetStream's batch direct
// get ($JS.API.DIRECT.GET.<stream>, next_by_subj): one request and one
// stream of replies per batch, no consumer to create. Replies for all
// requests arrive on one wildcard inbox subscription and are routed to the
// waiting caller by the last inbox token. It is safe for concurrent use.
type DirectGetter struct {
	nc      *nats.Conn
	api     string
	leader  string // the leader-only message get of the stream
	prefix  string
	sub     *nats.Subscription
	next    atomic.Uint64
	mu      sync.Mutex
	waiting map[string]chan *nats.Msg
}

// NewDirectGetter returns a DirectGetter of stream on nc, subscribed to
// its replies' inbox; Close ends the subscription.
func NewDirectGetter(nc *nats.Conn, stream string) (*DirectGetter, error) {
	g := &DirectGetter{
		nc:      nc,
		api:     "$JS.API.DIRECT.GET." + stream,
		leader:  "$JS.API.STREAM.MSG.GET." + stream,
		prefix:  nats.NewInbox() + ".",
		waiting: make(map[string]chan *nats.Msg),
	}
	sub, err := nc.Subscribe(g.prefix+"*", g.route)
	if err != nil {
		return nil, fmt.Errorf("eventlog: direct get inbox: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	g.sub = sub
	return g, nil
}

func (g *DirectGetter) route(m *nats.Msg) {
	token := m.Subject[len(g.prefix):]
	g.mu.Lock()
	ch := g.waiting[token]
	g.mu.Unlock()
	if ch != nil {
		ch <- m // never blocks: ch holds a whole batch plus its end marker
	}
}

// Close ends g's reply subscription. It does not close the connection.
func (g *DirectGetter) Close() error { return g.sub.Unsubscribe() }

type directGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	NextFor string `json:"next_by_subj"`
	Batch   int    `json:"batch,omitempty"`
}

// Fetch calls fn for every message on subject (wildcards allowed) from
// stream sequence from on, in order, with the message's stream sequence.
func (g *DirectGetter) Fetch(ctx context.Context, subject string, from uint64, fn func(seq uint64, data []byte) error) error {
	req, _ := json.Marshal(directGetRequest{Seq: from, NextFor: subject, Batch: batchSize})
	for {
		more, last, err := g.batch(ctx, req, fn)
		if errors.Is(err, errNoAnswer) {
			continue // asked again under a new reply token
		}
		if err != nil || !more {
			return err
		}
		from = last + 1
		req, _ = json.Marshal(directGetRequest{Seq: from, NextFor: subject, Batch: batchSize})
	}
}

// errNoAnswer: no replica answered a direct get within directAttempt. On
// a cluster that has just lost a node a request can go unanswered; it is
// sent again, and a late answer to the first one is dropped.
var errNoAnswer = errors.New("eventlog: direct get not answered")

// directAttempt is how long a direct get waits for its first reply.
const directAttempt = time.Second

// batch sends one batch request under a fresh reply token and consumes
// its replies.
func (g *DirectGetter) batch(ctx context.Context, req []byte, fn func(uint64, []byte) error) (more bool, last uint64, err error) {
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
	if err := g.nc.PublishRequest(g.api, g.prefix+token, req); err != nil {
		return false, 0, fmt.Errorf("eventlog: direct get: %w", err)
	}
	return g.receive(ctx, ch, fn)
}

// receive consumes one batch. more reports that the server has further
// matching messages after last.
func (g *DirectGetter) receive(ctx context.Context, ch chan *nats.Msg, fn func(uint64, []byte) error) (more bool, last uint64, err error) {
	first := time.NewTimer(directAttempt)
	defer first.Stop()
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
			first.Stop()
		case <-first.C:
			return false, 0, errNoAnswer
		case <-ctx.Done():
			return false, 0, fmt.Errorf("eventlog: direct get: %w", ctx.Err())
		}
		switch m.Header.Get("Status") {
		case "":
		case "404":
			return false, 0, nil
		case "204": // end of batch
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return pending > 0, last, nil
		default:
			return false, 0, fmt.Errorf("eventlog: direct get: status %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
		}
		seq, perr := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if perr != nil {
			return false, 0, fmt.Errorf("eventlog: direct get: bad sequence header: %w", perr)
		}
		last = seq
		if err := fn(seq, m.Data); err != nil {
			return false, 0, err
		}
	}
}

// FetchCurrent is Fetch for a replicated stream. Any replica answers a
// direct get, and a follower may not have applied the latest appends yet,
// so a read right after an acknowledged append (from this process or
// another) could miss it. FetchCurrent asks the stream leader for the
// subject's last sequence and reads from the leader whatever the replica
// lacked, so it returns every message acknowledged before it was called.
func (g *DirectGetter) FetchCurrent(ctx context.Context, subject string, from uint64, fn func(seq uint64, data []byte) error) error {
	last := max(from, 1) - 1
	err := g.Fetch(ctx, subject, from, func(seq uint64, data []byte) error {
		last = seq
		return fn(seq, data)
	})
	if err != nil {
		return err
	}
	leaderLast, _, ok, err := g.LeaderGet(ctx, LeaderGetRequest{LastFor: subject})
	for err == nil && ok && last < leaderLast {
		var seq uint64
		var data []byte
		seq, data, ok, err = g.LeaderGet(ctx, LeaderGetRequest{Seq: last + 1, NextFor: subject})
		if err == nil && ok {
			last = seq
			err = fn(seq, data)
		}
	}
	return err
}

// leaderAttempt bounds one request of LeaderGet.
const leaderAttempt = 500 * time.Millisecond

// LeaderGetRequest is a leader message get: the message at Seq, the last
// one on LastFor, or the first on NextFor at or after Seq.
type LeaderGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

// NextMsg reads the first message on subject at or after sequence from with
// one direct get (no batch: the server skips counting what is pending,
// which costs more than the read on a large stream); ok is false when
// there is none.
func (g *DirectGetter) NextMsg(ctx context.Context, subject string, from uint64) (seq uint64, data []byte, ok bool, err error) {
	body, _ := json.Marshal(directGetRequest{Seq: from, NextFor: subject})
	msg, err := g.nc.RequestWithContext(ctx, g.api, body)
	if err != nil {
		return 0, nil, false, fmt.Errorf("eventlog: direct get %s: %w", subject, err)
	}
	switch msg.Header.Get("Status") {
	case "":
	case "404":
		return 0, nil, false, nil
	default:
		return 0, nil, false, fmt.Errorf("eventlog: direct get: status %s %s", msg.Header.Get("Status"), msg.Header.Get("Description"))
	}
	if seq, err = strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64); err != nil {
		return 0, nil, false, fmt.Errorf("eventlog: direct get: bad sequence header: %w", err)
	}
	return seq, msg.Data, true, nil
}

// LeaderGet reads one message with the stream leader's message get; ok is
// false when no message matches.
func (g *DirectGetter) LeaderGet(ctx context.Context, req LeaderGetRequest) (seq uint64, data []byte, ok bool, err error) {
	body, _ := json.Marshal(req)
	var msg *nats.Msg
	for {
		// A request sent while the stream has no leader (an election after
		// a node loss) is never answered: ask again until ctx ends.
		actx, cancel := context.WithTimeout(ctx, leaderAttempt)
		msg, err = g.nc.RequestWithContext(actx, g.leader, body)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	if err != nil {
		return 0, nil, false, fmt.Errorf("eventlog: stream leader get: %w", err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, nil, false, fmt.Errorf("eventlog: stream leader get: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, nil, false, nil
	case resp.Error != nil:
		return 0, nil, false, fmt.Errorf("eventlog: stream leader get: %w", resp.Error)
	case resp.Message == nil:
		return 0, nil, false, fmt.Errorf("eventlog: stream leader get: empty answer")
	}
	return resp.Message.Seq, resp.Message.Data, true, nil
}
