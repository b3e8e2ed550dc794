package httpapi

import (
	"net/http"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// NewTask renders a task's state as the API resource.
func NewTask(s aggregate.State) api.Task {
	t := api.Task{
		ID: s.TaskID, RootID: s.Spec.RootID, ParentID: s.Spec.ParentID, RelatedTaskID: s.Spec.RelatedTaskID,
		CustomerID: s.CustomerID, RequestID: s.Spec.RequestID, Queue: s.Spec.Queue,
		Repo: s.Spec.Repo, Message: s.Spec.Message, Labels: s.Spec.Labels, RetryOf: s.Spec.RetryOf, Kind: s.Spec.Kind, Payload: s.Spec.Payload, Status: string(s.Status),
		CreatedAt: utc(s.CreatedAt), RunAt: utc(s.DueAt()), StartedAt: utc(s.StartedAt),
		CompletedAt: utc(s.CompletedAt), TimeoutSeconds: s.Spec.TimeoutSeconds, Deadline: utc(s.Deadline),
		Mailbox: api.Mailbox{Count: len(s.MailIDs), Cursor: s.Cursor},
		Result:  s.Result, Effects: utcEffects(s.Effects), Reason: s.Reason, Version: s.Version,
		Retry: s.Spec.Retry, Attempt: s.Attempt(), MaxAttempts: s.MaxAttempts(), Attempts: []api.Attempt{},
	}
	for _, a := range s.Attempts() {
		t.Attempts = append(t.Attempts, api.Attempt{
			Attempt: a.Number, ExecutorID: a.ExecutorID, StartedAt: utc(a.StartedAt), EndedAt: utc(a.EndedAt), Outcome: a.Outcome, Error: a.Error,
		})
	}
	if s.Result != nil && len(s.Result.Effects) > 0 {
		r := *s.Result
		r.Effects = utcEffects(r.Effects)
		t.Result = &r
	}
	t.Message.CreatedAt = utc(t.Message.CreatedAt)
	if t.Message.Content == nil {
		t.Message.Content = []events.ContentPart{}
	}
	if s.Spec.Signal != (events.Signal{}) {
		sig := s.Spec.Signal
		t.Signal = &sig
	}
	if s.Delivery.ID != "" {
		t.Delivery = &api.Delivery{ID: s.Delivery.ID, Attempt: s.Delivery.Attempt}
	}
	if s.Claim.DeliveryID != "" {
		t.Claim = &api.Claim{DeliveryID: s.Claim.DeliveryID, ExecutorID: s.Claim.ExecutorID, HeartbeatSeconds: s.Claim.HeartbeatSeconds}
	}
	if s.Status.Terminal() {
		t.Deadline = time.Time{}
	}
	if c := s.Spec.Concurrency; c != nil {
		cc := *c
		t.Concurrency = &cc
		if s.WaitsForSlot(time.Now()) {
			t.WaitingFor = api.WaitingForConcurrency
		}
	}
	return t
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// utcEffects returns a copy of effects with their times in UTC, nil for
// none.
func utcEffects(effects []events.Effect) []events.Effect {
	if len(effects) == 0 {
		return nil
	}
	out := make([]events.Effect, len(effects))
	for i, e := range effects {
		e.At = utc(e.At)
		out[i] = e
	}
	return out
}

func newMailItems(items []service.MailItem) []api.MailItem {
	out := make([]api.MailItem, len(items))
	for i, m := range items {
		out[i] = api.MailItem{ID: m.Message.ID, Index: m.Index, CreatedAt: utc(m.Message.CreatedAt), Content: m.Message.Content}
		if out[i].Content == nil {
			out[i].Content = []events.ContentPart{}
		}
	}
	return out
}

func newTree(n service.Node) api.Tree {
	t := api.Tree{Task: NewTask(n.Task), Children: make([]api.Tree, len(n.Children))}
	for i, c := range n.Children {
		t.Children[i] = newTree(c)
	}
	return t
}

// concurrency answers GET /v1/concurrency?key=&customerId=: the key's
// holders and waiters, for the caller's customer (the operator may name
// one).
func (h *handler) concurrency(w http.ResponseWriter, r *http.Request, p service.Principal) {
	q := r.URL.Query()
	kv, err := h.Service.Concurrency(p, q.Get("customerId"), q.Get("key"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NewConcurrencyKey(kv))
}

// NewConcurrencyKey renders a concurrency key as the API resource.
func NewConcurrencyKey(kv service.KeyView) api.ConcurrencyKey {
	slotter := func(s aggregate.State) api.KeySlotter {
		k := api.KeySlotter{TaskID: s.TaskID, Status: string(s.Status), RunAt: utc(s.Spec.RunAt)}
		if c := s.Spec.Concurrency; c != nil {
			k.Limit = c.Limit
		}
		return k
	}
	out := api.ConcurrencyKey{CustomerID: kv.CustomerID, Key: kv.Key, Holders: []api.KeySlotter{}, Waiters: []api.KeySlotter{}}
	for _, s := range kv.Holders {
		out.Holders = append(out.Holders, slotter(s))
	}
	for _, s := range kv.Waiters {
		out.Waiters = append(out.Waiters, slotter(s))
	}
	return out
}
