package httpapi_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/internal/httpapi"
	"github.com/taskledger/taskledger/internal/node"
	"github.com/taskledger/taskledger/internal/scheduler"
)

// caller is what the HTTP client and the in-process Local have in common.
type caller interface {
	Schedule(ctx context.Context, req api.ScheduleRequest) (api.Task, bool, error)
	Get(ctx context.Context, id string) (api.Task, error)
	Claim(ctx context.Context, id, deliveryID, executorID string, opts ...api.ClaimOption) (api.Task, error)
	RecordResult(ctx context.Context, id string, r api.ResultRequest) (api.Task, error)
	Cancel(ctx context.Context, id, reason string) (api.Task, error)
}

var (
	_ caller = (*api.Client)(nil)
	_ caller = (*httpapi.Local)(nil)
)

// TestTypedErrors provokes every error a task call can answer, through the
// HTTP client and through Local, and requires the same sentinel from both
// (errors.Is on code and reason) with the sentinel's HTTP status.
func TestTypedErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) {
		c.Admission = scheduler.Admission{PerCustomer: map[string]scheduler.Quota{"capped": {MaxActiveRoots: 1}}}
	})
	ctx := context.Background()
	callers := map[string]caller{"HTTP": b.client, "Local": httpapi.NewLocal(b.node.Service)}

	running := runningTask(t, b, api.ScheduleRequest{})
	queued := queuedTask(t, b, api.ScheduleRequest{})
	done := runningTask(t, b, api.ScheduleRequest{})
	if _, err := b.client.RecordResult(ctx, done.ID, api.ResultRequest{DeliveryID: done.Claim.DeliveryID, Success: true}); err != nil {
		t.Fatal(err)
	}
	later := mustSchedule(t, b, api.ScheduleRequest{DelaySeconds: new(3600.0)})
	mustSchedule(t, b, api.ScheduleRequest{CustomerID: "capped", DelaySeconds: new(3600.0)})
	closed := mustSchedule(t, b, api.ScheduleRequest{DelaySeconds: new(3600.0)})
	underClosed := mustSchedule(t, b, api.ScheduleRequest{ParentID: closed.ID, DelaySeconds: new(3600.0)})
	mustSchedule(t, b, api.ScheduleRequest{RequestID: "named-a-root", DelaySeconds: new(3600.0)})
	if _, err := b.client.Cancel(ctx, closed.ID, "stop"); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		want *api.Error
		call func(c caller) error
	}{
		{"Invalid", api.ErrInvalid, func(c caller) error {
			_, _, err := c.Schedule(ctx, api.ScheduleRequest{Queue: "bad.queue"})
			return err
		}},
		{"NotFound", api.ErrNotFound, func(c caller) error { _, err := c.Get(ctx, "no-such-task"); return err }},
		{"Terminal", api.ErrTerminal, func(c caller) error { _, err := c.Cancel(ctx, done.ID, "late"); return err }},
		{"TokenMismatch", api.ErrTokenMismatch, func(c caller) error {
			_, err := c.RecordResult(ctx, running.ID, api.ResultRequest{DeliveryID: "not-the-token", Success: true})
			return err
		}},
		{"NotClaimable", api.ErrNotClaimable, func(c caller) error {
			_, err := c.Claim(ctx, later.ID, "any-token", "w1")
			return err
		}},
		{"ParentTerminal", api.ErrParentTerminal, func(c caller) error {
			_, _, err := c.Schedule(ctx, api.ScheduleRequest{ParentID: done.ID})
			return err
		}},
		{"RequestIDConflict", api.ErrRequestIDConflict, func(c caller) error {
			_, _, err := c.Schedule(ctx, api.ScheduleRequest{ParentID: later.ID, RequestID: "named-a-root"})
			return err
		}},
		{"AncestorTerminal", api.ErrAncestorTerminal, func(c caller) error {
			_, _, err := c.Schedule(ctx, api.ScheduleRequest{ParentID: underClosed.ID})
			return err
		}},
		{"AdmissionRejected", api.ErrAdmissionRejected, func(c caller) error {
			_, _, err := c.Schedule(ctx, api.ScheduleRequest{CustomerID: "capped"})
			return err
		}},
	}
	for name, c := range callers {
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				err := tc.call(c)
				if !errors.Is(err, tc.want) {
					t.Fatalf("got %v, want errors.Is %s", err, tc.want.Code+" "+tc.want.Reason)
				}
				var e *api.Error
				if !errors.As(err, &e) || e.Status != tc.want.Status || e.Message == "" {
					t.Fatalf("got %#v, want status %d and a message", e, tc.want.Status)
				}
				for _, other := range []*api.Error{api.ErrTerminal, api.ErrTokenMismatch, api.ErrNotFound, api.ErrInvalid} {
					if other != tc.want && errors.Is(err, other) {
						t.Fatalf("%v also matches %s/%s", err, other.Code, other.Reason)
					}
				}
				if tc.want == api.ErrAdmissionRejected && (e.Task == nil || e.Task.Status != api.StatusCanceled) {
					t.Fatalf("admission rejection without the recorded task: %+v", e.Task)
				}
			})
		}
	}
	if _, err := b.client.Claim(ctx, queued.ID, queued.Delivery.ID, "w1"); err != nil {
		t.Fatalf("the queued task stays claimable: %v", err)
	}
}

// TestTypedErrorsOfTheTransport covers the errors only HTTP produces.
func TestTypedErrorsOfTheTransport(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *node.Config) { c.Tokens = map[string]string{"secret": "acme"} })
	ctx := context.Background()
	if _, err := api.NewClient(b.url, "wrong").Get(ctx, "any"); !errors.Is(err, api.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v, want ErrUnauthenticated", err)
	}
	c := api.NewClient(b.url, "secret")
	_, _, err := c.Schedule(ctx, api.ScheduleRequest{Repo: strings.Repeat("r", api.MaxBodyBytes)})
	if !errors.Is(err, api.ErrPayloadTooLarge) {
		t.Fatalf("oversized body: %v, want ErrPayloadTooLarge", err)
	}
	// A server that is not taskledger answers plain text: the error keeps
	// its status and text and matches no sentinel.
	plain := httptest.NewServer(nil)
	t.Cleanup(plain.Close)
	_, err = api.NewClient(plain.URL, "").Get(ctx, "x")
	var e *api.Error
	if !errors.As(err, &e) || e.Status != 404 || e.Code != "http_404" || errors.Is(err, api.ErrNotFound) {
		t.Fatalf("plain 404: %#v", err)
	}
}
