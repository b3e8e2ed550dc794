package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskledger/taskledger/events"
)

// Client calls a taskledger server. It is safe for concurrent use.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080
	Token   string // bearer token; empty for a server without auth
	HTTP    *http.Client
	nats    *natsTransport // set by NewNATSClient: every call goes over NATS
}

// NewClient returns a client for baseURL with keep-alive connections.
func NewClient(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second},
	}}
}

// do sends body as JSON and decodes a 2xx answer into out. A non-2xx
// answer comes back as *Error, to be matched with errors.Is against the
// sentinels (ErrNotFound, ErrTerminal, …).
func (c *Client) do(ctx context.Context, method, path string, body, out any) (int, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return 0, err
		}
	}
	if c.nats != nil {
		status, data, err := c.nats.do(ctx, method, path, c.Token, b)
		if err != nil {
			return status, err
		}
		return status, decodeAnswer(method, path, status, data, out)
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, r)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	buf := answers.Get().(*bytes.Buffer)
	defer putAnswer(buf)
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, decodeAnswer(method, path, resp.StatusCode, buf.Bytes(), out)
}

// decodeAnswer decodes a 2xx answer's data into out, or returns the
// *Error of another.
func decodeAnswer(method, path string, status int, data []byte, out any) error {
	if status >= 300 {
		return decodeError(status, data)
	}
	if out != nil && status != http.StatusNoContent {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decoding %s %s answer: %w", method, path, err)
		}
	}
	return nil
}

// answers holds the buffers answers are read into before decoding (which
// copies what it keeps), so a busy client does not grow a new one each
// call.
var answers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putAnswer returns buf to the pool, unless a rare large answer grew it.
func putAnswer(buf *bytes.Buffer) {
	if buf.Cap() <= 1<<20 {
		buf.Reset()
		answers.Put(buf)
	}
}

// decodeError turns a non-2xx answer into *Error; a body that is not an
// API error (a proxy's page, say) keeps its text under code http_<status>.
func decodeError(status int, body []byte) *Error {
	e := &Error{Status: status}
	if json.Unmarshal(body, e) != nil || e.Code == "" {
		e.Code, e.Message = "http_"+strconv.Itoa(status), strings.TrimSpace(string(body))
	}
	return e
}

func taskPath(id string, rest ...string) string {
	return "/v1/tasks/" + url.PathEscape(id) + strings.Join(rest, "")
}

// Schedule creates a task; created is false when its requestId repeated.
func (c *Client) Schedule(ctx context.Context, req ScheduleRequest) (t Task, created bool, err error) {
	code, err := c.do(ctx, http.MethodPost, "/v1/tasks", req, &t)
	return t, code == http.StatusCreated, err
}

// Get returns a task.
func (c *Client) Get(ctx context.Context, id string) (t Task, err error) {
	_, err = c.do(ctx, http.MethodGet, taskPath(id), nil, &t)
	return t, err
}

// ListOptions filter GET /v1/tasks. Empty fields are left out.
type ListOptions struct {
	Status, Queue, CustomerID, RootID, After string
	// RequestID selects the task the caller's customer scheduled with
	// that request id.
	RequestID string
	// Labels select tasks carrying every pair (at most MaxLabelFilters).
	Labels map[string]string
	// Kind selects the tasks of that kind.
	Kind string
	// CreatedAfter and CreatedBefore bound the creation time, both
	// exclusive; zero is no bound.
	CreatedAfter, CreatedBefore time.Time
	Limit                       int
	// IDPrefix lists only the tasks whose id starts with it (up to
	// events.MaxIDLen characters of [A-Za-z0-9_-]).
	IDPrefix string
}

// List returns one page of tasks.
func (c *Client) List(ctx context.Context, o ListOptions) (l TaskList, err error) {
	q := url.Values{}
	for k, v := range map[string]string{"status": o.Status, "queue": o.Queue, "customerId": o.CustomerID, "rootId": o.RootID,
		"after": o.After, "requestId": o.RequestID, "idPrefix": o.IDPrefix, "kind": o.Kind} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(o.Labels)) {
		q.Add("label", k+"="+o.Labels[k])
	}
	for k, t := range map[string]time.Time{"createdAfter": o.CreatedAfter, "createdBefore": o.CreatedBefore} {
		if !t.IsZero() {
			q.Set(k, t.UTC().Format(time.RFC3339Nano))
		}
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	_, err = c.do(ctx, http.MethodGet, "/v1/tasks?"+q.Encode(), nil, &l)
	return l, err
}

