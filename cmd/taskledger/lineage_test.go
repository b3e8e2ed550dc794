package main

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
)

// TestCancelClosesLineage: after `cancel` of a root, `schedule --parent`
// under its lineage is refused, the queued descendants end canceled once
// claims find them, and `tree` shows the whole lineage terminal.
func TestCancelClosesLineage(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), lineageAddr(t))
	ctx, c := context.Background(), srv.client
	const queue = "lineage"
	sched := func(parent string) api.Task {
		t.Helper()
		task, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: queue, ParentID: parent})
		if err != nil {
			t.Fatal(err)
		}
		return workWaitTask(t, c, task.ID, "queued", func(task api.Task) bool { return task.Status == "queued" })
	}
	root := sched("")
	child := sched(root.ID)
	grand := sched(child.ID)
	sched(grand.ID)
	if err := run(ctx, []string{"cancel", "--server", c.BaseURL, root.ID}, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	err := run(ctx, []string{"schedule", "--server", c.BaseURL, "--queue", queue, "--parent", grand.ID, "--message", "more work"}, &strings.Builder{})
	if !errors.Is(err, api.ErrAncestorTerminal) {
		t.Fatalf("schedule under the canceled lineage: %v, want ancestor_terminal", err)
	}
	// Claims find the queued descendants: none runs.
	for range 3 {
		if task, ok, err := c.ClaimNext(ctx, queue, "w1", 200*time.Millisecond); err != nil || ok {
			t.Fatalf("claims/next: %s ok %v err %v, want nothing", task.ID, ok, err)
		}
	}
	var tree strings.Builder
	if err := run(ctx, []string{"tree", "--server", c.BaseURL, root.ID}, &tree); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(tree.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("tree of 4 tasks:\n%s", tree.String())
	}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) < 2 || f[1] != "canceled" {
			t.Fatalf("a task of the lineage is not canceled:\n%s", tree.String())
		}
	}
}

// lineageAddr is a free loopback address in the port range this test may
// use.
func lineageAddr(t *testing.T) string {
	t.Helper()
	for port := 21150; port < 21200; port++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	t.Fatal("no free port in 21150-21199")
	return ""
}
