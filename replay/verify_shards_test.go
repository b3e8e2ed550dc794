package replay_test

import (
	"context"
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/eventlog"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/replay"
)

// On a log of three shards the verifier, told the shards, reads every
// shard clean, also a retry whose shard is read before the shard of the
// task it retries (a retry is a root of its own).
func TestVerifyShardedLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testnode.Start(t, func(c *node.Config) { c.Shards = 3 })
	svc, op, shards := n.Service, scheduler.Operator, n.Store.Shards()
	crossed, used := 0, map[int]bool{}
	for i := 0; i < 60 && (crossed == 0 || len(used) < 3); i++ {
		st, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{CustomerID: "c", Queue: "q", Message: text("work")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Cancel(ctx, op, st.TaskID, "retry it"); err != nil {
			t.Fatal(err)
		}
		rt, _, err := svc.RetryTask(ctx, op, st.TaskID, scheduler.RetryTaskRequest{})
		if err != nil {
			t.Fatal(err)
		}
		from, _ := shards.Split(st.FirstSeq)
		to, _ := shards.Split(rt.FirstSeq)
		if to < from {
			crossed++
		}
		used[from], used[to] = true, true
	}
	if crossed == 0 || len(used) < 3 {
		t.Fatalf("%d retries in a shard before their original's, shards %v used", crossed, used)
	}
	heads, err := n.Store.Log().HeadsAt(ctx, nil)
	if err != nil || len(heads) != 3 {
		t.Fatalf("%d chain heads (%v), want one a shard", len(heads), err)
	}
	// verify reads the log with the chain heads expected.
	verify := func(expect ...eventlog.Head) replay.Report {
		t.Helper()
		v := replay.NewVerifier(n.Store.Subjects())
		v.Shard(shards)
		for _, h := range expect {
			v.ExpectHead(h.Pos, h.Hash)
		}
		err := n.Store.Log().Read(ctx, eventlog.ReadOptions{}, func(m eventlog.Message) error {
			v.Add(m.Pos, m.Subject, m.Data)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return v.Report()
	}
	if r := verify(heads...); !r.Clean() || r.Tasks < 2 {
		t.Fatalf("report %+v", r)
	}
	changed := heads[2]
	changed.Hash[0] ^= 1
	beyond := heads[1]
	beyond.Pos += 3 * 10 // ten sequences past shard 1's end
	r := verify(heads[0], beyond, changed)
	if len(r.Violations) != 2 || r.Violations[0].Kind != replay.HeadMismatch || r.Violations[0].Seq != changed.Pos ||
		r.Violations[1].Kind != replay.Truncated || r.Violations[1].Seq != beyond.Pos {
		t.Fatalf("violations %+v, want the changed head of shard 2 and the truncation of shard 1", r.Violations)
	}
}

// TestVerifyShardedKeys: a clean sharded log whose tasks share a
// concurrency key (the key's events in its own shard, the tasks' in
// theirs) verifies without violations.
func TestVerifyShardedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testnode.Start(t, func(c *node.Config) { c.Shards = 3 })
	svc, op := n.Service, scheduler.Operator
	const tasks = 12
	for range tasks {
		if _, _, err := svc.Schedule(ctx, op, scheduler.ScheduleRequest{CustomerID: "c", Queue: "q", Message: text("work"),
			Concurrency: &events.Concurrency{Key: "k", Limit: 2}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for done := 0; done < tasks; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tasks done in 30 s", done, tasks)
		}
		task, ok, err := svc.ClaimNext(ctx, op, "q", "w", 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		if _, err := svc.RecordResult(ctx, op, task.TaskID, task.Claim.DeliveryID, events.Result{Success: true}); err != nil {
			t.Fatal(err)
		}
		done++
	}
	v := replay.NewVerifier(n.Store.Subjects())
	v.Shard(n.Store.Shards())
	if err := n.Store.Log().Read(ctx, eventlog.ReadOptions{}, func(m eventlog.Message) error {
		v.Add(m.Pos, m.Subject, m.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := v.Report(); len(r.Violations) != 0 || r.Events == 0 {
		t.Fatalf("%d events, violations %+v", r.Events, r.Violations)
	}
}

// TestVerifyShardRouting: an event stored in a shard that is not its
// lineage's (on that shard's own subjects) is reported.
func TestVerifyShardRouting(t *testing.T) {
	t.Parallel()
	shards := events.Shards{K: 3}
	subjects := events.Subjects{Root: "tl"}
	// A root task whose lineage belongs in shard home, stored in another.
	id := "misplaced"
	home := shards.Of("c", id)
	wrong := (home + 1) % 3
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	data, err := events.Encode(events.Event{ID: "e1", TaskID: id, CustomerID: "c", Number: 1, At: at,
		Data: events.TaskScheduled{Spec: events.TaskSpec{RootID: id, Queue: "q", RunAt: at, TimeoutSeconds: events.DefaultTimeoutSeconds}}})
	if err != nil {
		t.Fatal(err)
	}
	v := replay.NewVerifier(subjects)
	v.Shard(shards)
	v.Add(shards.Position(wrong, 1), shards.Subjects(subjects, wrong).Event("c", id), data)
	r := v.Report()
	if len(r.Violations) != 1 || r.Violations[0].Kind != replay.WrongSubject {
		t.Fatalf("violations %+v, want one %s (shard %d, not %d)", r.Violations, replay.WrongSubject, wrong, home)
	}
}
