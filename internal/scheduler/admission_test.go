package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/internal/testnode"
	"github.com/taskledger/taskledger/projections"
)

// rejected schedules req as p, requires an admission rejection whose
// reason contains want, and returns the rejected task. The task comes
// back both in the error and as the answer, persisted canceled.
func rejected(t *testing.T, n *testnode.Node, p scheduler.Principal, req scheduler.ScheduleRequest, want string) aggregate.State {
	t.Helper()
	st, created, err := n.Service.Schedule(context.Background(), p, req)
	var ae *scheduler.AdmissionError
	if !errors.As(err, &ae) || !errors.Is(err, scheduler.ErrAdmissionRejected) {
		t.Fatalf("schedule %+v: got %v, want an *AdmissionError", req, err)
	}
	task := ae.Task
	if created || task.TaskID == "" || task.TaskID != st.TaskID {
		t.Fatalf("rejection: created %v, error's task %q, answer's task %q", created, task.TaskID, st.TaskID)
	}
	if task.Status != aggregate.StatusCanceled || !task.Rejected || !strings.Contains(task.Reason, want) ||
		task.CompletedAt.IsZero() || !strings.Contains(err.Error(), want) {
		t.Fatalf("rejected task %s: status %s rejected %v reason %q (error %q); want canceled, reason containing %q",
			task.TaskID, task.Status, task.Rejected, task.Reason, err, want)
	}
	stored := get(t, n, task.TaskID)
	if stored.Status != aggregate.StatusCanceled || !stored.Rejected || stored.Reason != task.Reason {
		t.Fatalf("stored rejected task: status %s rejected %v reason %q", stored.Status, stored.Rejected, stored.Reason)
	}
	if h := types(history(t, n, task.TaskID)); len(h) != 1 || h[0] != events.TypeAdmissionRejected {
		t.Fatalf("history of the rejected task: %v, want [AdmissionRejected]", h)
	}
	return task
}

// admitted schedules a root task as p that stays scheduled, requiring
// admission to let it in.
func admitted(t *testing.T, n *testnode.Node, p scheduler.Principal, req scheduler.ScheduleRequest) aggregate.State {
	t.Helper()
	st := idle(t, n, p, req)
	if st.Rejected {
		t.Fatalf("admitted task %s is marked rejected", st.TaskID)
	}
	return st
}

func TestAdmissionMaxActiveRoots(t *testing.T) {
	t.Parallel()
	n := setup(t, withAdmission(scheduler.Admission{Default: scheduler.Quota{MaxActiveRoots: 2}}))
	ctx := context.Background()

	r0 := admitted(t, n, acme, scheduler.ScheduleRequest{RequestID: "r0"})
	r1 := admitted(t, n, acme, scheduler.ScheduleRequest{RequestID: "r1"})
	over := rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r2"}, "quota")
	if over.CustomerID != "acme" || over.Spec.RequestID != "r2" || over.Spec.RootID != over.TaskID {
		t.Fatalf("rejected candidate: customer %q request %q root %q", over.CustomerID, over.Spec.RequestID, over.Spec.RootID)
	}
	if got, _ := n.Engine.Admissions("acme", time.Time{}); got != 2 {
		t.Fatalf("acme has %d active roots after a rejection, want 2", got)
	}

	t.Run("RetrySameRejection", func(t *testing.T) {
		again := rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r2"}, "quota")
		if again.TaskID != over.TaskID || again.Version != over.Version {
			t.Fatalf("retry answered %s v%d, want %s v%d", again.TaskID, again.Version, over.TaskID, over.Version)
		}
		// Without a request id each refusal is a new canceled task.
		fresh := rejected(t, n, acme, scheduler.ScheduleRequest{}, "quota")
		if fresh.TaskID == over.TaskID {
			t.Fatal("a request without request id reused the rejected task")
		}
	})

	t.Run("ReplayOfAdmittedNotCharged", func(t *testing.T) {
		st, created, err := n.Service.Schedule(ctx, acme, scheduler.ScheduleRequest{RequestID: "r0"})
		if err != nil || created || st.TaskID != r0.TaskID {
			t.Fatalf("replay of r0 at the quota: task %s created %v err %v, want %s", st.TaskID, created, err, r0.TaskID)
		}
	})

	t.Run("ChildrenNotCharged", func(t *testing.T) {
		child := idle(t, n, acme, scheduler.ScheduleRequest{ParentID: r0.TaskID})
		idle(t, n, acme, scheduler.ScheduleRequest{ParentID: r0.TaskID})
		idle(t, n, acme, scheduler.ScheduleRequest{ParentID: r1.TaskID})
		idle(t, n, acme, scheduler.ScheduleRequest{ParentID: child.TaskID})
		if got, _ := n.Engine.Admissions("acme", time.Time{}); got != 2 {
			t.Fatalf("acme has %d active roots after children, want 2", got)
		}
	})

	t.Run("OtherCustomerUnaffected", func(t *testing.T) {
		admitted(t, n, globex, scheduler.ScheduleRequest{RequestID: "r0"})
		admitted(t, n, globex, scheduler.ScheduleRequest{RequestID: "r1"})
		rejected(t, n, globex, scheduler.ScheduleRequest{RequestID: "r2"}, "quota")
	})

	t.Run("FinishedRootFreesSlot", func(t *testing.T) {
		if _, err := n.Service.Cancel(ctx, acme, r1.TaskID, "done"); err != nil {
			t.Fatal(err)
		}
		admitted(t, n, acme, scheduler.ScheduleRequest{RequestID: "r3"})
		// The earlier refusal stands: a retry does not get a second chance.
		rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r2"}, "quota")
		rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r4"}, "quota")
	})
}

