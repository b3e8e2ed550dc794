package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/lease"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnats"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// partitionNode configures a node's name and timer partitions (noLeases:
// it acts on every partition and holds no lease).
func partitionNode(name string, parts int, noLeases bool) func(*node.Config) {
	return func(c *node.Config) { c.Name, c.Partitions, c.NoLeases = name, parts, noLeases }
}

// second starts another node on a's stream, its answers validated too.
func second(t *testing.T, a *bundle, opts ...func(*node.Config)) *bundle {
	t.Helper()
	st := a.node.Store
	ns := testnats.Namespace{Stream: st.Config().Stream, ReadyStream: events.ReadyStreamName(st.Config().Stream), Subjects: st.Subjects()}
	all := []testnode.Option{testnode.On(nil, ns), func(c *node.Config) {
		c.Middleware = func(h http.Handler) http.Handler { return validated(t, h) }
	}}
	for _, o := range opts {
		all = append(all, o)
	}
	n := testnode.Start(t, all...)
	return &bundle{node: n.Node, client: n.Client, url: n.URL}
}

// readyPartitions reads the partitions of b's /readyz (nil: none shown).
func readyPartitions(t *testing.T, b *bundle) *api.PartitionStats {
	t.Helper()
	a := rawDo(t, b, http.MethodGet, "/readyz", "")
	var body struct {
		Partitions *api.PartitionStats `json:"partitions"`
	}
	if a.status != http.StatusOK {
		t.Fatalf("/readyz: %d %s", a.status, a.body)
	}
	if err := json.Unmarshal(a.body, &body); err != nil {
		t.Fatal(err)
	}
	return body.Partitions
}

// statsPartitions reads the owned partitions of b's GET /v1/stats.
func statsPartitions(t *testing.T, b *bundle) []int {
	t.Helper()
	s, err := b.client.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Partitions == nil {
		t.Fatal("GET /v1/stats shows no partitions")
	}
	return s.Partitions.Owned
}

