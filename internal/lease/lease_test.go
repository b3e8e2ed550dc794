package lease

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/taskledger/taskledger/internal/testnats"
)

func TestMain(m *testing.M) { testnats.Main(m) }

// open returns Leases of instance on bucket over a connection of its own.
func open(t *testing.T, bucket, instance string, parts int, ttl time.Duration) (*Leases, *nats.Conn) {
	t.Helper()
	nc := testnats.Conn(t)
	js := newJS(t, nc)
	l, err := Open(context.Background(), Config{JS: js, Bucket: bucket, Partitions: parts, TTL: ttl, Instance: instance,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	if err != nil {
		t.Fatal(err)
	}
	return l, nc
}

// newJS is a JetStream context on nc whose API requests (a bucket's
// creation among them) wait up to 30 s, not nats.go's 5 s: under the
// whole suite on two cores one creation took longer (CI, 2 December).
func newJS(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// run runs l until the test ends (or stop is called).
func run(t *testing.T, l *Leases) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// eventually polls cond until it holds, failing the test after 30s
// (testnode.Eventually, which this package cannot import: testnode runs a
// node, which holds leases).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// mustRound runs rounds of l until one has no error (a slow machine can
// make a write miss the round's deadline).
func mustRound(t *testing.T, l *Leases) {
	t.Helper()
	eventually(t, "a round without errors", func() bool {
		err := l.round(context.Background())
		if err != nil {
			t.Logf("round of %s: %v", l.Instance(), err)
		}
		return err == nil
	})
}

func bucketName(t *testing.T) string {
	return Bucket(testnats.NewNamespace(t).Stream)
}

func all(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestPartition: the hash is stable (every process and version must
// agree) and spreads keys over the partitions.
func TestPartition(t *testing.T) {
	t.Parallel()
	if got := Partition("01JTASK", 16); got != Partition("01JTASK", 16) || got < 0 || got >= 16 {
		t.Fatalf("Partition = %d", got)
	}
	// FNV-1a 32 of "a" is 0xe40c292c: fixed forever.
	if got := Partition("a", 1000); got != 0xe40c292c%1000 {
		t.Fatalf(`Partition("a", 1000) = %d, want %d`, got, 0xe40c292c%1000)
	}
	seen := map[int]int{}
	for i := range 1600 {
		seen[Partition(strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune(i)), 16)]++
	}
	if len(seen) != 16 {
		t.Fatalf("1,600 keys fell in %d of 16 partitions", len(seen))
	}
}

// TestLeasesRenew: one process takes every partition and keeps it past
// the TTL by renewing; Owns agrees; stopping gives every lease back.
func TestLeasesRenew(t *testing.T) {
	t.Parallel()
	const parts, ttl = 4, 2 * time.Second
	bucket := bucketName(t)
	l, _ := open(t, bucket, "a", parts, ttl)
	if got := l.Owned(); len(got) != 0 {
		t.Fatalf("owned %v before Run", got)
	}
	stop := run(t, l)
	eventually(t, "every partition owned", func() bool { return slices.Equal(l.Owned(), all(parts)) })
	first, err := l.kv.Get(context.Background(), partitionKey(0))
	if err != nil {
		t.Fatal(err)
	}
	// Renewed until the lease's last write is more than a TTL younger
	// than its first: it would have expired unrenewed.
	eventually(t, "lease renewed past its TTL", func() bool {
		e, err := l.kv.Get(context.Background(), partitionKey(0))
		if err != nil {
			t.Fatalf("lease of partition 0: %v", err)
		}
		return e.Created().Sub(first.Created()) > ttl
	})
	if got := l.Owned(); !slices.Equal(got, all(parts)) {
		t.Fatalf("owned %v after renewals, want all", got)
	}
	owns := l.Owns()
	for _, key := range []string{"01JA", "01JB", "cust/sched"} {
		if !owns(key) {
			t.Fatalf("Owns(%q) = false while owning every partition", key)
		}
	}
	stop()
	if got := l.Owned(); len(got) != 0 {
		t.Fatalf("owned %v after Run returned", got)
	}
	keys, err := l.kv.Keys(context.Background())
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("bucket keeps %v after Run returned: leases not given back", keys)
	}
}

// TestLeasesLapse: a process that stops renewing stops owning its
// partitions before the server expires them; then another takes them.
func TestLeasesLapse(t *testing.T) {
	t.Parallel()
	const parts, ttl = 4, time.Second
	bucket := bucketName(t)
	a, _ := open(t, bucket, "a", parts, ttl)
	mustRound(t, a)
	if got := a.Owned(); !slices.Equal(got, all(parts)) {
		t.Fatalf("owned %v after a round alone, want all", got)
	}
	b, _ := open(t, bucket, "b", parts, ttl)
	mustRound(t, b)
	if got := b.Owned(); len(got) != 0 {
		t.Fatalf("b took %v while a's leases live", got)
	}
	// a never renews: it gives its leases up first, then the server
	// drops them and b's rounds take them.
	eventually(t, "a's leases lapsed", func() bool { return len(a.Owned()) == 0 })
	eventually(t, "b took every partition", func() bool {
		mustRound(t, b)
		return slices.Equal(b.Owned(), all(parts))
	})
	if got := a.Owned(); len(got) != 0 {
		t.Fatalf("a owns %v again without a round", got)
	}
	// a's next round finds its revisions gone: it renews nothing and
	// takes nothing b holds.
	mustRound(t, a)
	if got := a.Owned(); len(got) != 0 {
		t.Fatalf("a owns %v after b took every partition", got)
	}
}

// TestLeasesCompareAndSet: a lease rewritten behind its holder's back is
// lost at its next renewal (the revision differs); processes racing for
// the same partitions never both hold one.
func TestLeasesCompareAndSet(t *testing.T) {
	t.Parallel()
	const parts = 8
	bucket := bucketName(t)
	a, _ := open(t, bucket, "a", parts, 5*time.Second)
	ctx := context.Background()
	mustRound(t, a)
	if _, err := a.kv.Put(ctx, partitionKey(3), []byte("intruder")); err != nil {
		t.Fatal(err)
	}
	mustRound(t, a)
	if got := a.Owned(); slices.Contains(got, 3) || len(got) != parts-1 {
		t.Fatalf("owned %v after partition 3 was rewritten, want all but 3", got)
	}

	// Three processes on a fresh bucket run rounds at once.
	bucket = bucketName(t)
	ls := make([]*Leases, 3)
	for i := range ls {
		ls[i], _ = open(t, bucket, string(rune('a'+i)), parts, 5*time.Second)
	}
	// Until settled: a share each (ceil(8/3) = 3), every partition held.
	rounds := 0
	eventually(t, "the partitions spread 3, 3 and 2", func() bool {
		rounds++
		var wg sync.WaitGroup
		for _, l := range ls {
			wg.Go(func() {
				if err := l.round(ctx); err != nil {
					t.Logf("round of %s: %v", l.Instance(), err) // a slow machine: retried
				}
			})
		}
		wg.Wait()
		held := map[int]string{}
		for _, l := range ls {
			for _, p := range l.Owned() {
				if other, dup := held[p]; dup {
					t.Fatalf("partition %d held by %s and %s at once", p, other, l.Instance())
				}
				held[p] = l.Instance()
			}
		}
		settled := len(held) == parts
		for _, l := range ls {
			settled = settled && len(l.Owned()) <= 3
		}
		return settled && rounds >= 10
	})
}

// TestLeasesSplitAndTakeover: two running processes split the
// partitions; when one loses its connection it owns nothing at once, and
// the other takes its partitions once they expire.
func TestLeasesSplitAndTakeover(t *testing.T) {
	t.Parallel()
	const parts, ttl = 8, time.Second
	bucket := bucketName(t)
	a, _ := open(t, bucket, "a", parts, ttl)
	b, ncB := open(t, bucket, "b", parts, ttl)
	run(t, a)
	run(t, b)
	eventually(t, "a split of 4 and 4", func() bool {
		oa, ob := a.Owned(), b.Owned()
		return len(oa) == 4 && len(ob) == 4 && !slices.ContainsFunc(oa, func(p int) bool { return slices.Contains(ob, p) })
	})
	ncB.Close()
	if got := b.Owned(); len(got) != 0 {
		t.Fatalf("b owns %v with its connection closed", got)
	}
	if b.Owns()("any") {
		t.Fatal("b's Owns reports a key with its connection closed")
	}
	eventually(t, "a took b's partitions", func() bool { return slices.Equal(a.Owned(), all(parts)) })
}

// TestLeasesBucketMadeAgain: a bucket that disappears (a memory stream
// after a NATS or JetStream restart) is made again, and its leases taken
// again.
func TestLeasesBucketMadeAgain(t *testing.T) {
	t.Parallel()
	const parts = 4
	bucket := bucketName(t)
	l, nc := open(t, bucket, "a", parts, time.Second)
	run(t, l)
	eventually(t, "every partition owned", func() bool { return slices.Equal(l.Owned(), all(parts)) })
	js := newJS(t, nc)
	if err := js.DeleteKeyValue(context.Background(), bucket); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bucket made again, every lease in it a's", func() bool {
		kv, err := js.KeyValue(context.Background(), bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		for i := range parts {
			if e, err := kv.Get(context.Background(), partitionKey(i)); err != nil || string(e.Value()) != "a" {
				return false
			}
		}
		return true
	})
	eventually(t, "every partition owned", func() bool { return slices.Equal(l.Owned(), all(parts)) })
}

// TestOpenRefusesOtherPartitionCount: every process of a bucket must
// split the timers alike; a second TTL yields to the bucket's.
func TestOpenRefusesOtherPartitionCount(t *testing.T) {
	t.Parallel()
	bucket := bucketName(t)
	a, nc := open(t, bucket, "a", 8, 3*time.Second)
	js := newJS(t, nc)
	_, err := Open(context.Background(), Config{JS: js, Bucket: bucket, Partitions: 16, Instance: "b"})
	if err == nil || !strings.Contains(err.Error(), "not 16") {
		t.Fatalf("Open with 16 partitions on a bucket of 8: %v", err)
	}
	b, err := Open(context.Background(), Config{JS: js, Bucket: bucket, Partitions: 8, TTL: time.Minute, Instance: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if b.TTL() != a.TTL() || a.TTL() != 3*time.Second {
		t.Fatalf("TTLs %s and %s, want the bucket's 3s", a.TTL(), b.TTL())
	}
	for _, bad := range []Config{{JS: js, Bucket: bucket, Instance: "a.b"}, {JS: js, Bucket: bucket, Instance: "x", Partitions: MaxPartitions + 1}} {
		if _, err := Open(context.Background(), bad); err == nil {
			t.Fatalf("Open(%+v) accepted", bad)
		}
	}
}