func TestAdmissionMaxRootsPerMinute(t *testing.T) {
	t.Parallel()
	n := setup(t, withAdmission(scheduler.Admission{
		Default:     scheduler.Quota{MaxRootsPerMinute: 2},
		PerCustomer: map[string]scheduler.Quota{"globex": {MaxRootsPerMinute: 3}},
	}))
	ctx := context.Background()

	r0 := admitted(t, n, acme, scheduler.ScheduleRequest{RequestID: "r0"})
	r1 := admitted(t, n, acme, scheduler.ScheduleRequest{RequestID: "r1"})
	// Finished roots still count against the per-minute quota.
	for _, r := range []aggregate.State{r0, r1} {
		if _, err := n.Service.Cancel(ctx, acme, r.TaskID, "done"); err != nil {
			t.Fatal(err)
		}
	}
	over := rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r2"}, "last minute")
	if again := rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r2"}, "last minute"); again.TaskID != over.TaskID {
		t.Fatalf("retry answered %s, want %s", again.TaskID, over.TaskID)
	}

	t.Run("ChildrenNotCharged", func(t *testing.T) {
		// At the quota, children are still admitted and do not count.
		initech := scheduler.ScheduleRequest{CustomerID: "initech"}
		live := admitted(t, n, operator, initech)
		admitted(t, n, operator, initech)
		for range 3 {
			idle(t, n, operator, scheduler.ScheduleRequest{CustomerID: "initech", ParentID: live.TaskID})
		}
		if _, got := n.Engine.Admissions("initech", time.Now().Add(-projections.AdmissionWindow)); got != 2 {
			t.Fatalf("initech has %d recent admissions, want its 2 roots", got)
		}
		rejected(t, n, operator, initech, "last minute")
	})

	t.Run("PerCustomerQuota", func(t *testing.T) {
		for range 3 {
			admitted(t, n, globex, scheduler.ScheduleRequest{})
		}
		rejected(t, n, globex, scheduler.ScheduleRequest{}, "at most 3")
	})
}

// checker records the queries an external usage checker was sent.
type checker struct {
	mu      sync.Mutex
	queries []scheduler.UsageQuery
}

func (c *checker) record(t *testing.T, r *http.Request) {
	var q scheduler.UsageQuery
	if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
		t.Errorf("usage query: %v", err)
	}
	c.mu.Lock()
	c.queries = append(c.queries, q)
	c.mu.Unlock()
}

func (c *checker) asked() []scheduler.UsageQuery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]scheduler.UsageQuery(nil), c.queries...)
}

// startChecker serves handler as the usage checker of a new node, and
// returns the node, the checker's record of queries and the node's
// metrics registry.
func startChecker(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) (*testnode.Node, *checker, *prometheus.Registry) {
	t.Helper()
	c := &checker{}
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.record(t, r)
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(http.DefaultClient.CloseIdleConnections) // the service asks with the default client
	n := setup(t, withAdmission(scheduler.Admission{CheckerURL: srv.URL, CheckerTimeout: 200 * time.Millisecond}),
		func(cfg *node.Config) { cfg.Registry = reg })
	return n, c, reg
}

// counter reads an unlabelled counter from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("counter %s not registered", name)
	return 0
}

