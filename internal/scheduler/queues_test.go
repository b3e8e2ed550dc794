package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// withLimits sets the node's per-customer bounds and queue expiry.
func withLimits(l scheduler.Limits) testnode.Option {
	return func(c *node.Config) { c.Limits = l }
}

// readyConsumers lists the consumers of the node's ready stream.
func readyConsumers(t *testing.T, n *testnode.Node) []string {
	t.Helper()
	rs, err := n.Store.JetStream().Stream(context.Background(), n.NS.ReadyStream)
	if err != nil {
		t.Fatal(err)
	}
	names := rs.ConsumerNames(context.Background())
	var out []string
	for name := range names.Name() {
		out = append(out, name)
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// Claims on made-up queues create nothing on the server, so they cannot
// use up what real queues need: afterwards a new queue works for every
// customer, also after a restart.
func TestMadeUpQueuesCreateNothing(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	const names, rounds = 1000, 5 // rounds stay within the per-customer poll bound
	for r := range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, names/rounds)
		for i := range names / rounds {
			wg.Go(func() {
				_, ok, err := n.Service.ClaimNext(ctx, globex, fmt.Sprintf("made-up-%d", r*names/rounds+i), "w1", 50*time.Millisecond)
				if err != nil || ok {
					errs <- fmt.Errorf("claim on a made-up queue: ok %v, err %v", ok, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	if got := readyConsumers(t, n); len(got) != 0 {
		t.Fatalf("made-up queues got consumers: %v", got)
	}

	works := func(n *testnode.Node, queue string) {
		t.Helper()
		for _, p := range []scheduler.Principal{acme, globex} {
			task := mustSchedule(t, n, p, scheduler.ScheduleRequest{Queue: queue})
			st := claimNext(t, n, p, queue, 20*time.Second)
			if st.TaskID != task.TaskID || st.Status != aggregate.StatusRunning {
				t.Fatalf("%s claimed %s (%s) on %s, want %s", p.CustomerID, st.TaskID, st.Status, queue, task.TaskID)
			}
		}
	}
	works(n, "real-1")
	if got := readyConsumers(t, n); !slices.Equal(got, []string{"ready_real-1"}) {
		t.Fatalf("consumers %v, want only the real queue's", got)
	}
	n.Stop()
	restarted := setup(t, testnode.On(n.NC, n.NS))
	works(restarted, "real-2")
	works(restarted, "real-1")
}

// A poll that waits on a queue before its first task is scheduled claims
// the task once it is.
func TestClaimWaitsForANewQueue(t *testing.T) {
	t.Parallel()
	n := setup(t)
	type answer struct {
		st  aggregate.State
		ok  bool
		err error
	}
	got := make(chan answer, 1)
	go func() {
		st, ok, err := n.Service.ClaimNext(context.Background(), acme, "fresh", "w1", 20*time.Second)
		got <- answer{st, ok, err}
	}()
	task := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "fresh"})
	a := <-got
	if a.err != nil || !a.ok || a.st.TaskID != task.TaskID {
		t.Fatalf("claim on a new queue: %s ok %v err %v, want %s", a.st.TaskID, a.ok, a.err, task.TaskID)
	}
}

// A customer has live tasks on at most MaxQueuesPerCustomer queues; a
// queue whose tasks finished no longer counts.
func TestQueuesPerCustomerBounded(t *testing.T) {
	t.Parallel()
	n := setup(t, withLimits(scheduler.Limits{MaxQueuesPerCustomer: 3}))
	ctx := context.Background()
	var first aggregate.State
	for i := range 3 {
		st := idle(t, n, acme, scheduler.ScheduleRequest{Queue: fmt.Sprintf("q%d", i)})
		if i == 0 {
			first = st
		}
	}
	_, _, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{Queue: "q3"})
	requireIs(t, err, aggregate.ErrInvalid)
	if !strings.Contains(err.Error(), "live tasks on 3 queues, at most 3") {
		t.Fatalf("error %q does not say why", err)
	}
	idle(t, n, acme, scheduler.ScheduleRequest{Queue: "q1"})   // a queue it uses
	idle(t, n, globex, scheduler.ScheduleRequest{Queue: "q3"}) // another customer
	if _, err := n.Service.Cancel(ctx, acme, first.TaskID, "done with q0"); err != nil {
		t.Fatal(err)
	}
	idle(t, n, acme, scheduler.ScheduleRequest{Queue: "q3"})
}

// A queue's consumer that expired while nobody pulled is created again by
// the next claim.
func TestIdleConsumerExpiresAndComesBack(t *testing.T) {
	t.Parallel()
	n := setup(t, withLimits(scheduler.Limits{QueueIdle: time.Second}))
	for range 2 {
		task := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "idle"})
		if st := claimNext(t, n, acme, "idle", 20*time.Second); st.TaskID != task.TaskID {
			t.Fatalf("claimed %s, want %s", st.TaskID, task.TaskID)
		}
		testnode.Eventually(t, "idle consumer deleted", func() bool { return len(readyConsumers(t, n)) == 0 })
	}
}

// Customer B holding as many long polls on a shared queue as it may does
// not keep customer A from claiming there; B's next poll is refused, an
// operator's is not counted.
func TestLongPollsBoundedPerCustomer(t *testing.T) {
	t.Parallel()
	const bound = 50
	n := setup(t, withLimits(scheduler.Limits{MaxPollsPerCustomer: bound}))
	idle(t, n, globex, scheduler.ScheduleRequest{Queue: "shared"})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range bound {
		wg.Go(func() {
			if _, _, err := n.Service.ClaimNext(ctx, globex, "shared", "b", scheduler.MaxWait); err != nil {
				t.Errorf("one of globex's polls: %v", err)
			}
		})
	}
	testnode.Eventually(t, "globex's polls waiting", func() bool { return n.Service.Waiting("shared") == bound })
	_, _, err := n.Service.ClaimNext(ctx, globex, "shared", "b", time.Second)
	requireIs(t, err, scheduler.ErrTooManyPolls)

	for range 30 {
		task := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "shared"})
		if st := claimNext(t, n, acme, "shared", 5*time.Second); st.TaskID != task.TaskID {
			t.Fatalf("acme claimed %s, want %s", st.TaskID, task.TaskID)
		}
	}
	task := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "shared"})
	if st := claimNext(t, n, operator, "shared", 5*time.Second); st.TaskID != task.TaskID {
		t.Fatalf("operator claimed %s, want %s", st.TaskID, task.TaskID)
	}
	if got := n.Service.Waiting("shared"); got != bound {
		t.Fatalf("%d polls waiting, want globex's %d", got, bound)
	}
}

