package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
)

// trickleEvery is how often each attacker of TestSlowBodyAttack sends a
// byte of its body: every 5 s.
const trickleEvery = 5 * time.Second

// TestSlowBodyAttack: ATTACK_CONNS connections (default 200) send a
// schedule's headers and then trickle its body, a byte every 5 s, at a
// server with the default limits (but a body timeout longer than the
// test); meanwhile normal requests must all
// succeed. With ATTACK_MEASURE set (make attack: 2,000 connections, no
// race detector) it also fails if their p99 latency is 100 ms or more.
func TestSlowBodyAttack(t *testing.T) {
	t.Parallel()
	conns := 200
	if s := os.Getenv("ATTACK_CONNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("ATTACK_CONNS=%q: want a positive number", s)
		}
		conns = n
	}
	measure := os.Getenv("ATTACK_MEASURE") != ""
	// Both ends of every connection are in this process; Go raised the
	// soft limit to the hard one at start.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if need := uint64(2*conns + 1024); lim.Cur < need {
		t.Fatalf("ulimit -n is %d; %d attack connections need %d file descriptors", lim.Cur, conns, need)
	}
	// The attack must last the whole measurement: on a slow machine the
	// default --body-timeout (30 s) would cut it before the normal
	// requests are done, which is the defense working, not what this
	// measures.
	b := setup(t, func(c *node.Config) { c.BodyTimeout = 10 * time.Minute })
	baseline := "not measured"
	if measure {
		baseline = summary(normalLatencies(t, b, "baseline"))
		t.Logf("without the attack: %s", baseline)
	}

	attackers := make([]net.Conn, conns)
	var dial sync.WaitGroup
	for w := range 16 {
		dial.Go(func() {
			for i := w; i < conns; i += 16 {
				c, err := net.Dial("tcp", b.addr())
				if err != nil {
					t.Errorf("attack connection %d: %v", i, err)
					return
				}
				attackers[i] = c
				io.WriteString(c, "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
			}
		})
	}
	dial.Wait()
	t.Cleanup(func() {
		for _, c := range attackers {
			if c != nil {
				c.Close()
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	eventually(t, "the server to hold every attack connection", func() bool { return b.node.Server.OpenConns() >= int64(conns) })
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		// Each attacker sends a byte every trickleEvery, as independent
		// clients would: spread over the period, one at a time.
		defer close(trickled)
		tick := time.NewTicker(trickleEvery / time.Duration(conns))
		defer tick.Stop()
		for i := 0; ; i = (i + 1) % conns {
			select {
			case <-stop:
				return
			case <-tick.C:
				attackers[i].SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				io.WriteString(attackers[i], " ")
			}
		}
	}()

	all := normalLatencies(t, b, "beside-attack")
	close(stop)
	<-trickled
	if open := b.node.Server.OpenConns(); open < int64(conns) {
		t.Fatalf("%d connections open at the end, want the %d attackers still held", open, conns)
	}
	p99 := all[len(all)*99/100]
	t.Logf("beside %d slow-body connections: %s", conns, summary(all))
	if measure && p99 >= 100*time.Millisecond {
		t.Fatalf("p99 %s beside %d slow bodies, want < 100ms (the same traffic without them: %s)", p99, conns, baseline)
	}
}

// normalLatencies runs 1,000 normal requests on queue (4 clients
// scheduling and listing in turn), failing on any error, and returns
// their latencies, sorted.
func normalLatencies(t *testing.T, b *bundle, queue string) []time.Duration {
	t.Helper()
	const workers, perWorker = 4, 250
	latencies := make([][]time.Duration, workers)
	ctx := context.Background()
	var normal sync.WaitGroup
	for w := range workers {
		normal.Go(func() {
			c := api.NewClient(b.url, "")
			defer c.HTTP.CloseIdleConnections()
			for i := range perWorker {
				start := time.Now()
				var err error
				if i%2 == 0 {
					_, _, err = c.Schedule(ctx, api.ScheduleRequest{Queue: queue, RequestID: fmt.Sprintf("%s-w%d-%d", queue, w, i)})
				} else {
					_, err = c.List(ctx, api.ListOptions{Queue: queue, Limit: 10})
				}
				latencies[w] = append(latencies[w], time.Since(start))
				if err != nil {
					t.Errorf("normal request %d of worker %d on %s: %v", i, w, queue, err)
					return
				}
			}
		})
	}
	normal.Wait()
	if t.Failed() {
		t.FailNow()
	}
	all := slices.Concat(latencies...)
	slices.Sort(all)
	return all
}

// summary describes sorted latencies.
func summary(sorted []time.Duration) string {
	n := len(sorted)
	return fmt.Sprintf("%d requests, p50 %s, p99 %s, max %s", n, sorted[n/2], sorted[n*99/100], sorted[n-1])
}
