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
)

// TestSlowBodyAttack: ATTACK_CONNS connections (default 200) send a
// schedule's headers and then trickle its body, a byte a second, at a
// server with the default limits; meanwhile normal requests must all
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
	b := setup(t)

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
		defer close(trickled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				for _, c := range attackers {
					c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
					io.WriteString(c, " ")
				}
			}
		}
	}()

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
					_, _, err = c.Schedule(ctx, api.ScheduleRequest{Queue: "beside-attack", RequestID: fmt.Sprintf("w%d-%d", w, i)})
				} else {
					_, err = c.List(ctx, api.ListOptions{Queue: "beside-attack", Limit: 10})
				}
				latencies[w] = append(latencies[w], time.Since(start))
				if err != nil {
					t.Errorf("normal request %d of worker %d during the attack: %v", i, w, err)
					return
				}
			}
		})
	}
	normal.Wait()
	close(stop)
	<-trickled
	if open := b.node.Server.OpenConns(); open < int64(conns) {
		t.Fatalf("%d connections open at the end, want the %d attackers still held", open, conns)
	}
	all := slices.Concat(latencies...)
	slices.Sort(all)
	p50, p99 := all[len(all)/2], all[len(all)*99/100]
	t.Logf("%d slow-body connections: %d normal requests, p50 %s, p99 %s, max %s", conns, len(all), p50, p99, all[len(all)-1])
	if measure && p99 >= 100*time.Millisecond {
		t.Fatalf("p99 %s beside %d slow bodies, want < 100ms", p99, conns)
	}
}
