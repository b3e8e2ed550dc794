package eventlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Message is one stored message of the log.
type Message struct {
	Pos     events.Position // the message's log position
	Subject string
	Data    []byte
	Time    time.Time
}

// ReadOptions select what Read delivers.
type ReadOptions struct {
	// Filter, if set, returns the subject filter to read in a shard from
	// the shard's subjects; default every subject of the stream.
	Filter func(events.Subjects) string
	// Shards, if set, lists the shards to read; default all.
	Shards []int
	Since  time.Time // start at the first message stored at or after Since
	// From, if Since is zero, starts at this position: in its shard at
	// its sequence, in the others at their start.
	From events.Position
	// Progress, if set, is called about every 50,000 messages and at the
	// end with the number of messages reached and the sum of the shards'
	// last sequences (with one shard: the sequence reached and the
	// stream's last sequence).
	Progress func(seq, last uint64)
	// Quarantine, if set, is called by Events with each message that
	// does not decode, and the read goes on unless it returns an error
	// (which ends the read). Without it such a message ends the read
	// with its *events.CorruptError.
	Quarantine func(*events.CorruptError) error
}

// Log reads the event streams in log order: whole, by task, by lineage or
// by customer. It needs no Store, so offline tools read a log they have
// not opened for writing (ReadShards gives them Shards). A sharded log is
// read shard after shard, each in its order; a message's Pos is its
// position. It is safe for concurrent use.
type Log struct {
	JS       jetstream.JetStream
	Stream   string          // default events.DefaultStream
	Subjects events.Subjects // default events.DefaultSubjects
	Shards   events.Shards   // default one shard
}

// shards returns the shards o selects.
func (l Log) shards(o ReadOptions) []int {
	if o.Shards != nil {
		return o.Shards
	}
	all := make([]int, l.Shards.N())
	for i := range all {
		all[i] = i
	}
	return all
}

// WithDefaults returns l with its defaults filled in: the stream name and
// the subjects a zero field means.
func (l Log) WithDefaults() Log { return l.withDefaults() }

func (l Log) withDefaults() Log {
	if l.Stream == "" {
		l.Stream = events.DefaultStream
	}
	if l.Subjects.Root == "" {
		l.Subjects = events.DefaultSubjects
	}
	return l
}

// Read calls fn for every stored message o selects, shard after shard,
// each in order up to the last sequence its stream held when Read came to
// it. It stops at the first error fn returns, or when ctx ends (returning
// ctx.Err()).
func (l Log) Read(ctx context.Context, o ReadOptions, fn func(Message) error) error {
	l = l.withDefaults()
	shards := l.shards(o)
	streams := make([]jetstream.Stream, len(shards))
	var total uint64
	for n, i := range shards {
		name := l.Shards.Stream(l.Stream, i)
		s, err := l.JS.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("eventlog: stream %s: %w", name, err)
		}
		streams[n], total = s, total+s.CachedInfo().State.LastSeq
	}
	var done uint64
	for n, i := range shards {
		so := o
		if o.Progress != nil {
			so.Progress = func(seq, _ uint64) { o.Progress(done+seq, total) }
		}
		if err := l.readShard(ctx, i, streams[n], so, fn); err != nil {
			return err
		}
		done += streams[n].CachedInfo().State.LastSeq
	}
	if o.Progress != nil && len(shards) > 1 {
		o.Progress(total, total)
	}
	return nil
}

// readShard is Read of shard i, whose stream is s: followPart, stopped
// where the stream ended when Read came to it, or earlier when the
// consumer reports no more matching messages pending.
func (l Log) readShard(ctx context.Context, i int, s jetstream.Stream, o ReadOptions, fn func(Message) error) error {
	last := s.CachedInfo().State.LastSeq
	if last == 0 || s.CachedInfo().State.Msgs == 0 {
		return nil
	}
	fo := followOptions{since: o.Since, pendingOnly: true}
	if o.Filter != nil {
		fo.filters = []string{o.Filter(l.Shards.Subjects(l.Subjects, i))}
	}
	var from uint64
	if shard, seq := l.Shards.Split(o.From); o.Since.IsZero() && seq > 0 && shard == i {
		from = seq
	}
	err := l.followPart(ctx, i, from, fo, func(msg jetstream.Msg, _ uint64, _ error) error {
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		seq := meta.Sequence.Stream
		if seq > last {
			return errReadEnd
		}
		if err := fn(Message{Pos: l.Shards.Position(i, seq), Subject: msg.Subject(), Data: msg.Data(), Time: meta.Timestamp}); err != nil {
			return err
		}
		if o.Progress != nil && seq%50000 == 0 {
			o.Progress(seq, last)
		}
		if seq == last || meta.NumPending == 0 {
			return errReadEnd
		}
		return nil
	})
	switch {
	case errors.Is(err, errNothingPending):
		return nil
	case err != nil && !errors.Is(err, errReadEnd):
		return err
	}
	if o.Progress != nil {
		o.Progress(last, last)
	}
	return nil
}