func TestAdmissionUsageChecker(t *testing.T) {
	t.Parallel()

	t.Run("RefusalRejects", func(t *testing.T) {
		t.Parallel()
		n, c, reg := startChecker(t, func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(scheduler.UsageVerdict{Allow: false, Reason: "over budget"})
		})
		task := rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r0", Queue: "gpu"}, "usage: over budget")
		q := c.asked()
		if len(q) != 1 || q[0].CustomerID != "acme" || q[0].Queue != "gpu" || q[0].RequestID != "r0" {
			t.Fatalf("checker was asked %+v, want one query for acme's r0 on gpu", q)
		}
		// A retry repeats the stored rejection without asking again.
		if again := rejected(t, n, acme, scheduler.ScheduleRequest{RequestID: "r0", Queue: "gpu"}, "usage: over budget"); again.TaskID != task.TaskID {
			t.Fatalf("retry answered %s, want %s", again.TaskID, task.TaskID)
		}
		if q := c.asked(); len(q) != 1 {
			t.Fatalf("a retry asked the checker again: %+v", q)
		}
		if got := counter(t, reg, "taskledger_admission_rejections_total"); got != 1 {
			t.Fatalf("%v rejections counted, want 1 (a retry is not a new rejection)", got)
		}
		if got := counter(t, reg, "taskledger_usage_checker_failures_total"); got != 0 {
			t.Fatalf("%v checker failures counted, want 0", got)
		}
	})

	t.Run("RefusalWithoutReason", func(t *testing.T) {
		t.Parallel()
		n, _, _ := startChecker(t, func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"allow": false}`))
		})
		rejected(t, n, acme, scheduler.ScheduleRequest{}, "usage: refused by the usage checker")
	})

	t.Run("LongReasonIsCut", func(t *testing.T) {
		t.Parallel()
		n, _, _ := startChecker(t, func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(scheduler.UsageVerdict{Allow: false, Reason: strings.Repeat("é", events.MaxReasonBytes)})
		})
		task := rejected(t, n, acme, scheduler.ScheduleRequest{}, "usage: é")
		if len(task.Reason) > events.MaxReasonBytes || !utf8.ValidString(task.Reason) {
			t.Fatalf("reason of %d bytes (valid UTF-8: %v), want at most %d", len(task.Reason), utf8.ValidString(task.Reason), events.MaxReasonBytes)
		}
	})

	t.Run("AllowAdmitsWithCounts", func(t *testing.T) {
		t.Parallel()
		n, c, _ := startChecker(t, func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(scheduler.UsageVerdict{Allow: true})
		})
		root := admitted(t, n, acme, scheduler.ScheduleRequest{})
		admitted(t, n, acme, scheduler.ScheduleRequest{})
		// Children are never charged: the checker is not asked about them.
		idle(t, n, acme, scheduler.ScheduleRequest{ParentID: root.TaskID})
		q := c.asked()
		if len(q) != 2 || q[0].ActiveRoots != 0 || q[0].RecentRoots != 0 || q[1].ActiveRoots != 1 || q[1].RecentRoots != 1 {
			t.Fatalf("checker was asked %+v, want two queries counting 0 then 1 roots", q)
		}
	})

	gone := make(chan struct{})
	t.Cleanup(func() { close(gone) })
	failOpen := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
	}{
		{"ErrorAdmits", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "boom", http.StatusInternalServerError)
		}},
		{"MalformedAnswerAdmits", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"allow": fal`))
		}},
		{"SlowAdmits", func(w http.ResponseWriter, r *http.Request) {
			// A refusal, long after the service's 200ms timeout: a service
			// that waited for it would reject the task.
			select {
			case <-r.Context().Done():
			case <-gone:
			case <-time.After(5 * time.Second):
			}
			json.NewEncoder(w).Encode(scheduler.UsageVerdict{Allow: false, Reason: "late"})
		}},
	}
	for _, c := range failOpen {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			n, chk, reg := startChecker(t, c.answer)
			admitted(t, n, acme, scheduler.ScheduleRequest{RequestID: "r0"})
			// On a loaded machine the service's timeout can fire before the
			// checker's handler has even run: wait for the question to land.
			testnode.Eventually(t, "checker asked", func() bool { return len(chk.asked()) > 0 })
			if q := chk.asked(); len(q) != 1 {
				t.Fatalf("checker was asked %d times, want 1", len(q))
			}
			if got := counter(t, reg, "taskledger_usage_checker_failures_total"); got != 1 {
				t.Fatalf("%v checker failures counted, want 1", got)
			}
			if got := counter(t, reg, "taskledger_admission_rejections_total"); got != 0 {
				t.Fatalf("%v rejections counted, want 0", got)
			}
		})
	}
}
