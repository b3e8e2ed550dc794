package bench

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/projections"
)

// The micro-benchmarks time the hot functions one call at a time, for
// benchstat (see the package comment); `make bench-micro` runs them.

// microAt is the fixed time the micro-benchmarks' events are built at.
var microAt = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

// microHistory is one task's life as history builds it.
func microHistory() []events.Event {
	return history("task-01HZX5J6Q7R8S9T0V1W2X3Y4Z5", "cust-01", microAt)
}

// microSamples are the events the codec benchmarks use: the largest
// (TaskScheduled), the most frequent on the hot path (Claimed) and a
// mailbox message.
func microSamples() []events.Event {
	h := microHistory()
	return []events.Event{h[0], h[3], h[4]}
}

func BenchmarkEncode(b *testing.B) {
	benchmarkCodec(b, func(ev events.Event, _ []byte) error { _, err := events.Encode(ev); return err })
}

func BenchmarkDecode(b *testing.B) {
	benchmarkCodec(b, func(_ events.Event, data []byte) error { _, err := events.Decode(data); return err })
}

// BenchmarkEncodeChained is the codec's share of an append as the store
// makes it: the event links to its predecessor's hash (32 bytes more in
// the envelope) and the SHA-256 of its own bytes is kept for the next.
func BenchmarkEncodeChained(b *testing.B) {
	prev := events.HashOf([]byte("the task's previous event"))
	benchmarkCodec(b, func(ev events.Event, _ []byte) error {
		ev.Prev = prev
		data, err := events.Encode(ev)
		prev = events.HashOf(data)
		return err
	})
}

// BenchmarkEncodeKeyed is BenchmarkEncodeChained with a keyed chain, as
// the store appends: the envelope also names the key and ends with the
// HMAC-SHA256 of the event's bytes (events.Keyring).
func BenchmarkEncodeKeyed(b *testing.B) {
	kr, err := events.NewKeyring(events.ChainKey{ID: 1, Secret: make([]byte, events.MinChainKeyBytes)})
	if err != nil {
		b.Fatal(err)
	}
	prev := events.HashOf([]byte("the task's previous event"))
	benchmarkCodec(b, func(ev events.Event, _ []byte) error {
		ev.Prev = prev
		data, err := kr.AppendEncode(nil, ev) // allocates its bytes, as Encode in BenchmarkEncodeChained
		prev = events.HashOf(data)
		return err
	})
}

// BenchmarkVerifyKeyed is what the start-up check and replay verify do
// with each keyed event: decode it and verify its MAC.
func BenchmarkVerifyKeyed(b *testing.B) {
	kr, err := events.NewKeyring(events.ChainKey{ID: 1, Secret: make([]byte, events.MinChainKeyBytes)})
	if err != nil {
		b.Fatal(err)
	}
	for _, ev := range microSamples() {
		b.Run(string(ev.Type()), func(b *testing.B) {
			data, err := kr.AppendEncode(nil, ev)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				got, err := events.Decode(data)
				if err == nil {
					err = kr.Verify(got, data)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeHashed is the codec's share of a load: a decode and the
// SHA-256 of the bytes, the state's LastHash.
func BenchmarkDecodeHashed(b *testing.B) {
	benchmarkCodec(b, func(_ events.Event, data []byte) error { _, err := events.DecodeHashed(data, 1); return err })
}

// benchmarkCodec runs op on each sample event and its encoding.
func benchmarkCodec(b *testing.B, op func(ev events.Event, data []byte) error) {
	for _, ev := range microSamples() {
		b.Run(string(ev.Type()), func(b *testing.B) {
			data, err := events.Encode(ev)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := op(ev, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReplay10 folds a decoded 10-event history with aggregate.Apply,
// the CPU part of every Load.
func BenchmarkReplay10(b *testing.B) {
	evs := microHistory()
	for i := range evs {
		evs[i].Seq = events.Position(i + 1)
	}
	b.ReportAllocs()
	var s aggregate.State
	for b.Loop() {
		s = aggregate.Replay(evs)
	}
	if s.Version != len(evs) || s.Status != aggregate.StatusSucceeded {
		b.Fatalf("replay: version %d status %s, want %d and succeeded", s.Version, s.Status, len(evs))
	}
}

// BenchmarkDecideClaim decides a claim on a queued task.
func BenchmarkDecideClaim(b *testing.B) {
	h := microHistory()
	s := aggregate.Replay(h[:3]) // scheduled, released, ready published
	if s.Status != aggregate.StatusQueued {
		b.Fatalf("status %s, want queued", s.Status)
	}
	cmd := aggregate.Claim{DeliveryID: s.Delivery.ID, ExecutorID: "exec-1"}
	now := microAt.Add(time.Second)
	b.ReportAllocs()
	for b.Loop() {
		evs, err := aggregate.Decide(s, cmd, now)
		if err != nil || len(evs) != 1 {
			b.Fatalf("Decide(Claim) = %d events, %v; want 1 event", len(evs), err)
		}
	}
}

// BenchmarkApplyProjection folds one task's whole life (history, ten
// encoded events) into a projection engine per iteration: decode, the
// engine's lock and every view's update, as the engine's Run does for
// each event it reads. Reported per event.
func BenchmarkApplyProjection(b *testing.B) {
	const tasks = 1024 // per engine: each task is applied once, into views of bounded size
	encoded := make([][][]byte, tasks)
	for i := range encoded {
		for _, ev := range history(events.NewID(), customer(i), microAt) {
			data, err := events.Encode(ev)
			if err != nil {
				b.Fatal(err)
			}
			encoded[i] = append(encoded[i], data)
		}
	}
	var eng *projections.Engine
	seq := uint64(0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%tasks == 0 {
			b.StopTimer()
			var err error
			if eng, err = projections.New(projections.Config{Logger: discardLogger}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		for _, data := range encoded[i%tasks] {
			seq++
			eng.Apply(events.Position(seq), data)
		}
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(seq), "ns/event")
}

// TestUnforce checks that unforce, after forced collections, returns
// once the pacer has run pacerMemory collections of its own: made
// garbage that is not optimised away brings them on. It is not
// parallel, so no other test's garbage brings them.
func TestUnforce(t *testing.T) {
	s := []metrics.Sample{{Name: "/gc/cycles/automatic:gc-cycles"}}
	runtime.GC()
	runtime.GC()
	metrics.Read(s)
	before := s[0].Value.Uint64()
	made := unforce()
	metrics.Read(s)
	if got := s[0].Value.Uint64() - before; got < pacerMemory || made == 0 {
		t.Fatalf("unforce made %d bytes and returned after %d collections of the pacer's own, want at least %d", made, got, pacerMemory)
	}
}
