package eventlog

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/internal/broker"
)

// The append benchmarks bound what batching the store's decisions could
// gain over the pipeline as it is (docs/performance.md, "Batched
// appends"): the same OCC appends (each on a new subject, expecting it
// empty) made by appendCallers goroutines, each waiting for its own ack
// (the store today: every command's goroutine publishes its events),
// against one goroutine per appendBatch appends that sends them all and
// then waits for every ack (a batcher that collects the commands and
// appends them together). Each reports CPU µs per append (the whole
// process, server included) beside ns/op.
const (
	appendCallers = 256
	appendBatch   = 256
)

// benchStream starts an embedded server with the stream B on b.> (its
// other settings from cfg) and returns a connection to it.
func benchStream(b *testing.B, cfg jetstream.StreamConfig) *nats.Conn {
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
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	cfg.Name, cfg.Subjects = "B", []string{"b.>"}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	return nc
}

func benchPipeline(b *testing.B) (*Pipeline, func(i int) *nats.Msg) {
	nc := benchStream(b, jetstream.StreamConfig{})
	p, err := NewPipeline(nc, 4096, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	data := make([]byte, 400) // about an encoded event
	return p, func(i int) *nats.Msg {
		m := &nats.Msg{Subject: "b." + strconv.Itoa(i), Data: data, Header: nats.Header{}}
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		return m
	}
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/append")
}

func BenchmarkAppendsPerCaller(b *testing.B) {
	p, msg := benchPipeline(b)
	ctx := context.Background()
	var next atomic.Int64
	var failed atomic.Int64
	b.ResetTimer()
	cpu := cpuNow()
	var wg sync.WaitGroup
	for range appendCallers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				if _, err := p.Publish(ctx, msg(int(i))); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	reportCPU(b, cpuNow()-cpu)
	if failed.Load() > 0 {
		b.Fatalf("%d appends failed", failed.Load())
	}
}

func BenchmarkAppendsBatched(b *testing.B) {
	p, msg := benchPipeline(b)
	b.ResetTimer()
	cpu := cpuNow()
	var failed int
	for start := 1; start <= b.N; start += appendBatch {
		n := min(appendBatch, b.N-start+1)
		waiters := make([]*ackWaiter, n)
		toks := make([]uint64, n)
		p.mu.Lock()
		for j := range n {
			w := ackWaiters.Get().(*ackWaiter)
			p.next++
			toks[j], waiters[j] = p.next, w
			p.waiting[p.next] = w
		}
		p.mu.Unlock()
		for j := range n {
			m := msg(start + j)
			m.Reply = p.prefix + strconv.FormatUint(toks[j], 36)
			if err := p.nc.PublishMsg(m); err != nil {
				b.Fatal(err)
			}
		}
		for _, w := range waiters {
			if a := <-w.answer; a.err != nil {
				failed++
			}
			ackWaiters.Put(w)
		}
	}
	reportCPU(b, cpuNow()-cpu)
	if failed > 0 {
		b.Fatalf("%d appends failed", failed)
	}
}

// BenchmarkAppendsAtomicBatch makes the same appends as JetStream atomic
// batches of appendBatch (ADR-50: one ack for the batch, on its commit),
// each message still with its expected subject sequence. A batch lands
// whole or not at all: one conflict would fail the other 255.
func BenchmarkAppendsAtomicBatch(b *testing.B) {
	nc := benchStream(b, jetstream.StreamConfig{AllowAtomicPublish: true})
	data := make([]byte, 400)
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		b.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	b.ResetTimer()
	cpu := cpuNow()
	for start, batch := 1, 0; start <= b.N; start, batch = start+appendBatch, batch+1 {
		n := min(appendBatch, b.N-start+1)
		id := "b" + strconv.Itoa(batch)
		for j := range n {
			m := &nats.Msg{Subject: "b." + strconv.Itoa(start+j), Data: data, Header: nats.Header{}, Reply: inbox}
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
			m.Header.Set("Nats-Batch-Id", id)
			m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(j+1))
			if j == n-1 {
				m.Header.Set("Nats-Batch-Commit", "1")
			}
			if err := nc.PublishMsg(m); err != nil {
				b.Fatal(err)
			}
		}
		var ack *nats.Msg
		for ack == nil || len(ack.Data) == 0 { // messages before the commit may be answered empty
			if ack, err = sub.NextMsg(5 * time.Second); err != nil {
				b.Fatal(err)
			}
		}
		if a := parseAck(ack); a.err != nil {
			b.Fatalf("batch %d: %v", batch, a.err)
		}
	}
	reportCPU(b, cpuNow()-cpu)
}