// TestTimerPartitionsSplit: two schedulers split the timer partitions
// (/readyz and GET /v1/stats show it), and every release and delivery of
// a delayed task is appended by the owner of its partition.
func TestTimerPartitionsSplit(t *testing.T) {
	t.Parallel()
	const parts, total = 8, 40
	a := setup(t, partitionNode("sched-a", parts, false))
	b := second(t, a, partitionNode("sched-b", parts, false))
	var ownedA, ownedB []int
	eventually(t, "two halves", func() bool {
		ownedA, ownedB = statsPartitions(t, a), statsPartitions(t, b)
		return len(ownedA) == parts/2 && len(ownedB) == parts/2 && !slices.ContainsFunc(ownedA, func(p int) bool { return slices.Contains(ownedB, p) })
	})
	if p := readyPartitions(t, a); p == nil || p.Count != parts || !slices.Equal(p.Owned, ownedA) || p.Instance == "" || p.LeaseTTLSeconds != lease.DefaultTTL.Seconds() {
		t.Fatalf("/readyz partitions %+v, want %d of them, owning %v", p, parts, ownedA)
	}

	// Due a little later, so the alarm releases them (a task due when it
	// is scheduled is released by its TaskScheduled, and the scheduling
	// process publishes it); half scheduled through each process.
	runAt := time.Now().Add(2 * time.Second).UTC()
	var ids []string
	for _, c := range []*api.Client{a.client, b.client} {
		reqs := make([]api.ScheduleRequest, total/2)
		for i := range reqs {
			reqs[i] = api.ScheduleRequest{Queue: "parts", RunAt: &runAt}
		}
		items, err := c.ScheduleBatch(context.Background(), reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.Status != http.StatusCreated || it.Task == nil {
				t.Fatalf("schedule: %+v", it)
			}
			ids = append(ids, it.Task.ID)
		}
	}
	byOwner := map[string]int{}
	for _, id := range ids {
		a.waitStatus(t, id, "queued")
		owner := "sched-b"
		if slices.Contains(ownedA, lease.Partition(id, parts)) {
			owner = "sched-a"
		}
		h, err := a.client.History(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if n := countEvents(h, events.TypeDeliveryPending); n != 1 {
			t.Fatalf("task %s has %d DeliveryPending: not released once by an alarm (scheduled after its runAt?)", id, n)
		}
		for _, ev := range h.Events {
			if ev.Type == string(events.TypeDeliveryPending) || ev.Type == string(events.TypeReadyPublished) {
				if ev.Actor != owner {
					t.Errorf("task %s (partition %d, %s's): %s appended by %s", id, lease.Partition(id, parts), owner, ev.Type, ev.Actor)
				}
				byOwner[ev.Actor]++
			}
		}
	}
	if byOwner["sched-a"] == 0 || byOwner["sched-b"] == 0 {
		t.Fatalf("releases and deliveries by process: %v, want some by each", byOwner)
	}
	// Still split: nothing above ran while a lease changed hands.
	if oa, ob := statsPartitions(t, a), statsPartitions(t, b); !slices.Equal(oa, ownedA) || !slices.Equal(ob, ownedB) {
		t.Fatalf("partitions moved during the test: a %v → %v, b %v → %v", ownedA, oa, ownedB, ob)
	}
}

func countEvents(h api.History, typ events.Type) int {
	n := 0
	for _, ev := range h.Events {
		if ev.Type == string(typ) {
			n++
		}
	}
	return n
}

// TestTimerPartitionsTwoOwners: a process that ignores leases acts on
// the partitions another holds, so two act on every timer item at once.
// OCC keeps the log right: one release per attempt, at most one publish
// and one claim per delivery, one timeout per timed-out task, and the
// verifier finds the log clean.
func TestTimerPartitionsTwoOwners(t *testing.T) {
	t.Parallel()
	const parts, total = 4, 60
	a := setup(t, partitionNode("sched-a", parts, false))
	b := second(t, a, partitionNode("sched-b", parts, true))
	eventually(t, "a holds every partition", func() bool { return len(statsPartitions(t, a)) == parts })
	if p := readyPartitions(t, b); p != nil {
		t.Fatalf("/readyz of a process without leases shows partitions %+v", p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Due a little later, so the alarms release them; half scheduled
	// through each process.
	runAt := time.Now().Add(2 * time.Second).UTC()
	var ids []string
	for _, c := range []*api.Client{a.client, b.client} {
		reqs := make([]api.ScheduleRequest, total/2)
		for i := range reqs {
			timeout := 60 // the even ones succeed, the odd ones time out
			if i%2 == 1 {
				timeout = 1
			}
			reqs[i] = api.ScheduleRequest{Queue: "owners", RunAt: &runAt, TimeoutSeconds: &timeout}
		}
		items, err := c.ScheduleBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.Status != http.StatusCreated || it.Task == nil {
				t.Fatalf("schedule: %+v", it)
			}
			ids = append(ids, it.Task.ID)
		}
	}
	// Executors on both claim everything; the even tasks succeed, the odd
	// ones are left running until both alarms time them out.
	done := map[string]bool{}
	g, gctx := errgroup.WithContext(ctx)
	claimed := make(chan api.Task, total)
	for i, c := range []*api.Client{a.client, b.client} {
		g.Go(func() error {
			for gctx.Err() == nil {
				task, ok, err := c.ClaimNext(gctx, "owners", fmt.Sprintf("w%d", i), 500*time.Millisecond)
				if e := (*api.Error)(nil); errors.As(err, &e) && e.Status == http.StatusServiceUnavailable {
					continue // a loaded machine; the claim is retried
				}
				if err != nil {
					return err
				}
				if ok {
					claimed <- task
				}
			}
			return nil
		})
	}
	for len(done) < total {
		var task api.Task
		select {
		case task = <-claimed:
		case <-ctx.Done():
			t.Fatalf("%d of %d tasks claimed: %v", len(done), total, g.Wait())
		}
		if done[task.ID] {
			t.Fatalf("task %s claimed twice", task.ID)
		}
		done[task.ID] = true
		if slices.Index(ids, task.ID)%2 == 0 {
			if _, err := a.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cancel()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	for i, id := range ids {
		a.waitStatus(t, id, []string{"succeeded", "timed_out"}[i%2])
	}

	st := a.node.Store
	v := replay.NewVerifier(st.Subjects())
	counts := map[string]map[events.Type]int{}
	actors := map[string]int{}
	err := eventlog.Log{JS: st.JetStream(), Stream: st.Config().Stream, Subjects: st.Subjects()}.Read(context.Background(), eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		ev, err := events.DecodeAt(m.Data, m.Pos)
		if err != nil {
			return err
		}
		if counts[ev.TaskID] == nil {
			counts[ev.TaskID] = map[events.Type]int{}
		}
		counts[ev.TaskID][ev.Type()]++
		if ev.Type() == events.TypeDeliveryPending || ev.Type() == events.TypeTimedOut {
			actors[ev.Actor]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		c := counts[id]
		if c[events.TypeDeliveryPending] != 1 || c[events.TypeReadyPublished] > 1 || c[events.TypeClaimed] != 1 || c[events.TypeTimedOut]+c[events.TypeResultRecorded] != 1 {
			t.Errorf("task %s: %v, want one release, one claim, at most one publish, one end", id, c)
		}
	}
	if r := v.Report(); !r.Clean() {
		t.Fatalf("verifier: %+v", r.Violations)
	}
	t.Logf("releases and timeouts by process: %v", actors)
}
