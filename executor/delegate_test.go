package executor_test

import (
	"context"
	"errors"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/executor"
)

// TestWorkerDelegation retries one delegation five times and gets one
// child; Await hands back the child's result once another worker has run
// it, and the child's success leaves the parent running until its own
// handler returns.
func TestWorkerDelegation(t *testing.T) {
	t.Parallel()
	e := wkSetup(t)
	ctx := context.Background()

	type delegated struct {
		ids []string
		err error
	}
	type awaited struct {
		res events.ChildResult
		err error
	}
	delegatedCh := make(chan delegated, 1)
	treeChecked := make(chan struct{})
	awaitedCh := make(chan awaited, 1)
	release := make(chan struct{})
	e.start(t, e.httpCfg("parents", "exec-p"), func(ctx context.Context, run *executor.Run) (string, error) {
		var d delegated
		var child api.Task
		for range 5 {
			if child, d.err = run.Delegate(ctx, "review", api.ScheduleRequest{Queue: "reviews", Message: wkText("review it")}); d.err != nil {
				break
			}
			d.ids = append(d.ids, child.ID)
		}
		delegatedCh <- d
		if d.err != nil {
			return "", d.err
		}
		select {
		case <-treeChecked:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		res, err := run.Await(ctx, child.ID)
		awaitedCh <- awaited{res, err}
		if err != nil {
			return "", err
		}
		select {
		case <-release:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if got := run.Checkpoint().Children["review"]; got != child.ID {
			return "", errors.New("checkpoint lacks the delegated child")
		}
		return "parent done", nil
	})
	parent := e.schedule(t, api.ScheduleRequest{Queue: "parents", Message: wkText("delegate")})

	d := wkRecv(t, "delegations", delegatedCh)
	if d.err != nil || len(d.ids) != 5 {
		t.Fatalf("delegated %v, %v", d.ids, d.err)
	}
	for _, id := range d.ids {
		if id != d.ids[0] {
			t.Fatalf("delegation retries made children %v, want one", d.ids)
		}
	}
	childID := d.ids[0]
	tree, err := e.client.Tree(ctx, parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(tree.Children) != 1 || tree.Children[0].Task.ID != childID {
		t.Fatalf("tree of the parent has children %+v, want only %s", tree.Children, childID)
	}
	child := tree.Children[0].Task
	if child.ParentID != parent.ID || child.RootID != parent.RootID || child.Queue != "reviews" {
		t.Fatalf("child %+v", child)
	}
	close(treeChecked)

	e.start(t, e.httpCfg("reviews", "exec-r"), func(ctx context.Context, run *executor.Run) (string, error) {
		return "looks good", nil
	})
	a := wkRecv(t, "await", awaitedCh)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.res.TaskID != childID || a.res.Status != "succeeded" || a.res.Result == nil || a.res.Result.Summary != "looks good" {
		t.Fatalf("awaited %+v", a.res)
	}
	e.waitStatus(t, childID, "succeeded")
	if p, err := e.client.Get(ctx, parent.ID); err != nil || p.Status != "running" {
		t.Fatalf("parent after the child's success: %+v, %v", p, err)
	}
	close(release)
	done := e.waitStatus(t, parent.ID, "succeeded")
	if done.Result == nil || done.Result.Summary != "parent done" {
		t.Fatalf("parent result %+v", done.Result)
	}
	if n := e.countEvents(t, parent.ID, "ResultRecorded"); n != 1 {
		t.Fatalf("parent has %d results", n)
	}
}