// Customer A is not stuck behind customer B's backlog on a shared queue:
// A's claims take A's queued tasks (they would otherwise wait behind
// B's notifications in the queue's one consumer), also a claim that
// waits before A's task is queued, and leave no stale notification.
func TestCustomerNotStuckBehindAnothersBacklog(t *testing.T) {
	t.Parallel()
	n := setup(t)
	ctx := context.Background()
	backlog := make([]scheduler.ScheduleRequest, 750)
	for i := range backlog {
		backlog[i] = scheduler.ScheduleRequest{Queue: "shared"}
	}
	for range 2 {
		out, err := n.Service.ScheduleBatch(ctx, globex, backlog)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
		}
	}
	queued := projections.Filter{Queue: "shared", Status: aggregate.StatusQueued, CustomerID: "globex"}
	testnode.Eventually(t, "globex's backlog queued", func() bool { return len(n.Engine.List(queued, "", 2000)) == 2*len(backlog) })

	first := claimable(t, n, mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "shared"}).TaskID)
	if st := claimNext(t, n, acme, "shared", 10*time.Second); st.TaskID != first.TaskID {
		t.Fatalf("acme claimed %s, want %s", st.TaskID, first.TaskID)
	}
	type answer struct {
		st  aggregate.State
		ok  bool
		err error
	}
	got := make(chan answer, 1)
	go func() {
		st, ok, err := n.Service.ClaimNext(ctx, acme, "shared", "w1", 10*time.Second)
		got <- answer{st, ok, err}
	}()
	testnode.Eventually(t, "acme's poll waiting", func() bool { return n.Service.Waiting("shared") == 1 })
	second := mustSchedule(t, n, acme, scheduler.ScheduleRequest{Queue: "shared"})
	if a := <-got; a.err != nil || !a.ok || a.st.TaskID != second.TaskID {
		t.Fatalf("acme's waiting claim: %s ok %v err %v, want %s", a.st.TaskID, a.ok, a.err, second.TaskID)
	}
	for _, id := range []string{first.TaskID, second.TaskID} {
		if st := get(t, n, id); st.Status != aggregate.StatusRunning {
			t.Fatalf("task %s is %s", id, st.Status)
		}
	}
	testnode.Eventually(t, "acme's notifications gone", func() bool {
		rs, err := n.Store.JetStream().Stream(ctx, n.NS.ReadyStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := rs.Info(ctx)
		return err == nil && info.State.Msgs == uint64(2*len(backlog))
	})
}
