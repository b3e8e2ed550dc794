package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/store"
)

// asyncInFlight bounds the async appends awaiting their acks.
const asyncInFlight = 4096

// syncWithin bounds one sync append measurement, so a slow disk (under
// sync_always) shortens the sample instead of the patience of the user.
const syncWithin = 5 * time.Second

// sampleEvent is the payload of the raw appends: an encoded Claimed, the
// most frequent event on the hot path.
func sampleEvent() ([]byte, error) {
	return events.Encode(history("task-raw", "cust-raw", time.Now())[3])
}

// rawMsg is one raw append: the event on subject with the store's type
// header.
func rawMsg(subject string, data []byte) *nats.Msg {
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(store.TypeHeader, string(events.TypeClaimed))
	return msg
}

// rawSync appends up to n messages synchronously with the header every
// store append on a single server carries (the expected last subject
// sequence) from
// publishers goroutines, each writing tasks of historyLen events to their
// own subjects, and stops early after within. It returns messages/s.
func rawSync(ctx context.Context, st *store.Store, n, publishers int, within time.Duration) (float64, int, error) {
	data, err := sampleEvent()
	if err != nil {
		return 0, 0, err
	}
	js, subj := st.JetStream(), st.Subjects()
	var budget, sent atomic.Int64
	budget.Store(int64(n))
	g, ctx := errgroup.WithContext(ctx)
	start := time.Now()
	deadline := start.Add(within)
	for p := range publishers {
		g.Go(func() error {
			var subject string
			var last uint64
			for k := 0; budget.Add(-1) >= 0; k++ {
				if k%historyLen == 0 {
					subject, last = subj.Event(customer(p), events.NewID()), 0
				}
				ack, err := js.PublishMsg(ctx, rawMsg(subject, data), jetstream.WithExpectLastSequencePerSubject(last))
				if err != nil {
					return fmt.Errorf("publisher %d message %d: %w", p, k, err)
				}
				last = ack.Sequence
				sent.Add(1)
				if k%32 == 31 && time.Now().After(deadline) {
					return nil
				}
			}
			return nil
		})
	}
	err = g.Wait()
	elapsed := time.Since(start)
	return float64(sent.Load()) / elapsed.Seconds(), int(sent.Load()), err
}

// rawAsync appends n messages with async publishes, at most
// asyncInFlight awaiting their acks, historyLen per subject, each with
// the type header. An async append cannot carry the
// expected last subject sequence (the previous append's sequence is not
// known yet), so this ceiling is, if anything, a little high. It returns
// messages/s, counted until the last ack.
func rawAsync(ctx context.Context, nc *nats.Conn, subj events.Subjects, n int) (float64, error) {
	data, err := sampleEvent()
	if err != nil {
		return 0, err
	}
	js, err := newAsyncPublisher(nc)
	if err != nil {
		return 0, err
	}
	defer js.CleanupPublisher()
	start := time.Now()
	var subject string
	for i := range n {
		if i%historyLen == 0 {
			subject = subj.Event(customer(i/historyLen), events.NewID())
			if err := ctx.Err(); err != nil {
				return 0, err
			}
		}
		if _, err := js.PublishMsgAsync(rawMsg(subject, data), jetstream.WithStallWait(time.Minute)); err != nil {
			return 0, fmt.Errorf("async publish: %w", err)
		}
	}
	if err := js.wait(ctx); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// asyncPublisher publishes asynchronously, up to asyncInFlight at once,
// and remembers failed publishes.
type asyncPublisher struct {
	jetstream.JetStream
	failed   atomic.Int64
	firstErr atomic.Value
}

func newAsyncPublisher(nc *nats.Conn) (*asyncPublisher, error) {
	p := &asyncPublisher{}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(asyncInFlight),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			if p.failed.Add(1) == 1 {
				p.firstErr.Store(err)
			}
		}))
	p.JetStream = js
	return p, err
}

// wait waits until every async publish has its ack and fails if any
// publish failed.
func (p *asyncPublisher) wait(ctx context.Context) error {
	select {
	case <-p.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return fmt.Errorf("%d async publishes still pending after a minute", p.PublishAsyncPending())
	case <-ctx.Done():
		return ctx.Err()
	}
	if k := p.failed.Load(); k > 0 {
		return fmt.Errorf("%d async publishes failed, first: %v", k, p.firstErr.Load())
	}
	return nil
}

// rawRead reads every event of stream with an ordered consumer, as
// eventlog.Log.Read does, doing nothing with them, and returns messages/s and
// the count. It reads without a filter, as the projections' tail does:
// the stream holds nothing else.
func rawRead(ctx context.Context, js jetstream.JetStream, stream string, subj events.Subjects) (float64, int, error) {
	n := 0
	start := time.Now()
	err := eventlog.Log{JS: js, Stream: stream, Subjects: subj}.Read(ctx, eventlog.ReadOptions{}, func(eventlog.Message) error {
		n++
		return nil
	})
	return float64(n) / time.Since(start).Seconds(), n, err
}

