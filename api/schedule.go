package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/taskledger/taskledger/events"
)

// ErrScheduleLimit (409): the customer already has as many live schedules
// as the server allows (--max-schedules).
var ErrScheduleLimit = &Error{Status: http.StatusConflict, Code: "conflict", Reason: "schedule_limit", Message: "schedule limit reached"}

// ScheduleTask is the task each run of a schedule schedules: the fields of
// POST /v1/tasks that a periodic task may set, with their rules there.
// Every run's task gets the same labels, retry policy and concurrency. In
// the schedule resource Retry has every field set (the defaults filled in).
type ScheduleTask struct {
	Queue          string              `json:"queue,omitempty"`
	Message        events.Message      `json:"message"`
	Repo           string              `json:"repo,omitempty"`
	Signal         events.Signal       `json:"signal"`
	TimeoutSeconds *int                `json:"timeoutSeconds,omitempty"`
	Labels         map[string]string   `json:"labels,omitempty"`
	Retry          *RetryRequest       `json:"retry,omitempty"`
	Concurrency    *events.Concurrency `json:"concurrency,omitempty"`
	// Kind and Payload are every run's task's, as in ScheduleRequest.
	Kind    string          `json:"kind,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// ScheduleCreateRequest is the body of POST /v1/schedules. Exactly one of
// Cron and Every is given.
type ScheduleCreateRequest struct {
	ID         string       `json:"id"`
	CustomerID string       `json:"customerId,omitempty"`
	Cron       string       `json:"cron,omitempty"`
	Every      string       `json:"every,omitempty"`
	Timezone   string       `json:"timezone,omitempty"`
	Task       ScheduleTask `json:"task"`
	Overlap    string       `json:"overlap,omitempty"`
	Catchup    string       `json:"catchup,omitempty"`
	Paused     bool         `json:"paused,omitempty"`
}

// Schedule is the schedule resource.
type Schedule struct {
	ID         string       `json:"id"`
	CustomerID string       `json:"customerId"`
	Cron       string       `json:"cron,omitempty"`
	Every      string       `json:"every,omitempty"`
	Timezone   string       `json:"timezone"`
	Task       ScheduleTask `json:"task"`
	Overlap    string       `json:"overlap"`
	Catchup    string       `json:"catchup"`
	Paused     bool         `json:"paused"`
	Deleted    bool         `json:"deleted"`
	CreatedAt  time.Time    `json:"createdAt"`
	UpdatedAt  time.Time    `json:"updatedAt,omitzero"`
	// Next are the next instants due (at most 5; none while paused or
	// deleted).
	Next []time.Time `json:"next"`
	// Runs are the last fires (at most 20), newest first.
	Runs []ScheduleRun `json:"runs"`
	// RunCount counts the fires that made a task.
	RunCount int `json:"runCount"`
	Version  int `json:"version"`
}

// ScheduleRun is one fire of a schedule.
type ScheduleRun struct {
	// At is the instant fired (for a trigger, when it was triggered).
	At time.Time `json:"at"`
	// TaskID and RequestID name the run's task; empty for a skip.
	TaskID    string `json:"taskId,omitempty"`
	RequestID string `json:"requestId,omitempty"`
	// Status is the task's ("" while the server has not seen it).
	Status string `json:"status,omitempty"`
	// Skipped is "overlap" or "missed" for an instant that made no task.
	Skipped string `json:"skipped,omitempty"`
	// Missed counts the earlier instants this fire passed over.
	Missed int  `json:"missed,omitempty"`
	Manual bool `json:"manual,omitempty"`
}

// ScheduleList is the answer of GET /v1/schedules.
type ScheduleList struct {
	Schedules []Schedule `json:"schedules"`
	Next      string     `json:"next,omitempty"`
}

// ScheduleOptions are the customer (operators only; default "default")
// of the schedule routes by id.
type ScheduleOptions struct {
	CustomerID string
}

func schedulePath(id, suffix string, o ScheduleOptions) string {
	p := "/v1/schedules/" + url.PathEscape(id) + suffix
	if o.CustomerID != "" {
		p += "?customerId=" + url.QueryEscape(o.CustomerID)
	}
	return p
}

// CreateSchedule creates a schedule, or changes a live one with the same
// id; created is false then (200).
func (c *Client) CreateSchedule(ctx context.Context, req ScheduleCreateRequest) (s Schedule, created bool, err error) {
	code, err := c.do(ctx, http.MethodPost, "/v1/schedules", req, &s)
	return s, code == http.StatusCreated, err
}

// GetSchedule returns a schedule, a deleted one too.
func (c *Client) GetSchedule(ctx context.Context, id string, o ScheduleOptions) (s Schedule, err error) {
	_, err = c.do(ctx, http.MethodGet, schedulePath(id, "", o), nil, &s)
	return s, err
}

// ListSchedules returns a page of live schedules: the customer's (an
// operator's: customerID's, or every customer's when empty), after the
// cursor after, at most limit (0: the server's default).
func (c *Client) ListSchedules(ctx context.Context, customerID, after string, limit int) (l ScheduleList, err error) {
	q := url.Values{}
	if customerID != "" {
		q.Set("customerId", customerID)
	}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	p := "/v1/schedules"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	_, err = c.do(ctx, http.MethodGet, p, nil, &l)
	return l, err
}

// PauseSchedule stops a schedule firing.
func (c *Client) PauseSchedule(ctx context.Context, id string, o ScheduleOptions) (s Schedule, err error) {
	_, err = c.do(ctx, http.MethodPost, schedulePath(id, "/pause", o), nil, &s)
	return s, err
}

// ResumeSchedule lets a paused schedule fire again from now.
func (c *Client) ResumeSchedule(ctx context.Context, id string, o ScheduleOptions) (s Schedule, err error) {
	_, err = c.do(ctx, http.MethodPost, schedulePath(id, "/resume", o), nil, &s)
	return s, err
}

// TriggerSchedule makes a run now and returns its task.
func (c *Client) TriggerSchedule(ctx context.Context, id string, o ScheduleOptions) (t Task, err error) {
	_, err = c.do(ctx, http.MethodPost, schedulePath(id, "/trigger", o), nil, &t)
	return t, err
}

// DeleteSchedule stops a schedule for good; its history is kept.
func (c *Client) DeleteSchedule(ctx context.Context, id string, o ScheduleOptions) (s Schedule, err error) {
	_, err = c.do(ctx, http.MethodDelete, schedulePath(id, "", o), nil, &s)
	return s, err
}

// ScheduleHistory returns every event of a schedule.
func (c *Client) ScheduleHistory(ctx context.Context, id string, o ScheduleOptions) (h History, err error) {
	_, err = c.do(ctx, http.MethodGet, schedulePath(id, "/history", o), nil, &h)
	return h, err
}
