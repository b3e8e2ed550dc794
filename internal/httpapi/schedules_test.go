package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// everySecond is a schedule of a run a second on queue "sched".
func everySecond(id string) api.ScheduleCreateRequest {
	return api.ScheduleCreateRequest{ID: id, Every: "1s", Overlap: events.OverlapAllow,
		Task: api.ScheduleTask{Queue: "sched", Message: text("", "nightly triage")}}
}

// waitRuns polls a schedule until cond holds of it and returns it.
func waitRuns(t *testing.T, c *api.Client, id, what string, cond func(api.Schedule) bool) api.Schedule {
	t.Helper()
	var s api.Schedule
	testnode.Eventually(t, what, func() bool {
		var err error
		if s, err = c.GetSchedule(context.Background(), id, api.ScheduleOptions{}); errors.Is(err, api.ErrNotFound) {
			return false // another node's projections have not applied it yet
		} else if err != nil {
			t.Fatal(err)
		}
		return cond(s)
	})
	return s
}

// checkRunTasks checks that every run of s made the task its request id
// derives, as POST /v1/tasks with that requestId would. A run's task is
// scheduled right after its ScheduleFired, so it may not be there yet.
func checkRunTasks(t *testing.T, c *api.Client, s api.Schedule) {
	t.Helper()
	for _, r := range s.Runs {
		if r.Skipped != "" {
			continue
		}
		if !r.Manual && r.RequestID != events.ScheduleRequestID(s.ID, r.At) {
			t.Fatalf("run at %v has request id %s, want it derived from the instant", r.At, r.RequestID)
		}
		var task api.Task
		testnode.Eventually(t, "the task of run "+r.TaskID, func() bool {
			var err error
			if task, err = c.Get(context.Background(), r.TaskID); err != nil && !errors.Is(err, api.ErrNotFound) {
				t.Fatalf("the task of run %+v: %v", r, err)
			}
			return err == nil
		})
		if task.RequestID != r.RequestID || task.ID != events.DeriveID("r", s.CustomerID, r.RequestID) || task.Queue != "sched" ||
			task.ParentID != "" || len(task.Message.Content) != 1 || task.Message.Content[0].Text != "nightly triage" {
			t.Fatalf("run %+v made task %+v", r, task)
		}
	}
}

func TestSchedulesEndToEnd(t *testing.T) {
	t.Parallel()
	schedulesEndToEnd(t, setup(t))
}

// On a log of three shards a schedule's events live in its shard and its
// runs' tasks in theirs.
func TestShardedSchedulesEndToEnd(t *testing.T) {
	t.Parallel()
	schedulesEndToEnd(t, setup(t, func(c *node.Config) { c.Shards = 3 }))
}