// Concurrency returns the holders and waiters of a concurrency key of
// customerID ("" for the caller's own; only the operator may name
// another customer).
func (c *Client) Concurrency(ctx context.Context, key, customerID string) (k ConcurrencyKey, err error) {
	q := url.Values{"key": {key}}
	if customerID != "" {
		q.Set("customerId", customerID)
	}
	_, err = c.do(ctx, http.MethodGet, "/v1/concurrency?"+q.Encode(), nil, &k)
	return k, err
}

// RetryTask schedules a new task repeating the terminal task id (POST
// /v1/tasks/{id}/retry). created is false when r's RequestID named a task
// made before, which comes back then. A live task is ErrNotTerminal.
func (c *Client) RetryTask(ctx context.Context, id string, r RetryTaskRequest) (t Task, created bool, err error) {
	code, err := c.do(ctx, http.MethodPost, taskPath(id, "/retry"), r, &t)
	return t, code == http.StatusCreated, err
}

// Claim consumes deliveryID for executorID, with heartbeats if opts say
// so (WithHeartbeat).
func (c *Client) Claim(ctx context.Context, id, deliveryID, executorID string, opts ...ClaimOption) (t Task, err error) {
	req := ClaimRequest{DeliveryID: deliveryID, ExecutorID: executorID, HeartbeatSeconds: Claiming(opts).HeartbeatSeconds}
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/claim"), req, &t)
	return t, err
}

// ClaimNext long-polls queue for up to wait; ok is false when nothing was
// ready in time. opts may give the claim heartbeats (WithHeartbeat).
func (c *Client) ClaimNext(ctx context.Context, queue, executorID string, wait time.Duration, opts ...ClaimOption) (t Task, ok bool, err error) {
	req := ClaimNextRequest{Queue: queue, ExecutorID: executorID, WaitSeconds: wait.Seconds(), HeartbeatSeconds: Claiming(opts).HeartbeatSeconds}
	code, err := c.do(ctx, http.MethodPost, "/v1/claims/next", req, &t)
	return t, code == http.StatusOK, err
}

// Heartbeat renews the heartbeat of task id's claim under deliveryID
// (POST /v1/tasks/{id}/heartbeat); the answer says until when it is
// held. ErrClaimLost: the claim was lost (a missed heartbeat) or
// released, and another executor may hold the task: stop working on it.
func (c *Client) Heartbeat(ctx context.Context, id, deliveryID string) (r Renewal, err error) {
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/heartbeat"), HeartbeatRequest{DeliveryID: deliveryID}, &r)
	return r, err
}

// Release hands task id's claim under deliveryID back at once (POST
// /v1/tasks/{id}/release), reason saying why (at most 1 KiB): the task is
// claimable again, by any executor, and the attempt is not charged
// against its retry policy. For a graceful shutdown.
func (c *Client) Release(ctx context.Context, id, deliveryID, reason string) (t Task, err error) {
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/release"), ReleaseRequest{DeliveryID: deliveryID, Reason: reason}, &t)
	return t, err
}

// ClaimBatch long-polls queue for up to wait and claims up to max (1 to
// MaxBatchItems) of the tasks ready then; none when nothing was ready in
// time.
func (c *Client) ClaimBatch(ctx context.Context, queue, executorID string, max int, wait time.Duration, opts ...ClaimOption) ([]Task, error) {
	var out ClaimedTasks
	req := ClaimBatchRequest{Queue: queue, ExecutorID: executorID, Max: max, WaitSeconds: wait.Seconds(), HeartbeatSeconds: Claiming(opts).HeartbeatSeconds}
	_, err := c.do(ctx, http.MethodPost, "/v1/claims", req, &out)
	return out.Tasks, err
}

