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
	crossed := 0
	for i := 0; i < 40 && crossed == 0; i++ {
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
	}
	if crossed == 0 {
		t.Fatal("no retry landed in a shard before its original's")
	}
	v := replay.NewVerifier(n.Store.Subjects())
	v.Shard(shards)
	err := n.Store.Log().Read(ctx, store.ReadOptions{}, func(m store.Message) error {
		v.Add(m.Seq, m.Subject, m.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := v.Report(); !r.Clean() || r.Tasks < 2 {
		t.Fatalf("report %+v", r)
	}
}
