package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/broker"
	"github.com/taskledger/taskledger/internal/ids"
	"github.com/taskledger/taskledger/internal/store"
)

// The end-to-end benchmarks below do a fixed amount of work sized by
// BENCH_SCALE and ignore b.N: run them with -benchtime 1x, as `make bench`
// does. They report their figures with b.ReportMetric (ns/op is suppressed,
// it would only be the wall time of the whole run) and print one line per
// figure as they go.

// benchScale is BENCH_SCALE, parsed once by TestMain.
var benchScale = 1.0

// rawSyncRate is the sync OCC append rate with 16 publishers measured by
// BenchmarkRawAppend in this process, or 0. BenchmarkClaimThroughput
// compares against it. Benchmarks run one at a time, so no lock is needed.
var rawSyncRate float64

// concurrency is the number of concurrent publishers and claimers.
const concurrency = 16

func TestMain(m *testing.M) {
	if v := os.Getenv("BENCH_SCALE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0) {
			fmt.Fprintf(os.Stderr, "BENCH_SCALE=%q: want a positive number\n", v)
			os.Exit(2)
		}
		benchScale = f
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// scale returns n times BENCH_SCALE, but at least 1000.
func scale(n int) int { return max(int(float64(n)*benchScale), 1000) }

// report records one figure as a metric and prints it as a line.
func report(b *testing.B, value float64, unit, format string, args ...any) {
	b.Helper()
	b.ReportMetric(value, unit)
	say(format, args...)
}

// say prints a line at once (benchmark output is streamed), unlike b.Logf,
// which shows only after the benchmark ends.
func say(format string, args ...any) { fmt.Printf("    "+format+"\n", args...) }

// startServer starts an embedded server with file storage in a fresh
// directory and returns an in-process connection to it. Both are shut
// down when b ends.
func startServer(b *testing.B) *nats.Conn {
	b.Helper()
	srv, err := broker.StartEmbedded(broker.EmbeddedConfig{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	return nc
}

// openStore opens a Store on its own stream and subject root.
func openStore(b *testing.B, nc *nats.Conn, name string) *store.Store {
	b.Helper()
	st, err := store.Open(b.Context(), nc, store.Config{
		Stream:   "BENCH_" + strings.ToUpper(name),
		Subjects: events.Subjects{Root: name},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// customers is how many customers the generated tasks belong to.
const customers = 64

func customer(i int) string { return fmt.Sprintf("cust-%02d", i%customers) }

// spec is a typical root task's spec.
func spec(taskID string, at time.Time) events.TaskSpec {
	return events.TaskSpec{
		RootID:    taskID,
		RequestID: "req-" + taskID,
		Queue:     "default",
		Signal: events.Signal{
			ID: "sig-" + taskID, URI: "https://ci.example.com/hooks/github",
			EventType: "pull_request", EventAction: "opened",
		},
		Repo: "example/service",
		Message: events.Message{ID: "msg-0", CreatedAt: at, Content: []events.ContentPart{{
			Type: "text",
			Text: "The integration test TestCheckoutRetries fails about one run in five since the last " +
				"dependency bump; find the cause, fix it and open a pull request with the fix.",
		}}},
		RunAt:          at,
		TimeoutSeconds: 3600,
	}
}

// historyLen is the number of events history returns.
const historyLen = 10

// history returns the events of one task's typical life, in log order:
// scheduled, released, ready published, claimed, four follow-up messages
// with a mailbox read among them, and a successful result.
func history(taskID, customerID string, at time.Time) []events.Event {
	dlv := ids.New()
	mail := func(i int) events.Payload {
		return events.MailboxAppended{Index: i, Message: events.Message{
			ID: "msg-" + strconv.Itoa(i), CreatedAt: at,
			Content: []events.ContentPart{{Type: "text", Text: "also check the flaky timeout in the retry path"}},
		}}
	}
	payloads := []events.Payload{
		events.TaskScheduled{Spec: spec(taskID, at)},
		events.DeliveryPending{DeliveryID: dlv, Attempt: 1, NextAt: at},
		events.ReadyPublished{DeliveryID: dlv},
		events.Claimed{DeliveryID: dlv, ExecutorID: "exec-1", Deadline: at.Add(time.Hour)},
		mail(1), mail(2), mail(3),
		events.MailboxRead{Cursor: 3},
		mail(4),
		events.ResultRecorded{DeliveryID: dlv, Result: events.Result{
			Success: true, Summary: "fixed the retry backoff; opened a pull request",
			Effects: []events.Effect{{Kind: "pull_request", Ref: "#128", URL: "https://example.com/pr/128"}},
		}},
	}
	evs := make([]events.Event, len(payloads))
	for i, p := range payloads {
		evs[i] = events.Event{
			ID: ids.New(), TaskID: taskID, CustomerID: customerID, Number: i + 1,
			At: at, Actor: "scheduler", Data: p,
		}
	}
	return evs
}

// rawAppend publishes n messages synchronously with the store's headers
// (message id, expected last subject sequence) from publishers goroutines,
// each to its own tasks of historyLen events, and returns messages per
// second.
func rawAppend(ctx context.Context, st *store.Store, n, publishers int) (float64, error) {
	sample, err := events.Encode(history("task-raw", "cust-raw", time.Now())[3])
	if err != nil {
		return 0, err
	}
	js, subj := st.JetStream(), st.Subjects()
	g, ctx := errgroup.WithContext(ctx)
	start := time.Now()
	for p := range publishers {
		count := n / publishers
		if p < n%publishers {
			count++
		}
		g.Go(func() error {
			subjects := make([]string, max(count/historyLen, 1))
			for i := range subjects {
				subjects[i] = subj.Event(customer(p), ids.New())
			}
			last := make([]uint64, len(subjects))
			for i := range count {
				t := i % len(subjects)
				msg := &nats.Msg{Subject: subjects[t], Data: sample, Header: nats.Header{}}
				msg.Header.Set(store.TypeHeader, string(events.TypeClaimed))
				ack, err := js.PublishMsg(ctx, msg,
					jetstream.WithMsgID(ids.New()), jetstream.WithExpectLastSequencePerSubject(last[t]))
				if err != nil {
					return fmt.Errorf("publisher %d message %d: %w", p, i, err)
				}
				last[t] = ack.Sequence
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// BenchmarkRawAppend measures JetStream's own sync publish rate with the
// optimistic-concurrency headers every store append carries: the ceiling
// for any command that appends one event.
func BenchmarkRawAppend(b *testing.B) {
	nc := startServer(b)
	n := scale(20000)
	for _, publishers := range []int{1, concurrency} {
		b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
			st := openStore(b, nc, fmt.Sprintf("raw%d", publishers))
			rate, err := rawAppend(b.Context(), st, n, publishers)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(0, "ns/op")
			report(b, rate, "msgs/s", "raw sync OCC append, %d publisher(s), %d msgs: %.0f msgs/s", publishers, n, rate)
			if publishers == concurrency {
				rawSyncRate = rate
			}
		})
	}
}

// fillGroup is how many tasks fill writes at a time. Groups alternate
// between two layouts: interleaved, where the group's tasks take turns so
// a task's events lie about fillGroup*historyLen sequences apart, as they
// do with that many tasks in flight; and contiguous, one task's events
// side by side (the best case for a load).
const fillGroup = 1000

// filled is a task fill wrote.
type filled struct {
	id          string
	interleaved bool
}

// fill appends about n encoded events, historyLen per task, with async
// publishes and returns the tasks.
func fill(b *testing.B, nc *nats.Conn, subj events.Subjects, n int) []filled {
	b.Helper()
	var failed atomic.Int64
	var firstErr atomic.Value
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			if failed.Add(1) == 1 {
				firstErr.Store(err)
			}
		}))
	if err != nil {
		b.Fatal(err)
	}
	defer js.CleanupPublisher()

	tasks := make([]filled, max(n/historyLen, 1))
	for i := range tasks {
		tasks[i] = filled{id: ids.New(), interleaved: i/fillGroup%2 == 0}
	}
	total := len(tasks) * historyLen
	at := time.Now()
	start := time.Now()
	published := 0
	publish := func(msg *nats.Msg) {
		if _, err := js.PublishMsgAsync(msg, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatalf("async publish: %v", err)
		}
		if published++; published%100000 == 0 {
			say("fill: %d/%d events, %.0f events/s", published, total, float64(published)/time.Since(start).Seconds())
		}
	}
	for lo := 0; lo < len(tasks); lo += fillGroup {
		group := tasks[lo:min(lo+fillGroup, len(tasks))]
		msgs := make([][]*nats.Msg, len(group))
		for i, t := range group {
			cust := customer(lo + i)
			for _, ev := range history(t.id, cust, at) {
				data, err := events.Encode(ev)
				if err != nil {
					b.Fatal(err)
				}
				msg := &nats.Msg{Subject: subj.Event(cust, t.id), Data: data, Header: nats.Header{}}
				msg.Header.Set(store.TypeHeader, string(ev.Type()))
				msgs[i] = append(msgs[i], msg)
			}
		}
		for k := range historyLen * len(group) {
			if group[0].interleaved {
				publish(msgs[k%len(group)][k/len(group)])
			} else {
				publish(msgs[k/historyLen][k%historyLen])
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatalf("fill: %d async publishes still pending after a minute", js.PublishAsyncPending())
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("fill: %d async publishes failed, first: %v", n, firstErr.Load())
	}
	rate := float64(total) / time.Since(start).Seconds()
	report(b, rate, "fill-events/s", "fill (async, encode included): %d events in %d tasks, %.0f events/s", total, len(tasks), rate)
	return tasks
}

// percentile returns the p-th percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	return sorted[min(int(float64(len(sorted))*p), len(sorted)-1)]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// BenchmarkLoadTask measures Store.Load (a batch direct get of the task's
// subject and a replay) of random tasks in a log of a million events, for
// all tasks and separately for each layout fill writes.
func BenchmarkLoadTask(b *testing.B) {
	nc := startServer(b)
	st := openStore(b, nc, "load")
	tasks := fill(b, nc, st.Subjects(), scale(1_000_000))

	const loads = 2000
	info, err := st.Stream().Info(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	if want := uint64(len(tasks) * historyLen); info.State.Msgs != want {
		b.Fatalf("stream holds %d messages, want %d", info.State.Msgs, want)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var all, contiguous, interleaved []time.Duration
	for range loads {
		t := tasks[rng.IntN(len(tasks))]
		t0 := time.Now()
		s, err := st.Load(b.Context(), t.id)
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if s.Version != historyLen || s.Status != aggregate.StatusSucceeded {
			b.Fatalf("task %s: version %d status %s, want %d events and succeeded", t.id, s.Version, s.Status, historyLen)
		}
		all = append(all, d)
		if t.interleaved {
			interleaved = append(interleaved, d)
		} else {
			contiguous = append(contiguous, d)
		}
	}
	b.ReportMetric(0, "ns/op")
	for _, set := range []struct {
		name, prefix string
		lat          []time.Duration
	}{{"all", "", all}, {"contiguous", "contiguous-", contiguous}, {"interleaved", "interleaved-", interleaved}} {
		if len(set.lat) == 0 {
			continue
		}
		slices.Sort(set.lat)
		for _, p := range []float64{50, 99} {
			v := micros(percentile(set.lat, p/100))
			report(b, v, fmt.Sprintf("%sp%.0f-us", set.prefix, p), "load task (%d events) from %d-event stream, %s tasks (%d loads): p%.0f %.0f µs",
				historyLen, info.State.Msgs, set.name, len(set.lat), p, v)
		}
	}
}

// released is a task ready to be claimed with its delivery token.
type released struct{ taskID, token string }

// BenchmarkClaimThroughput measures Store.Execute(Claim) — cached state,
// decide, one OCC append — with 16 concurrent claimers on one Store, and
// compares it with the raw sync OCC append rate at the same concurrency.
func BenchmarkClaimThroughput(b *testing.B) {
	nc := startServer(b)
	ctx := b.Context()
	raw := rawSyncRate
	if raw == 0 {
		st := openStore(b, nc, "clraw")
		var err error
		if raw, err = rawAppend(ctx, st, scale(20000), concurrency); err != nil {
			b.Fatal(err)
		}
		say("raw sync OCC append, %d publishers (BenchmarkRawAppend did not run): %.0f msgs/s", concurrency, raw)
	}

	st := openStore(b, nc, "claim")
	k := scale(5000)
	tasks := make([]released, k)
	start := time.Now()
	if err := forEach(ctx, k, func(i int) error {
		id, token := ids.New(), ids.New()
		if _, _, err := st.Execute(ctx, id, "", aggregate.Schedule{
			TaskID: id, CustomerID: customer(i), Spec: spec(id, time.Time{}),
		}); err != nil {
			return err
		}
		if _, _, err := st.Execute(ctx, id, "", aggregate.ReleaseDue{DeliveryID: token}); err != nil {
			return err
		}
		tasks[i] = released{id, token}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	say("schedule+release of %d tasks (%d goroutines): %.0f tasks/s", k, concurrency, float64(k)/time.Since(start).Seconds())

	start = time.Now()
	if err := forEach(ctx, k, func(i int) error {
		t := tasks[i]
		s, evs, err := st.Execute(ctx, t.taskID, "", aggregate.Claim{DeliveryID: t.token, ExecutorID: "exec-" + strconv.Itoa(i%concurrency)})
		if err == nil && (len(evs) != 1 || s.Status != aggregate.StatusRunning) {
			err = errors.New("claim did not append one event or left the task not running")
		}
		if err != nil {
			return fmt.Errorf("claim %s: %w", t.taskID, err)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	rate := float64(k) / time.Since(start).Seconds()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(rate, "claims/s")
	report(b, 100*rate/raw, "pct-of-raw", "claim decide+append: %.0f/s = %.0f%% of raw sync append (%d goroutines, raw %.0f msgs/s)",
		rate, 100*rate/raw, concurrency, raw)
}

// forEach calls fn(i) for every i in [0, n) from concurrency goroutines
// and returns the first error.
func forEach(ctx context.Context, n int, fn func(i int) error) error {
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range concurrency {
		g.Go(func() error {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return nil
				}
				if err := fn(i); err != nil {
					return err
				}
			}
			return ctx.Err()
		})
	}
	return g.Wait()
}
