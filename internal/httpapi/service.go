package httpapi

import (
	"context"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/api"
	"github.com/taskledger/taskledger/events"
	"github.com/taskledger/taskledger/internal/service"
)

// Service is what the HTTP API and Local call: the service layer
// (internal/scheduler's *Service), by noun. Its methods are safe for
// concurrent use; ctx bounds each call (and ends a stream); they fail
// with the aggregate's errors and internal/service's, which wireError
// maps to the wire's.
type Service interface {
	Tasks
	Claims
	Mailboxes
	Runs
	Schedules
	EventFeed
	Statistics
}

// Tasks schedules, reads, lists and ends tasks.
type Tasks interface {
	Schedule(ctx context.Context, p service.Principal, req service.ScheduleRequest) (st aggregate.State, created bool, err error)
	ScheduleBatch(ctx context.Context, p service.Principal, reqs []service.ScheduleRequest) ([]service.Outcome, error)
	RetryTask(ctx context.Context, p service.Principal, id string, req service.RetryTaskRequest) (st aggregate.State, created bool, err error)
	Get(ctx context.Context, p service.Principal, id string) (aggregate.State, error)
	List(ctx context.Context, p service.Principal, f service.TaskFilter, after string, limit int) ([]aggregate.State, string, error)
	RequestFilter(p service.Principal, f service.TaskFilter, requestID string) (service.TaskFilter, error)
	Tree(ctx context.Context, p service.Principal, id string) (service.Node, error)
	Cancel(ctx context.Context, p service.Principal, id, reason string) (aggregate.State, error)
	Concurrency(p service.Principal, customerID, key string) (service.KeyView, error)
	Timeline(ctx context.Context, p service.Principal, id string) ([]api.Event, error)
	LineageTimeline(ctx context.Context, p service.Principal, id string) ([]api.Event, error)
}

// Claims hands tasks to executors and records what they report.
type Claims interface {
	Claim(ctx context.Context, p service.Principal, id, deliveryID, executorID string, opts ...service.ClaimOption) (aggregate.State, error)
	ClaimNext(ctx context.Context, p service.Principal, queue, executorID string, wait time.Duration, opts ...service.ClaimOption) (st aggregate.State, ok bool, err error)
	ClaimBatch(ctx context.Context, p service.Principal, queue, executorID string, limit int, wait time.Duration, opts ...service.ClaimOption) ([]aggregate.State, error)
	Heartbeat(ctx context.Context, p service.Principal, id, deliveryID string) (service.Renewal, error)
	Release(ctx context.Context, p service.Principal, id, deliveryID, reason string) (aggregate.State, error)
	RecordResult(ctx context.Context, p service.Principal, id, deliveryID string, r events.Result) (aggregate.State, error)
	RecordResults(ctx context.Context, p service.Principal, items []service.ResultItem) ([]service.Outcome, error)
	ReportEffects(ctx context.Context, p service.Principal, id, deliveryID string, effects []events.Effect) (aggregate.State, error)
}

// Mailboxes holds a task's messages and its executor's stop checks.
type Mailboxes interface {
	AppendMail(ctx context.Context, p service.Principal, id string, msg events.Message) (string, int, error)
	Mailbox(ctx context.Context, p service.Principal, id string, after int) ([]service.MailItem, int, error)
	Check(ctx context.Context, p service.Principal, id, deliveryID string) (service.CheckResult, error)
}

// Runs keeps a running task's run document, its revisions, and its
// live stream.
type Runs interface {
	SaveRun(ctx context.Context, p service.Principal, id string, req service.RunSave) (service.Run, error)
	GetRun(ctx context.Context, p service.Principal, id string, revision uint64) (service.Run, error)
	Progress(ctx context.Context, p service.Principal, id string, req service.RunProgress) error
	FollowRun(ctx context.Context, p service.Principal, id string, after uint64, buffer int, fn func(service.RunItem) error) error
}

// Schedules creates, pages through, changes and fires schedules.
type Schedules interface {
	CreateSchedule(ctx context.Context, p service.Principal, req service.CreateScheduleRequest) (v service.ScheduleView, created bool, err error)
	GetSchedule(ctx context.Context, p service.Principal, customerID, id string) (service.ScheduleView, error)
	ListSchedules(p service.Principal, customerID, after string, limit int) (page []service.ScheduleView, next string, err error)
	ScheduleCursorValid(p service.Principal, customerID, after string) bool
	ScheduleAction(ctx context.Context, p service.Principal, customerID, id string, cmd aggregate.Command) (service.ScheduleView, error)
	TriggerSchedule(ctx context.Context, p service.Principal, customerID, id string) (aggregate.State, error)
	ScheduleTimeline(ctx context.Context, p service.Principal, customerID, id string) ([]api.Event, error)
}

// EventFeed reads the log's events as history entries: a customer's
// since a time, and the live stream from a cursor.
type EventFeed interface {
	CustomerTimeline(ctx context.Context, p service.Principal, customerID string, since time.Time, fn func(api.Event) error) error
	Stream(ctx context.Context, p service.Principal, f service.StreamFilter, after service.Cursor, fn func(api.Event, service.Cursor) error) error
	LiveCursor(ctx context.Context) (service.Cursor, error)
	ParseCursor(token string) (c service.Cursor, ok bool)
	CursorToken(c service.Cursor) string
	CursorForm() string
}

// Statistics counts what the views hold, for GET /v1/stats.
type Statistics interface {
	Stats(p service.Principal, maxRows int) service.Stats
	LastSeq(ctx context.Context) (uint64, error)
}