// Events calls fn for every decoded event o selects, in order. A message
// that does not decode is quarantined: passed to o.Quarantine, which may
// let the read go on, or else it ends the read with an error wrapping its
// *events.CorruptError.
func (l Log) Events(ctx context.Context, o ReadOptions, fn func(events.Event) error) error {
	return l.Read(ctx, o, func(m Message) error {
		ev, err := events.DecodeAt(m.Data, m.Pos)
		if err == nil {
			return fn(ev)
		}
		corrupt := &events.CorruptError{Pos: m.Pos, Subject: m.Subject, At: m.Time, Err: err}
		if o.Quarantine != nil {
			return o.Quarantine(corrupt)
		}
		return fmt.Errorf("eventlog: %w", corrupt)
	})
}

// Task returns one task's events in log order (none for an unknown id).
func (l Log) Task(ctx context.Context, taskID string) ([]events.Event, error) {
	l = l.withDefaults()
	var evs []events.Event
	filter := func(subj events.Subjects) string { return subj.Task(taskID) }
	err := l.Events(ctx, ReadOptions{Filter: filter}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	return evs, err
}

// LineageOf returns the events of the whole lineage taskID belongs to
// (its root and every descendant), in log order; nil for an unknown id.
func (l Log) LineageOf(ctx context.Context, taskID string) ([]events.Event, error) {
	return FindLineage(ctx, l, taskID)
}

// TaskReader reads tasks and lineages: the live log (Log) or an archive
// of it (internal/archive).
type TaskReader interface {
	Task(ctx context.Context, taskID string) ([]events.Event, error)
	Lineage(ctx context.Context, root aggregate.State) ([]events.Event, error)
}

// FindLineage is LineageOf on r: it reads taskID's events, then its
// root's, then the root's lineage.
func FindLineage(ctx context.Context, r TaskReader, taskID string) ([]events.Event, error) {
	evs, err := r.Task(ctx, taskID)
	if err != nil || len(evs) == 0 {
		return nil, err
	}
	root := aggregate.Replay(evs)
	if rootID := root.Spec.RootID; rootID != "" && rootID != taskID {
		rootEvs, err := r.Task(ctx, rootID)
		if err != nil {
			return nil, err
		}
		if len(rootEvs) > 0 {
			root = aggregate.Replay(rootEvs)
		}
	}
	return r.Lineage(ctx, root)
}

// Lineage returns the events of the lineage root heads, in log order.
// Every descendant is created after its root, by the same customer, in
// the root's part, so it scans that customer's events there from the
// root's first. A message there that does not decode ends the read with
// its *events.CorruptError only when it is on a member's subject (a task
// whose creation read before it joined the lineage); another task's, of
// the same customer, is passed over.
func (l Log) Lineage(ctx context.Context, root aggregate.State) ([]events.Event, error) {
	l = l.withDefaults()
	if root.Spec.RootID == "" {
		return nil, nil
	}
	var out []events.Event
	in := InLineage(root.Spec.RootID)
	members := map[string]bool{}
	part, _ := l.Shards.Split(root.FirstSeq)
	o := ReadOptions{
		Filter: func(subj events.Subjects) string { return subj.Customer(root.CustomerID) },
		Shards: []int{part}, From: root.FirstSeq,
		Quarantine: func(c *events.CorruptError) error {
			if _, task, _ := events.TaskSubject(c.Subject); members[task] {
				return fmt.Errorf("eventlog: %w", c)
			}
			return nil
		},
	}
	err := l.Events(ctx, o, func(ev events.Event) error {
		if in(ev) {
			members[ev.TaskID] = true
			out = append(out, ev)
		}
		return nil
	})
	return out, err
}

// InLineage returns a filter that, fed the events of the root's customer
// in log order from the root's first, reports which belong to the
// lineage of rootID. A task's first event decides: only a creation
// naming the root (as Apply folds it) joins the lineage. Not safe for
// concurrent use.
func InLineage(rootID string) func(events.Event) bool {
	member := map[string]bool{}
	return func(ev events.Event) bool {
		in, seen := member[ev.TaskID]
		if !seen {
			in = events.CreationRoot(ev) == rootID
			member[ev.TaskID] = in
		}
		return in
	}
}

// Customer calls fn for every event of a customer's tasks stored at or
// after since (zero: all), in log order (shard after shard). A message
// that does not decode goes to quarantine as in Events (nil: it ends the
// read).
func (l Log) Customer(ctx context.Context, customerID string, since time.Time, fn func(events.Event) error, quarantine func(*events.CorruptError) error) error {
	filter := func(subj events.Subjects) string { return subj.Customer(customerID) }
	return l.Events(ctx, ReadOptions{Filter: filter, Since: since, Quarantine: quarantine}, fn)
}
