package replay_test

import (
	"testing"
	"time"

	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/replay"
)

// TestDescribeRetryAndLabels: a retry's history says which task it
// repeats, and a task's labels, and a schedule's runs', are listed in key
// order.
func TestDescribeRetryAndLabels(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	spec := events.TaskSpec{RootID: "new-1", RelatedTaskID: "old-1", RetryOf: "old-1", Queue: "q", RunAt: at, TimeoutSeconds: 60,
		Labels: map[string]string{"team": "red", "repo": "example/storefront"}}
	got := replay.Describe(events.Event{TaskID: "new-1", Data: events.TaskScheduled{Spec: spec}})
	want := "queue q, run at 2026-01-02T03:04:05Z, timeout 60s, retry of old-1, labels repo=example/storefront team=red"
	if got != want {
		t.Fatalf("Describe = %q, want %q", got, want)
	}
	spec.RetryOf, spec.Labels = "", nil
	if got := replay.Describe(events.Event{TaskID: "new-1", Data: events.TaskScheduled{Spec: spec}}); got != "queue q, run at 2026-01-02T03:04:05Z, timeout 60s" {
		t.Fatalf("Describe without retry or labels = %q", got)
	}
	sched := events.ScheduleSpec{Every: "1h", Timezone: "UTC", Overlap: "skip", Catchup: "one",
		Task: events.TaskSpec{Queue: "q", Labels: map[string]string{"team": "red", "kind": "nightly"}}}
	want = "schedule s1 created: every 1h, queue q, overlap skip, catchup one, labels kind=nightly team=red"
	if got := replay.Describe(events.Event{TaskID: "s1", Data: events.ScheduleCreated{Spec: sched}}); got != want {
		t.Fatalf("Describe of a schedule with labels = %q, want %q", got, want)
	}
}