func schedulesEndToEnd(t *testing.T, b *bundle) {
	ctx := context.Background()
	s, created, err := b.client.CreateSchedule(ctx, everySecond("triage"))
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if s.Timezone != "UTC" || s.Catchup != "one" || len(s.Next) != 5 || !s.Next[1].Equal(s.Next[0].Add(time.Second)) || *s.Task.TimeoutSeconds != 3600 {
		t.Fatalf("created %+v", s)
	}
	// Not changed (a run may have fired in between: the version is no measure).
	if again, created, err := b.client.CreateSchedule(ctx, everySecond("triage")); err != nil || created || !again.UpdatedAt.IsZero() {
		t.Fatalf("repeat: %v %v %+v", created, err, again)
	}
	s = waitRuns(t, b.client, "triage", "two runs", func(s api.Schedule) bool { return s.RunCount >= 2 })
	checkRunTasks(t, b.client, s)
	if s.Runs[0].At.Before(s.Runs[1].At) {
		t.Fatalf("runs not newest first: %+v", s.Runs)
	}

	// Paused: no instant is due; no timer is armed for it.
	s, err = b.client.PauseSchedule(ctx, "triage", api.ScheduleOptions{})
	if err != nil || !s.Paused || len(s.Next) != 0 {
		t.Fatalf("pause: %+v %v", s, err)
	}
	if n := b.node.Engine.TimerLen(projections.Fire); n != 0 {
		t.Fatalf("%d schedules in the fire queue while the only one is paused", n)
	}
	paused := s.RunCount
	// A trigger runs a paused schedule.
	task, err := b.client.TriggerSchedule(ctx, "triage", api.ScheduleOptions{})
	if err != nil || task.Queue != "sched" {
		t.Fatalf("trigger: %+v %v", task, err)
	}
	s, _ = b.client.GetSchedule(ctx, "triage", api.ScheduleOptions{})
	if s.RunCount != paused+1 || !s.Runs[0].Manual || s.Runs[0].TaskID != task.ID || s.Runs[0].Status == "" {
		t.Fatalf("after a trigger: %+v", s)
	}
	// Resumed, it fires again.
	if s, err = b.client.ResumeSchedule(ctx, "triage", api.ScheduleOptions{}); err != nil || s.Paused || len(s.Next) == 0 {
		t.Fatalf("resume: %+v %v", s, err)
	}
	s = waitRuns(t, b.client, "triage", "a run after the resume", func(s api.Schedule) bool { return s.RunCount > paused+1 })
	checkRunTasks(t, b.client, s)

	// Deleted: gone from the list, still readable with its history.
	if s, err = b.client.DeleteSchedule(ctx, "triage", api.ScheduleOptions{}); err != nil || !s.Deleted || len(s.Next) != 0 {
		t.Fatalf("delete: %+v %v", s, err)
	}
	if l, err := b.client.ListSchedules(ctx, "", "", 0); err != nil || len(l.Schedules) != 0 {
		t.Fatalf("list after delete: %+v %v", l, err)
	}
	h, err := b.client.ScheduleHistory(ctx, "triage", api.ScheduleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]int{}
	for _, e := range h.Events {
		types[e.Type]++
	}
	if types["ScheduleCreated"] != 1 || types["SchedulePaused"] != 1 || types["ScheduleResumed"] != 1 || types["ScheduleDeleted"] != 1 ||
		types["ScheduleFired"] < 4 || h.Events[len(h.Events)-1].Status != "deleted" {
		t.Fatalf("history %v", types)
	}
	for _, f := range []func() error{
		func() error { _, err := b.client.PauseSchedule(ctx, "triage", api.ScheduleOptions{}); return err },
		func() error { _, err := b.client.TriggerSchedule(ctx, "triage", api.ScheduleOptions{}); return err },
		func() error { _, err := b.client.DeleteSchedule(ctx, "triage", api.ScheduleOptions{}); return err },
	} {
		apiError(t, f(), http.StatusNotFound, "")
	}
	settled(t, b)
}

func TestScheduleOverlapSkip(t *testing.T) {
	t.Parallel()
	scheduleOverlapSkip(t, setup(t))
}

// The overlap check reads a run's task, which lives in another shard than
// its schedule.
func TestShardedScheduleOverlapSkip(t *testing.T) {
	t.Parallel()
	scheduleOverlapSkip(t, setup(t, func(c *node.Config) { c.Shards = 3 }))
}