// ScheduleBatch schedules each request as its own task (1 to
// MaxBatchItems). Items answer in request order; test each with
// BatchItem.Err. A repeated requestId answers 200 with the existing task.
func (c *Client) ScheduleBatch(ctx context.Context, reqs []ScheduleRequest) ([]BatchItem, error) {
	var out BatchAnswer
	_, err := c.do(ctx, http.MethodPost, "/v1/tasks/batch", BatchScheduleRequest{Tasks: reqs}, &out)
	return out.Results, err
}

// RecordResults reports several results (1 to MaxBatchItems). Items
// answer in request order; test each with BatchItem.Err.
func (c *Client) RecordResults(ctx context.Context, items []ResultItem) ([]BatchItem, error) {
	var out BatchAnswer
	_, err := c.do(ctx, http.MethodPost, "/v1/results", ResultsRequest{Results: items}, &out)
	return out.Results, err
}

// Check asks whether to stop and returns the mailbox messages after the
// scheduler's cursor. With deliveryID, the running claim's token, the
// claim holder consumes them (the cursor moves past them); with "" (a
// monitor) or any other token it only peeks.
func (c *Client) Check(ctx context.Context, id, deliveryID string) (ch Check, err error) {
	var body any
	if deliveryID != "" {
		body = CheckRequest{DeliveryID: deliveryID}
	}
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/check"), body, &ch)
	return ch, err
}

// RecordResult reports a task's result.
func (c *Client) RecordResult(ctx context.Context, id string, r ResultRequest) (t Task, err error) {
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/result"), r, &t)
	return t, err
}

// Cancel cancels a task.
func (c *Client) Cancel(ctx context.Context, id, reason string) (t Task, err error) {
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/cancel"), CancelRequest{Reason: reason}, &t)
	return t, err
}

// AppendMail adds a message to a task's mailbox.
func (c *Client) AppendMail(ctx context.Context, id string, m events.Message) (a MailAccepted, err error) {
	_, err = c.do(ctx, http.MethodPost, taskPath(id, "/mailbox"), MailRequest{Message: m}, &a)
	return a, err
}

// Mailbox reads messages with index > after without moving the cursor.
func (c *Client) Mailbox(ctx context.Context, id string, after int) (m Mail, err error) {
	_, err = c.do(ctx, http.MethodGet, taskPath(id, "/mailbox?after="+strconv.Itoa(after)), nil, &m)
	return m, err
}

// History returns a task's events in log order.
func (c *Client) History(ctx context.Context, id string) (h History, err error) {
	_, err = c.do(ctx, http.MethodGet, taskPath(id, "/history"), nil, &h)
	return h, err
}

// LineageHistory returns the events of a task's root and all its
// descendants, interleaved in log order.
func (c *Client) LineageHistory(ctx context.Context, id string) (h History, err error) {
	_, err = c.do(ctx, http.MethodGet, taskPath(id, "/history?tree=1"), nil, &h)
	return h, err
}

// Tree returns the lineage of a task from its root.
func (c *Client) Tree(ctx context.Context, id string) (t Tree, err error) {
	_, err = c.do(ctx, http.MethodGet, taskPath(id, "/tree"), nil, &t)
	return t, err
}

// CustomerEvents streams a customer's events stored at or after since
// (zero: all), calling fn for each in log order.
func (c *Client) CustomerEvents(ctx context.Context, customerID string, since time.Time, fn func(Event) error) error {
	q := url.Values{"customerId": {customerID}}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	resp, err := c.open(ctx, "/v1/events?"+q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var e Event
		if err := dec.Decode(&e); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// open sends a GET of path and returns its 200 answer for the caller to
// read and close; another status comes back as *Error.
func (c *Client) open(ctx context.Context, path string) (*http.Response, error) {
	if c.nats != nil {
		return nil, ErrHTTPOnly
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+path, nil)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, decodeError(resp.StatusCode, data)
	}
	return resp, nil
}

// GetRunJSON returns a task's Run document as the server sent it, with
// the fields of its run that RunState does not know (GetRun drops them);
// ErrNotFound before the first save.
func (c *Client) GetRunJSON(ctx context.Context, id string) (json.RawMessage, error) {
	var d json.RawMessage
	_, err := c.do(ctx, http.MethodGet, taskPath(id, "/run"), nil, &d)
	return d, err
}
