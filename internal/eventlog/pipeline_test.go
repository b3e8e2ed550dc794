package eventlog

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/internal/broker"
)

func TestParseAck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, data string
		seq        uint64
		code       jetstream.ErrorCode // the APIError's, when one is wanted
		invalid    bool
	}{
		{name: "Ack", data: `{"stream":"EVENTS","seq":42}`, seq: 42},
		{name: "Spaced", data: `{"stream":"EVENTS", "seq": 7 , "duplicate":true}`, seq: 7},
		{name: "Domain", data: `{"stream":"EVENTS","domain":"hub","seq":18446744073709551615}`, seq: 18446744073709551615},
		{name: "Conflict", data: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},"stream":"EVENTS","seq":0}`,
			code: jetstream.JSErrCodeStreamWrongLastSequence},
		{name: "Overflow", data: `{"stream":"EVENTS","seq":18446744073709551616}`, invalid: true},
		{name: "Zero", data: `{"stream":"EVENTS","seq":0}`, invalid: true},
		{name: "NotANumber", data: `{"stream":"EVENTS","seq":"12"}`, invalid: true},
		{name: "Trailing", data: `{"stream":"EVENTS","seq":12x}`, invalid: true},
		{name: "Empty", data: ``, invalid: true},
		{name: "Garbage", data: `not json`, invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := parseAck(&nats.Msg{Data: []byte(tc.data)})
			var apiErr *jetstream.APIError
			switch {
			case tc.invalid:
				if !errors.Is(a.err, jetstream.ErrInvalidJSAck) {
					t.Fatalf("parseAck(%s) = %d, %v; want ErrInvalidJSAck", tc.data, a.seq, a.err)
				}
			case tc.code != 0:
				if !errors.As(a.err, &apiErr) || apiErr.ErrorCode != tc.code || !IsConflict(a.err) {
					t.Fatalf("parseAck(%s) = %d, %v; want API error %d", tc.data, a.seq, a.err, tc.code)
				}
			case a.err != nil || a.seq != tc.seq:
				t.Fatalf("parseAck(%s) = %d, %v; want %d", tc.data, a.seq, a.err, tc.seq)
			}
		})
	}
	noResponders := &nats.Msg{Header: nats.Header{"Status": {"503"}}}
	if a := parseAck(noResponders); !errors.Is(a.err, nats.ErrNoResponders) {
		t.Fatalf("no responders: %v", a.err)
	}
}

// TestPipeline sends real appends through a pipeline: each gets its own
// sequence, a wrong expected sequence the server's conflict, a subject no
// stream takes an answer of no responders, an ack that does not come the
// timeout, and a lost connection fails what awaits its ack.
func TestPipeline(t *testing.T) {
	t.Parallel()
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect(nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "P", Subjects: []string{"p.>"}}); err != nil {
		t.Fatal(err)
	}
	p, err := NewPipeline(nc, 2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	msg := func(subject string, expected string) *nats.Msg {
		m := &nats.Msg{Subject: subject, Data: []byte("x"), Header: nats.Header{}}
		if expected != "" {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, expected)
		}
		return m
	}

	t.Run("Sequences", func(t *testing.T) {
		for want := uint64(1); want <= 3; want++ {
			seq, err := p.Publish(ctx, msg("p.a", ""))
			if err != nil || seq != want {
				t.Fatalf("append %d: seq %d, %v", want, seq, err)
			}
		}
	})
	t.Run("Conflict", func(t *testing.T) {
		if _, err := p.Publish(ctx, msg("p.a", "1")); !IsConflict(err) {
			t.Fatalf("wrong expected sequence: %v, want a conflict", err)
		}
	})
	t.Run("NoResponders", func(t *testing.T) {
		if _, err := p.Publish(ctx, msg("nostream", "")); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("no stream: %v, want no responders", err)
		}
	})
	t.Run("Canceled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		// A core subscriber takes the message and never answers.
		sub, err := nc.SubscribeSync("silent")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if _, err := p.Publish(cctx, msg("silent", "")); !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled: %v", err)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		quick, err := NewPipeline(nc, 1, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		defer quick.Close()
		sub, err := nc.SubscribeSync("silent")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if _, err := quick.Publish(ctx, msg("silent", "")); !errors.Is(err, ErrAckTimeout) {
			t.Fatalf("unanswered: %v, want the ack timeout", err)
		}
		if seq, err := quick.Publish(ctx, msg("p.b", "")); err != nil || seq == 0 {
			t.Fatalf("after a timeout: seq %d, %v", seq, err)
		}
	})
	t.Run("Disconnected", func(t *testing.T) {
		sub, err := nc.SubscribeSync("silent")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		got := make(chan error, 1)
		go func() {
			_, err := p.Publish(ctx, msg("silent", ""))
			got <- err
		}()
		if _, err := sub.NextMsg(5 * time.Second); err != nil { // the append is out, awaiting its ack
			t.Fatal(err)
		}
		if err := srv.Disconnect(nc); err != nil {
			t.Fatal(err)
		}
		if err := <-got; !errors.Is(err, nats.ErrDisconnected) {
			t.Fatalf("lost connection: %v, want ErrDisconnected", err)
		}
	})
}