func scheduleOverlapSkip(t *testing.T, b *bundle) {
	req := everySecond("overlap")
	req.Overlap = "" // skip: nobody claims the runs, so the first stays queued
	if _, _, err := b.client.CreateSchedule(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	s := waitRuns(t, b.client, "overlap", "two skips", func(s api.Schedule) bool {
		skips := 0
		for _, r := range s.Runs {
			if r.Skipped == "overlap" {
				skips++
			}
		}
		return skips >= 2
	})
	if s.RunCount != 1 {
		t.Fatalf("%d runs while the first is live, want 1: %+v", s.RunCount, s.Runs)
	}
}

// TestScheduleTaskSpec: a schedule's task takes labels, a retry policy and
// a concurrency limit, shows them (the policy's defaults filled in), and
// every run's task gets them.
func TestScheduleTaskSpec(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	req := everySecond("spec")
	req.Every, req.Paused = "1h", true // runs only when triggered
	req.Task.Labels = map[string]string{"repo": "example/storefront", "kind": "triage"}
	req.Task.Retry = &api.RetryRequest{MaxAttempts: refOf(3), On: []string{"failed", "timed_out"}}
	req.Task.Concurrency = &events.Concurrency{Key: "repo:example/storefront", Limit: 2}
	wantRetry := events.RetryPolicy{MaxAttempts: 3, BackoffSeconds: events.DefaultBackoffSeconds,
		MaxBackoffSeconds: events.DefaultMaxBackoffSeconds, On: []string{"failed", "timed_out"}}
	s, created, err := b.client.CreateSchedule(ctx, req)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if !equalLabels(s.Task.Labels, req.Task.Labels) || !reflect.DeepEqual(s.Task.Retry, api.RetryRequestOf(&wantRetry)) ||
		s.Task.Concurrency == nil || *s.Task.Concurrency != *req.Task.Concurrency {
		t.Fatalf("the schedule's task: %+v", s.Task)
	}
	if again, created, err := b.client.CreateSchedule(ctx, req); err != nil || created || !again.UpdatedAt.IsZero() {
		t.Fatalf("the same spec again changed it: %v %v %+v", created, err, again)
	}
	for i := range 2 {
		task, err := b.client.TriggerSchedule(ctx, "spec", api.ScheduleOptions{})
		if err != nil {
			t.Fatalf("trigger %d: %v", i, err)
		}
		if !equalLabels(task.Labels, req.Task.Labels) || task.Retry == nil || !reflect.DeepEqual(*task.Retry, wantRetry) ||
			task.MaxAttempts != 3 || task.Concurrency == nil || *task.Concurrency != *req.Task.Concurrency {
			t.Fatalf("run %d's task: %+v", i, task)
		}
	}
	l, err := b.client.List(ctx, api.ListOptions{Labels: map[string]string{"kind": "triage"}})
	if err != nil || len(l.Tasks) != 2 {
		t.Fatalf("the runs by label: %v %+v", err, l)
	}
	// A changed label is a changed spec: the next run's task has the new one.
	req.Task.Labels = map[string]string{"kind": "nightly"}
	if s2, created, err := b.client.CreateSchedule(ctx, req); err != nil || created || s2.Version == s.Version || !equalLabels(s2.Task.Labels, req.Task.Labels) {
		t.Fatalf("update: %v %v %+v", created, err, s2)
	}
	if task, err := b.client.TriggerSchedule(ctx, "spec", api.ScheduleOptions{}); err != nil || !equalLabels(task.Labels, req.Task.Labels) {
		t.Fatalf("run after the update: %v %+v", err, task)
	}
}

func TestScheduleHostile(t *testing.T) {
	t.Parallel()
	b := authSetup(t)
	a, other := tokenClient(t, b, "tok-a"), tokenClient(t, b, "tok-b")
	ctx := context.Background()
	for name, mod := range map[string]func(*api.ScheduleCreateRequest){
		"bad cron":        func(r *api.ScheduleCreateRequest) { r.Every, r.Cron = "", "61 * * * *" },
		"four fields":     func(r *api.ScheduleCreateRequest) { r.Every, r.Cron = "", "* * * *" },
		"both":            func(r *api.ScheduleCreateRequest) { r.Cron = "* * * * *" },
		"neither":         func(r *api.ScheduleCreateRequest) { r.Every = "" },
		"unknown zone":    func(r *api.ScheduleCreateRequest) { r.Every, r.Cron, r.Timezone = "", "0 3 * * *", "Europe/Atlantis" },
		"zone file":       func(r *api.ScheduleCreateRequest) { r.Every, r.Cron, r.Timezone = "", "0 3 * * *", "../../etc/passwd" },
		"every too short": func(r *api.ScheduleCreateRequest) { r.Every = "10ms" },
		"every negative":  func(r *api.ScheduleCreateRequest) { r.Every = "-1s" },
		"bad id":          func(r *api.ScheduleCreateRequest) { r.ID = "a.b" },
		"empty id":        func(r *api.ScheduleCreateRequest) { r.ID = "" },
		"long id":         func(r *api.ScheduleCreateRequest) { r.ID = strings.Repeat("x", 65) },
		"overlap":         func(r *api.ScheduleCreateRequest) { r.Overlap = "maybe" },
		"catchup":         func(r *api.ScheduleCreateRequest) { r.Catchup = "some" },
		"timeout":         func(r *api.ScheduleCreateRequest) { n := 0; r.Task.TimeoutSeconds = &n },
		"queue":           func(r *api.ScheduleCreateRequest) { r.Task.Queue = "q>" },
		"big message": func(r *api.ScheduleCreateRequest) {
			r.Task.Message = text("", strings.Repeat("x", events.MaxMessageBytes+1))
		},
		"other customer": func(r *api.ScheduleCreateRequest) { r.CustomerID = "B" },
		"label key":      func(r *api.ScheduleCreateRequest) { r.Task.Labels = map[string]string{"Repo": "x"} },
		"label value":    func(r *api.ScheduleCreateRequest) { r.Task.Labels = map[string]string{"k": strings.Repeat("v", 257)} },
		"17 labels": func(r *api.ScheduleCreateRequest) {
			r.Task.Labels = map[string]string{}
			for i := range 17 {
				r.Task.Labels[fmt.Sprint("k", i)] = "v"
			}
		},
		"retry attempts":    func(r *api.ScheduleCreateRequest) { r.Task.Retry = &api.RetryRequest{MaxAttempts: refOf(101)} },
		"retry on":          func(r *api.ScheduleCreateRequest) { r.Task.Retry = &api.RetryRequest{On: []string{"canceled"}} },
		"concurrency limit": func(r *api.ScheduleCreateRequest) { r.Task.Concurrency = &events.Concurrency{Key: "k", Limit: 0} },
		"concurrency key":   func(r *api.ScheduleCreateRequest) { r.Task.Concurrency = &events.Concurrency{Limit: 1} },
	} {
		req := everySecond("h")
		mod(&req)
		if _, _, err := a.CreateSchedule(ctx, req); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			apiError(t, err, http.StatusBadRequest, "")
		}
	}
	if _, err := a.GetSchedule(ctx, "h", api.ScheduleOptions{}); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a refused schedule was written: %v", err)
	}
	// A task body over 1 MiB is 413; fields of a task a schedule may not set are 400.
	huge := authDo(t, b, "Bearer tok-a", http.MethodPost, "/v1/schedules", `{"id":"h","every":"1s","task":{"repo":"`+strings.Repeat("x", api.MaxBodyBytes)+`"}}`)
	requireErrorBody(t, huge, http.StatusRequestEntityTooLarge, "payload_too_large")
	bigRepo := authDo(t, b, "Bearer tok-a", http.MethodPost, "/v1/schedules", `{"id":"h","every":"1s","task":{"repo":"`+strings.Repeat("x", events.MaxURLBytes+1)+`"}}`)
	requireErrorBody(t, bigRepo, http.StatusBadRequest, "invalid_argument")
	for _, body := range []string{`{"id":"h","every":"1s","task":{"parentId":"p"}}`, `{"id":"h","every":"1s","task":{"runAt":"2030-01-01T00:00:00Z"}}`, `{"id":"h","every":1}`, `[]`, `{"id":"h","every":"1s"} {}`} {
		requireErrorBody(t, authDo(t, b, "Bearer tok-a", http.MethodPost, "/v1/schedules", body), http.StatusBadRequest, "invalid_argument")
	}
	if _, _, err := a.CreateSchedule(ctx, everySecond("mine")); err != nil {
		t.Fatal(err)
	}
	// Another customer's schedule is not found, whatever it tries.
	for name, f := range map[string]func() error{
		"get":     func() error { _, err := other.GetSchedule(ctx, "mine", api.ScheduleOptions{}); return err },
		"pause":   func() error { _, err := other.PauseSchedule(ctx, "mine", api.ScheduleOptions{}); return err },
		"trigger": func() error { _, err := other.TriggerSchedule(ctx, "mine", api.ScheduleOptions{}); return err },
		"delete":  func() error { _, err := other.DeleteSchedule(ctx, "mine", api.ScheduleOptions{}); return err },
		"history": func() error { _, err := other.ScheduleHistory(ctx, "mine", api.ScheduleOptions{}); return err },
	} {
		if err := f(); err == nil {
			t.Errorf("%s of another customer's schedule answered", name)
		} else {
			apiError(t, err, http.StatusNotFound, "")
		}
	}
	if _, err := other.GetSchedule(ctx, "mine", api.ScheduleOptions{CustomerID: "A"}); err == nil {
		t.Fatal("a customer named another in customerId")
	}
	if l, err := other.ListSchedules(ctx, "", "", 0); err != nil || len(l.Schedules) != 0 {
		t.Fatalf("another customer lists %+v %v", l, err)
	}
	// Same id, other customer: its own schedule, not a change of A's.
	if s, created, err := other.CreateSchedule(ctx, everySecond("mine")); err != nil || !created || s.CustomerID != "B" {
		t.Fatalf("B's own mine: %+v %v %v", s, created, err)
	}
	// The operator names the customer.
	op := tokenClient(t, b, "tok-op")
	if s, err := op.GetSchedule(ctx, "mine", api.ScheduleOptions{CustomerID: "A"}); err != nil || s.CustomerID != "A" {
		t.Fatalf("operator get: %+v %v", s, err)
	}
	if l, err := op.ListSchedules(ctx, "", "", 1); err != nil || len(l.Schedules) != 1 || l.Next != "A/mine" {
		t.Fatalf("operator list page: %+v %v", l, err)
	}
	if l, err := op.ListSchedules(ctx, "", "A/mine", 1); err != nil || len(l.Schedules) != 1 || l.Schedules[0].CustomerID != "B" || l.Next != "" {
		t.Fatalf("operator second page: %+v %v", l, err)
	}
}

func TestScheduleLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Limits.MaxSchedules = 2 })
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, _, err := b.client.CreateSchedule(ctx, everySecond(id)); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := b.client.CreateSchedule(ctx, everySecond("c"))
	apiError(t, err, http.StatusConflict, "schedule_limit")
	// A change of a live one is no new schedule; a delete makes room.
	if _, _, err := b.client.CreateSchedule(ctx, everySecond("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.DeleteSchedule(ctx, "b", api.ScheduleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.client.CreateSchedule(ctx, everySecond("c")); err != nil {
		t.Fatal(err)
	}
}
