package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"github.com/taskledger/taskledger/api"
)

func TestIdempotentSchedule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("RepeatAnswersExistingTask", func(t *testing.T) {
		t.Parallel()
		body := `{"customerId":"repeat","requestId":"req-42","queue":"idem","message":{"id":"m1","content":[{"type":"text","text":"once"}]}}`
		first := rawDo(t, b, http.MethodPost, "/v1/tasks", body)
		var created api.Task
		if first.status != http.StatusCreated || json.Unmarshal(first.body, &created) != nil || created.ID == "" || created.RequestID != "req-42" {
			t.Fatalf("first schedule: %d %s, want 201", first.status, first.body)
		}
		second := rawDo(t, b, http.MethodPost, "/v1/tasks", body)
		var again api.Task
		if second.status != http.StatusOK || json.Unmarshal(second.body, &again) != nil || again.ID != created.ID {
			t.Fatalf("repeated schedule: %d %s, want 200 with id %s", second.status, second.body, created.ID)
		}
		// The existing task comes back whatever the repeat says.
		other, isNew, err := b.client.Schedule(ctx, api.ScheduleRequest{CustomerID: "repeat", RequestID: "req-42", Queue: "elsewhere"})
		if err != nil || isNew || other.ID != created.ID || other.Queue != "idem" {
			t.Fatalf("repeat with other fields: %v created=%v %+v", err, isNew, other)
		}
		if n := countType(t, b, created.ID, "TaskScheduled"); n != 1 {
			t.Fatalf("%d TaskScheduled events, want 1", n)
		}
		l, err := b.client.List(ctx, api.ListOptions{CustomerID: "repeat"})
		if err != nil || len(l.Tasks) != 1 {
			t.Fatalf("customer has %d tasks (%v), want 1", len(l.Tasks), err)
		}
	})

	t.Run("ConcurrentRepeatsMakeOneTask", func(t *testing.T) {
		t.Parallel()
		const n = 8
		tasks := make([]api.Task, n)
		created := make([]bool, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				tasks[i], created[i], errs[i] = b.client.Schedule(ctx, api.ScheduleRequest{CustomerID: "burst", RequestID: "same-request", Queue: "idem"})
			})
		}
		close(start)
		wg.Wait()
		fresh := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("schedule %d: %v", i, errs[i])
			}
			if tasks[i].ID != tasks[0].ID {
				t.Fatalf("schedule %d made task %s, schedule 0 made %s", i, tasks[i].ID, tasks[0].ID)
			}
			if created[i] {
				fresh++
			}
		}
		if fresh != 1 {
			t.Fatalf("%d answers were 201, want exactly 1", fresh)
		}
		l, err := b.client.List(ctx, api.ListOptions{CustomerID: "burst"})
		if err != nil || len(l.Tasks) != 1 || l.Tasks[0].ID != tasks[0].ID {
			t.Fatalf("customer tasks %+v (%v), want only %s", l.Tasks, err, tasks[0].ID)
		}
		if n := countType(t, b, tasks[0].ID, "TaskScheduled"); n != 1 {
			t.Fatalf("%d TaskScheduled events, want 1", n)
		}
	})

	t.Run("CustomersHaveSeparateRequestIDs", func(t *testing.T) {
		t.Parallel()
		acme, createdA, err := b.client.Schedule(ctx, api.ScheduleRequest{CustomerID: "acme", RequestID: "shared", Queue: "idem"})
		if err != nil || !createdA || acme.CustomerID != "acme" {
			t.Fatalf("acme: %v created=%v %+v", err, createdA, acme)
		}
		globex, createdG, err := b.client.Schedule(ctx, api.ScheduleRequest{CustomerID: "globex", RequestID: "shared", Queue: "idem"})
		if err != nil || !createdG || globex.CustomerID != "globex" {
			t.Fatalf("globex: %v created=%v %+v", err, createdG, globex)
		}
		if acme.ID == globex.ID {
			t.Fatalf("two customers' requests made one task %s", acme.ID)
		}
		// Without a requestId every schedule is a new task.
		x := mustSchedule(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "idem"})
		y := mustSchedule(t, b, api.ScheduleRequest{CustomerID: "acme", Queue: "idem"})
		if x.ID == y.ID || x.ID == acme.ID {
			t.Fatalf("schedules without requestId shared ids: %s %s", x.ID, y.ID)
		}
	})
}
