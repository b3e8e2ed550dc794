package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/node"
)

// A finished lineage evicted from the projections by retention answers
// every read by id exactly as before, from the log; only listings forget
// it. An open lineage is never evicted.
func TestRetentionEvictsFinishedLineages(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Retain = 3 })
	ctx := context.Background()

	open := mustSchedule(t, b, api.ScheduleRequest{Queue: "keep", Message: text("o", "still waiting")})
	root := runningTask(t, b, api.ScheduleRequest{Queue: "old", Message: text("r", "root objective")})
	child := runningTask(t, b, api.ScheduleRequest{Queue: "old", ParentID: root.ID, Message: text("c", "child objective")})
	grand := runningTask(t, b, api.ScheduleRequest{Queue: "old", ParentID: child.ID, Message: text("g", "grandchild objective")})
	for _, task := range []api.Task{grand, child, root} {
		if _, err := b.client.RecordResult(ctx, task.ID, api.ResultRequest{DeliveryID: task.Claim.DeliveryID, Success: true}); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, b)
	type reads struct {
		task    api.Task
		tree    []byte
		lineage []string
		history int
		mail    []string
	}
	read := func() reads {
		t.Helper()
		task, err := b.client.Get(ctx, grand.ID)
		if err != nil {
			t.Fatal(err)
		}
		tree, err := b.client.Tree(ctx, grand.ID)
		if err != nil {
			t.Fatal(err)
		}
		treeJSON, _ := json.Marshal(tree)
		lh, err := b.client.LineageHistory(ctx, child.ID)
		if err != nil {
			t.Fatal(err)
		}
		h, err := b.client.History(ctx, root.ID)
		if err != nil {
			t.Fatal(err)
		}
		m, err := b.client.Mailbox(ctx, root.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		r := reads{task: task, tree: treeJSON, history: len(h.Events), mail: mailIDs(m.Messages)}
		for _, ev := range lh.Events {
			r.lineage = append(r.lineage, ev.ID)
		}
		return r
	}
	before := read()
	if len(before.lineage) == 0 || before.history == 0 {
		t.Fatalf("nothing to compare: %+v", before)
	}
	listed := func(status, queue string) []string {
		t.Helper()
		l, err := b.client.List(ctx, api.ListOptions{Status: status, Queue: queue, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return taskIDs(l.Tasks)
	}
	if got := listed("succeeded", ""); !slices.Equal(got, sorted(root.ID, child.ID, grand.ID)) {
		t.Fatalf("succeeded before eviction: %v", got)
	}

	// Four single-task lineages finish after it: the three-task lineage
	// that finished first is evicted, then the oldest single one.
	var later []string
	for range 4 {
		task := mustSchedule(t, b, api.ScheduleRequest{Queue: "new"})
		if _, err := b.client.Cancel(ctx, task.ID, "not needed"); err != nil {
			t.Fatal(err)
		}
		later = append(later, task.ID)
	}
	settled(t, b)
	if got := listed("succeeded", ""); len(got) != 0 {
		t.Errorf("succeeded after eviction: %v", got)
	}
	if got, want := listed("canceled", ""), sorted(later[1:]...); !slices.Equal(got, want) {
		t.Errorf("canceled after eviction: %v, want %v", got, want)
	}
	if got := listed("", "keep"); !slices.Equal(got, []string{open.ID}) {
		t.Errorf("open tasks listed: %v, want %v", got, []string{open.ID})
	}
	after := read()
	if !slices.Equal(after.tree, before.tree) {
		t.Errorf("tree changed by eviction:\nbefore %s\nafter  %s", before.tree, after.tree)
	}
	if !slices.Equal(after.lineage, before.lineage) || after.history != before.history || !slices.Equal(after.mail, before.mail) || after.task.Status != "succeeded" ||
		after.task.Message.Content[0].Text != "grandchild objective" {
		t.Errorf("reads changed by eviction:\nbefore %+v\nafter  %+v", before, after)
	}
	ch, err := b.client.Check(ctx, grand.ID, "")
	if err != nil || !ch.ShouldStop || ch.Reason != "terminal" {
		t.Errorf("check of an evicted task: %v %+v", err, ch)
	}

	// Writes to an evicted task are decided on its log, as before.
	_, err = b.client.Cancel(ctx, root.ID, "again")
	apiError(t, err, http.StatusConflict, "terminal")
	_, err = b.client.AppendMail(ctx, grand.ID, text("late", "a late note"))
	apiError(t, err, http.StatusConflict, "terminal")

	// A rebuild from the log evicts the same tasks.
	digest := b.node.Engine.Digest()
	if a := rawDo(t, b, http.MethodPost, "/v1/admin/projections/rebuild", ""); a.status != http.StatusOK {
		t.Fatalf("rebuild: %d %s", a.status, a.body)
	}
	if got := b.node.Engine.Digest(); got != digest {
		t.Error("the rebuilt projections differ from the live ones")
	}
}
