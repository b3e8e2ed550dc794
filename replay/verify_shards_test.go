package replay_test

import (
	"context"
	"testing"

	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/store"
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
	verify := func(expect ...store.Head) replay.Report {
		t.Helper()
		v := replay.NewVerifier(n.Store.Subjects())
		v.Shard(shards)
		for _, h := range expect {
			v.ExpectHead(h.Seq, h.Hash)
		}
		err := n.Store.Log().Read(ctx, store.ReadOptions{}, func(m store.Message) error {
			v.Add(m.Seq, m.Subject, m.Data)
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
	beyond.Seq += 3 * 10 // ten sequences past shard 1's end
	r := verify(heads[0], beyond, changed)
	if len(r.Violations) != 2 || r.Violations[0].Kind != replay.HeadMismatch || r.Violations[0].Seq != changed.Seq ||
		r.Violations[1].Kind != replay.Truncated || r.Violations[1].Seq != beyond.Seq {
		t.Fatalf("violations %+v, want the changed head of shard 2 and the truncation of shard 1", r.Violations)
	}
}
