// Package api is taskledger's HTTP transport (API.md) and its Go client.
package api

import (
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/scheduler"
	"github.com/taskledger/taskledger/replay"
)

// Task is the task resource of API.md.
type Task struct {
	ID             string         `json:"id"`
	RootID         string         `json:"rootId"`
	ParentID       string         `json:"parentId,omitempty"`
	RelatedTaskID  string         `json:"relatedTaskId,omitempty"`
	CustomerID     string         `json:"customerId"`
	RequestID      string         `json:"requestId,omitempty"`
	Queue          string         `json:"queue"`
	Signal         *events.Signal `json:"signal,omitempty"`
	Repo           string         `json:"repo,omitempty"`
	Message        events.Message `json:"message"`
	Status         string         `json:"status"`
	CreatedAt      time.Time      `json:"createdAt,omitzero"`
	RunAt          time.Time      `json:"runAt,omitzero"`
	StartedAt      time.Time      `json:"startedAt,omitzero"`
	CompletedAt    time.Time      `json:"completedAt,omitzero"`
	TimeoutSeconds int            `json:"timeoutSeconds"`
	Deadline       time.Time      `json:"deadline,omitzero"`
	Delivery       *Delivery      `json:"delivery,omitempty"`
	Claim          *Claim         `json:"claim,omitempty"`
	Mailbox        Mailbox        `json:"mailbox"`
	Result         *events.Result `json:"result,omitempty"`
	Reason         string         `json:"reason,omitempty"`
	Version        int            `json:"version"`
}

// Delivery is the task's current ready notification.
type Delivery struct {
	ID      string `json:"id"`
	Attempt int    `json:"attempt"`
}

// Claim says who consumed which delivery token.
type Claim struct {
	DeliveryID string `json:"deliveryId"`
	ExecutorID string `json:"executorId"`
}

// Mailbox counts a task's messages and the scheduler's read cursor.
type Mailbox struct {
	Count  int `json:"count"`
	Cursor int `json:"cursor"`
}

// NewTask renders a task's state as the API resource.
func NewTask(s aggregate.State) Task {
	t := Task{
		ID: s.TaskID, RootID: s.Spec.RootID, ParentID: s.Spec.ParentID, RelatedTaskID: s.Spec.RelatedTaskID,
		CustomerID: s.CustomerID, RequestID: s.Spec.RequestID, Queue: s.Spec.Queue,
		Repo: s.Spec.Repo, Message: s.Spec.Message, Status: string(s.Status),
		CreatedAt: utc(s.CreatedAt), RunAt: utc(s.Spec.RunAt), StartedAt: utc(s.StartedAt),
		CompletedAt: utc(s.CompletedAt), TimeoutSeconds: s.Spec.TimeoutSeconds, Deadline: utc(s.Deadline),
		Mailbox: Mailbox{Count: len(s.MailIDs), Cursor: s.Cursor},
		Result:  s.Result, Reason: s.Reason, Version: s.Version,
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
		t.Delivery = &Delivery{ID: s.Delivery.ID, Attempt: s.Delivery.Attempt}
	}
	if s.Claim.DeliveryID != "" {
		t.Claim = &Claim{DeliveryID: s.Claim.DeliveryID, ExecutorID: s.Claim.ExecutorID}
	}
	if s.Status.Terminal() {
		t.Deadline = time.Time{}
	}
	return t
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// TaskList is the answer of GET /v1/tasks.
type TaskList struct {
	Tasks []Task `json:"tasks"`
	Next  string `json:"next"`
}

// MailItem is one mailbox message as the API shows it.
type MailItem struct {
	ID        string               `json:"id"`
	Index     int                  `json:"index"`
	CreatedAt time.Time            `json:"createdAt"`
	Content   []events.ContentPart `json:"content"`
}

func newMailItems(items []scheduler.MailItem) []MailItem {
	out := make([]MailItem, len(items))
	for i, m := range items {
		out[i] = MailItem{ID: m.Message.ID, Index: m.Index, CreatedAt: utc(m.Message.CreatedAt), Content: m.Message.Content}
		if out[i].Content == nil {
			out[i].Content = []events.ContentPart{}
		}
	}
	return out
}

// Mail is the answer of GET /v1/tasks/{id}/mailbox.
type Mail struct {
	Messages []MailItem `json:"messages"`
	Cursor   int        `json:"cursor"`
}

// Check is the answer of POST /v1/tasks/{id}/check.
type Check struct {
	ShouldStop bool       `json:"shouldStop"`
	Reason     string     `json:"reason"`
	Messages   []MailItem `json:"messages"`
	Cursor     int        `json:"cursor"`
}

// MailAccepted is the answer of POST /v1/tasks/{id}/mailbox.
type MailAccepted struct {
	MessageID string `json:"messageId"`
	Index     int    `json:"index"`
}

// Event is one entry of a task's history: the logged event, plus the
// status it left its task in and a line saying what it meant.
type Event struct {
	Seq    uint64    `json:"seq"`
	ID     string    `json:"id"`
	TaskID string    `json:"taskId"`
	Type   string    `json:"type"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor,omitempty"`
	Status string    `json:"status"`
	Detail string    `json:"detail"`
	Data   any       `json:"data"`
}

// NewEvents renders logged events (of one task, or a lineage in log order).
func NewEvents(evs []events.Event) []Event {
	t := replay.NewStatusTracker()
	out := make([]Event, len(evs))
	for i, ev := range evs {
		out[i] = newEvent(ev, t.Entry(ev))
	}
	return out
}

func newEvent(ev events.Event, e replay.Entry) Event {
	return Event{Seq: e.Seq, ID: ev.ID, TaskID: e.TaskID, Type: e.Type, At: e.At, Actor: e.Actor, Status: e.Status, Detail: e.Detail, Data: e.Data}
}

// History is the answer of GET /v1/tasks/{id}/history.
type History struct {
	Events []Event `json:"events"`
}

// Tree is one node of GET /v1/tasks/{id}/tree.
type Tree struct {
	Task     Task   `json:"task"`
	Children []Tree `json:"children"`
}

func newTree(n scheduler.Node) Tree {
	t := Tree{Task: NewTask(n.Task), Children: make([]Tree, len(n.Children))}
	for i, c := range n.Children {
		t.Children[i] = newTree(c)
	}
	return t
}

// Error is the body of every non-2xx answer.
type Error struct {
	Code    string `json:"error"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
	Task    *Task  `json:"task,omitempty"`
	Status  int    `json:"-"`
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return e.Code + " (" + e.Reason + "): " + e.Message
	}
	return e.Code + ": " + e.Message
}
