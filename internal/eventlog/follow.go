package eventlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/events"
)

// followBatch is how many messages Follow's consumer pulls at once: with
// its own buffer of at most this many events, a follower holds bounded
// memory whatever the log's size.
const followBatch = 32

// tailCreateTimeout bounds the creation of a Tail's consumer.
const tailCreateTimeout = 10 * time.Second

// Follow calls fn for every event stored after the positions after (by
// shard; nil or 0: from a shard's start) whose subject matches one of the
// subjects filters gives for a shard's subjects (nil, or none: the whole
// log), each shard in log order, and then for each one stored later,
// until ctx ends (returning ctx.Err()) or fn returns an error, which
// Follow returns. It reads each shard with an ordered consumer, so a lost
// connection resumes where it was; with several shards their events
// interleave as they arrive, and fn is called from one goroutine at a
// time. A message that does not decode is quarantined: passed to
// quarantine (from the same goroutine as fn), which may let the follow go
// on, or, with a nil quarantine, it ends the follow with an error
// wrapping its *events.CorruptError.
func (l Log) Follow(ctx context.Context, filters func(events.Subjects) []string, after []events.Position, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error {
	l = l.withDefaults()
	start := func(i int) uint64 {
		if i >= len(after) {
			return 1
		}
		return after[i].Seq(l.Shards) + 1
	}
	if quarantine == nil {
		quarantine = func(c *events.CorruptError) error { return fmt.Errorf("eventlog: %w", c) }
	}
	if l.Shards.N() == 1 {
		return l.followShard(ctx, 0, filters, start(0), fn, quarantine)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One of the two is set: an event, or a message that did not decode.
	type item struct {
		ev      events.Event
		corrupt *events.CorruptError
	}
	items := make(chan item)
	send := func(it item) error {
		select {
		case items <- it:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	errs := make(chan error, l.Shards.N())
	for i := range l.Shards.N() {
		go func() {
			errs <- l.followShard(ctx, i, filters, start(i),
				func(ev events.Event) error { return send(item{ev: ev}) },
				func(c *events.CorruptError) error { return send(item{corrupt: c}) })
		}()
	}
	var err error
	for running := l.Shards.N(); running > 0; {
		select {
		case it := <-items:
			if err == nil {
				if it.corrupt != nil {
					err = quarantine(it.corrupt)
				} else {
					err = fn(it.ev)
				}
				if err != nil {
					cancel()
				}
			}
		case ferr := <-errs:
			running--
			if err == nil {
				err = ferr
				cancel()
			}
		}
	}
	return err
}

// followShard is Follow of shard i from its stream sequence from.
func (l Log) followShard(ctx context.Context, i int, filters func(events.Subjects) []string, from uint64, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error {
	subjects := l.Shards.Subjects(l.Subjects, i)
	var subs []string
	if filters != nil {
		subs = filters(subjects)
	}
	if len(subs) == 0 {
		subs = []string{subjects.Events()}
	}
	o := followOptions{filters: subs, pull: []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(followBatch)}}
	return l.followPart(ctx, i, from, o, func(msg jetstream.Msg, seq uint64, _ error) error {
		pos := l.Shards.Position(i, seq)
		ev, err := events.DecodeAt(msg.Data(), pos)
		if err == nil {
			return fn(ev)
		}
		corrupt := &events.CorruptError{Pos: pos, Subject: msg.Subject(), Err: err}
		if meta, merr := msg.Metadata(); merr == nil {
			corrupt.At = meta.Timestamp
		}
		return quarantine(corrupt)
	})
}

// Tail calls fn, on the calling goroutine, with every message of part
// i from its stream sequence from (0 or 1: the part's start), in order,
// and then with each one stored later, until ctx ends, fn returns an
// error or the consumer ends; it returns why it ended: ctx.Err(), fn's
// error, the consumer's creation error, or an error wrapping
// jetstream.ErrMsgIteratorClosed (nats.go gave the consumer up). A failed
// pull, or a message whose sequence cannot be read, is passed to fn as
// err (pos 0, no data) and the read goes on. It reads with one ordered
// consumer whose idle heartbeat is heartbeat (two missed ones make
// nats.go replace it, resuming where it was), and without a subject
// filter: the stream holds only the log's subjects (OpenPart makes it
// so), and a filter, even one that matches every subject, makes the
// server match it against each message block's subject tree for every
// message it delivers (with a subject per task that cost ~100 µs an
// event and held reads to ~14,000 events/s). Creating the consumer may
// take up to 10 s. Safe for concurrent use, one call a part.
func (l Log) Tail(ctx context.Context, part int, from uint64, heartbeat time.Duration, fn func(pos events.Position, data []byte, err error) error) error {
	o := followOptions{pull: []jetstream.PullMessagesOpt{jetstream.PullHeartbeat(heartbeat)}, createTimeout: tailCreateTimeout, goOn: true}
	l = l.withDefaults()
	return l.followPart(ctx, part, from, o, func(msg jetstream.Msg, seq uint64, err error) error {
		if err != nil {
			return fn(0, nil, err)
		}
		return fn(l.Shards.Position(part, seq), msg.Data(), nil)
	})
}

// followOptions are how followPart reads.
type followOptions struct {
	filters []string  // subject filters; none: every message
	since   time.Time // if set, start at the first message stored at or after since, not at from
	pull    []jetstream.PullMessagesOpt
	// createTimeout bounds the consumer's creation; 0: ctx alone.
	createTimeout time.Duration
	goOn          bool // a failed pull is passed to fn and the read goes on
	// pendingOnly: end with errNothingPending at once when the consumer
	// has no message pending.
	pendingOnly bool
}

// errNothingPending ends a followPart with pendingOnly whose consumer has
// no message pending; errReadEnd is how Read's fn ends its followPart.
var (
	errNothingPending = errors.New("eventlog: nothing pending")
	errReadEnd        = errors.New("eventlog: read to its end")
)

// followPart is the one ordered read of the log, of part i from its
// stream sequence from, that Read, Follow and Tail share: it calls fn
// with each message and its stream sequence, in order, until ctx ends
// (returning ctx.Err()), fn fails (returning fn's error) or the consumer
// ends. A failed pull ends it with the pull's error unless o.goOn, when
// fn gets it instead (with a nil message) and the read goes on.
func (l Log) followPart(ctx context.Context, i int, from uint64, o followOptions, fn func(msg jetstream.Msg, seq uint64, err error) error) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: o.filters}
	if !o.since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &o.since
	} else if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if o.createTimeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, o.createTimeout)
	}
	cons, err := l.JS.OrderedConsumer(cctx, l.Shards.Stream(l.Stream, i), cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("eventlog: consumer: %w", err)
	}
	if o.pendingOnly {
		if info, err := cons.Info(ctx); err != nil {
			return fmt.Errorf("eventlog: consumer info: %w", err)
		} else if info.NumPending == 0 {
			return errNothingPending
		}
	}
	it, err := cons.Messages(o.pull...)
	if err != nil {
		return fmt.Errorf("eventlog: consume: %w", err)
	}
	defer it.Stop()
	defer context.AfterFunc(ctx, it.Stop)()
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) || err != nil && ctx.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("eventlog: follow: %w", err)
		}
		var seq uint64
		if err == nil {
			seq, err = streamSeq(msg)
		}
		if err != nil {
			if !o.goOn {
				return fmt.Errorf("eventlog: follow: %w", err)
			}
			if err := fn(nil, 0, err); err != nil {
				return err
			}
			continue
		}
		if err := fn(msg, seq, nil); err != nil {
			return err
		}
	}
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