// ceiling measures what JetStream itself does on this machine: sync OCC
// appends from 1 and 16 publishers, async appends, ordered reads.
func (r *run) ceiling(ctx context.Context, nc *nats.Conn) error {
	for _, c := range []struct {
		name       string
		publishers int
		n          int
		rate       *float64
		fig        string
	}{
		{"raw1", 1, r.scaled(20000, 200), &r.sync1Rate, FigSync1},
		{"raw16", concurrency, r.scaled(40000, 400), &r.sync16Rate, FigSync16},
	} {
		st, err := openStore(ctx, nc, c.name, nil)
		if err != nil {
			return err
		}
		cpu, start := processCPU(), time.Now()
		rate, sent, err := rawSync(ctx, st, c.n, c.publishers, syncWithin)
		cpu, elapsed := processCPU()-cpu, time.Since(start)
		st.Close()
		if err != nil {
			return err
		}
		*c.rate = rate
		r.say("  %d sync appends", sent)
		r.sayCPU(c.name, cpu, elapsed, sent, "append")
		r.add(Figure{Section: "ceiling", Name: c.fig, Value: rate, Unit: "msgs/s"})
	}

	st, err := openStore(ctx, nc, "rawasync", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	n := r.scaled(200000, 2000)
	if r.asyncRate, err = rawAsync(ctx, nc, st.Subjects(), n); err != nil {
		return err
	}
	r.say("  %d async appends", n)
	r.add(Figure{Section: "ceiling", Name: FigAsync, Value: r.asyncRate, Unit: "msgs/s"})

	rate, read, err := rawRead(ctx, st.JetStream(), "BENCH_RAWASYNC", st.Subjects())
	if err != nil {
		return err
	}
	if read != n {
		return fmt.Errorf("read %d messages back, want %d", read, n)
	}
	r.add(Figure{Section: "ceiling", Name: FigRead, Value: rate, Unit: "msgs/s"})
	return r.claims(ctx, nc)
}

// claims measures the store's Execute of Claim commands — load (cached
// state), Decide, append with the OCC header — from 16 goroutines on
// released tasks, against the raw sync append rate from 16 publishers.
func (r *run) claims(ctx context.Context, nc *nats.Conn) error {
	st, err := openStore(ctx, nc, "claims", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	n := r.scaled(5000, 200)
	type released struct{ id, token string }
	tasks := make([]released, n)
	var next atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for range concurrency {
		g.Go(func() error {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				id, token := events.NewID(), events.NewID()
				spec := events.TaskSpec{RootID: id, Queue: "default", TimeoutSeconds: 60}
				if _, _, err := st.Execute(gctx, id, "", aggregate.Schedule{TaskID: id, CustomerID: customer(i), Spec: spec}); err != nil {
					return err
				}
				if _, _, err := st.Execute(gctx, id, "", aggregate.ReleaseDue{DeliveryID: token}); err != nil {
					return err
				}
				tasks[i] = released{id, token}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	next.Store(0)
	g, gctx = errgroup.WithContext(ctx)
	start := time.Now()
	for w := range concurrency {
		g.Go(func() error {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				cmd := aggregate.Claim{DeliveryID: tasks[i].token, ExecutorID: fmt.Sprintf("bench-%d", w)}
				if _, _, err := st.Execute(gctx, tasks[i].id, "", cmd); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	rate := float64(n) / time.Since(start).Seconds()
	r.say("  %d claims", n)
	r.add(Figure{Section: "ceiling", Name: FigClaim, Value: rate, Unit: "claims/s", Ratio: rate / r.sync16Rate, RatioOf: ratioSync16})
	return nil
}

// syncAlways measures sync OCC appends on a second server that fsyncs
// every append before acknowledging it, against the default's.
func (r *run) syncAlways(ctx context.Context) error {
	srv, nc, err := startServer(filepath.Join(r.dir, "sync-always"), true)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	defer nc.Close()
	var rate16 float64
	for _, c := range []struct {
		name       string
		publishers int
		n          int
		fig        string
		def        float64
	}{
		{"always1", 1, r.scaled(5000, 100), FigSyncAlways1, r.sync1Rate},
		{"always16", concurrency, r.scaled(20000, 200), FigSyncAlways16, r.sync16Rate},
	} {
		st, err := openStore(ctx, nc, c.name, nil)
		if err != nil {
			return err
		}
		rate, sent, err := rawSync(ctx, st, c.n, c.publishers, syncWithin)
		st.Close()
		if err != nil {
			return err
		}
		r.say("  %d sync appends", sent)
		r.add(Figure{Section: "sync-always", Name: c.fig, Value: rate, Unit: "msgs/s", Ratio: rate / c.def, RatioOf: ratioDefaultSync})
		rate16 = rate
	}
	r.add(Figure{Section: "sync-always", Name: FigSyncAlwaysCost, Value: r.sync16Rate / rate16, Unit: "× slower"})
	return nil
}
