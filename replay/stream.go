package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Message is one stored message of the log.
type Message struct {
	Seq     uint64
	Subject string
	Data    []byte
	Time    time.Time
}

// ReadOptions select what Read delivers.
type ReadOptions struct {
	Filter string    // subject filter; default every subject of the stream
	Since  time.Time // start at the first message stored at or after Since
	From   uint64    // start at this sequence (if Since is zero)
	// Progress, if set, is called about every 50,000 messages and at the
	// end with the sequence reached and the stream's last sequence.
	Progress func(seq, last uint64)
}

// Read calls fn for every message of stream, in order, up to the last
// sequence the stream held when Read started. It stops at the first error
// fn returns.
func Read(ctx context.Context, js jetstream.JetStream, stream string, o ReadOptions, fn func(Message) error) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("replay: stream %s: %w", stream, err)
	}
	last := s.CachedInfo().State.LastSeq
	if last == 0 || s.CachedInfo().State.Msgs == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{}
	if o.Filter != "" {
		cfg.FilterSubjects = []string{o.Filter}
	}
	if !o.Since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &o.Since
	} else if o.From > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, o.From
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("replay: consumer: %w", err)
	}
	// Read stops where the stream ended when it started, or earlier when
	// the consumer reports no more matching messages pending.
	if info, err := cons.Info(ctx); err != nil {
		return fmt.Errorf("replay: consumer info: %w", err)
	} else if info.NumPending == 0 {
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("replay: read: %w", err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		seq := meta.Sequence.Stream
		if seq > last {
			break
		}
		if err := fn(Message{Seq: seq, Subject: msg.Subject(), Data: msg.Data(), Time: meta.Timestamp}); err != nil {
			return err
		}
		if o.Progress != nil && seq%50000 == 0 {
			o.Progress(seq, last)
		}
		if seq == last || meta.NumPending == 0 {
			break
		}
	}
	if o.Progress != nil {
		o.Progress(last, last)
	}
	return nil
}
