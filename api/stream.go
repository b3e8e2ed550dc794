package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Bounds of GET /v1/events/stream.
const (
	// MaxStreamFilterValues bounds the values of each filter of a stream
	// (taskId, rootId, queue, type), repeated or comma separated.
	MaxStreamFilterValues = 16
	// StreamOverflowEvent is the SSE event name of the last message of a
	// stream the server dropped because its client read too slowly.
	StreamOverflowEvent = "overflow"
)

// StreamFilter selects the events of GET /v1/events/stream. Each field
// is a list of alternatives (at most MaxStreamFilterValues); the fields
// combine: an event is sent when it matches every non-empty field. Empty
// fields select every event the caller may see.
type StreamFilter struct {
	TaskIDs []string // the events of these tasks
	RootIDs []string // the events of the tasks of these lineages
	Queues  []string // the events of the tasks on these queues
	Types   []string // events of these types (TaskScheduled, Claimed, ...)
}

// StreamOverflow is the data of the final `overflow` message of a stream
// the server dropped because its client fell too far behind: reconnect
// with Cursor, or without one After (as Last-Event-ID or ?after=), to go
// on without a gap.
type StreamOverflow struct {
	// After is the sequence of the last event sent (0, left out, for a
	// customer token, which reconnects with Cursor).
	After  uint64 `json:"after,omitempty"`
	Reason string `json:"reason"`
	// Cursor is the resume token to reconnect with: for a customer
	// token always (opaque), for the operator on a sharded log (After
	// then names one shard's position only); left out for the operator
	// with one shard.
	Cursor string `json:"cursor,omitempty"`
}

// Stats is the answer of GET /v1/stats: the process's view of the log and
// one row per customer and queue the caller may see.
type Stats struct {
	At time.Time `json:"at"` // when the statistics were read
	// Applied is the last log sequence the projections folded in; LastSeq
	// the log's last sequence; Lag the events between them.
	Applied  uint64 `json:"applied"`
	LastSeq  uint64 `json:"lastSeq"`
	Lag      uint64 `json:"lag"`
	CaughtUp bool   `json:"caughtUp"`
	// Queues is one row per customer and queue, ordered by customer then
	// queue.
	Queues []QueueStats `json:"queues"`
	// Alarm is how late the alarm acted on its timers lately.
	Alarm AlarmStats `json:"alarm"`
	// Keys is one row per concurrency key with a task holding or
	// waiting for a slot, ordered by customer then key: at most
	// MaxStatsRows, KeysTruncated set when there were more.
	Keys          []KeyStats `json:"keys"`
	KeysTruncated bool       `json:"keysTruncated,omitempty"`
	// Schedules is one row per live schedule, ordered by customer then
	// id: at most MaxStatsRows, SchedulesTruncated set when there were
	// more.
	Schedules          []ScheduleStats `json:"schedules"`
	SchedulesTruncated bool            `json:"schedulesTruncated,omitempty"`
	// Partitions is the timer partitions this process holds a lease on;
	// absent on a process that holds no leases (it acts on every timer).
	Partitions *PartitionStats `json:"partitions,omitempty"`
	// Epochs is the log's epoch slots; absent for a log without epochs.
	Epochs *EpochStats `json:"epochs,omitempty"`
	// Quarantine is the log's quarantined messages, to an operator only;
	// absent for a customer's token.
	Quarantine *QuarantineStats `json:"quarantine,omitempty"`
}

// QuarantineStats is what the projections met on the log that does not
// decode (GET /v1/stats and /readyz?digest=1, operator only): Count such
// messages, and the first MaxQuarantined of them by position. The
// messages stay on the log (its stream denies deletes); taskledger
// replay quarantine lists them all with their subjects.
type QuarantineStats struct {
	Count     uint64             `json:"count"`
	Sequences []QuarantinedEntry `json:"sequences"`
}

// QuarantinedEntry is one quarantined message: its log position and why
// it does not decode.
type QuarantinedEntry struct {
	Seq    uint64 `json:"seq"`
	Reason string `json:"reason"`
}

// MaxQuarantined is how many quarantined messages QuarantineStats lists.
const MaxQuarantined = 100

// EventQuarantined is the type of the marker entry that stands, in GET
// /v1/events and the event stream, for a message of the log that does
// not decode: its seq is the message's, its taskId the task its subject
// names, its status empty, and its data a QuarantinedData. The feed goes
// on after it.
const EventQuarantined = "Quarantined"

// QuarantinedData is the data of an EventQuarantined marker: why the
// message does not decode.
type QuarantinedData struct {
	Reason string `json:"reason"`
}

// EpochStats is the epoch slots of a log created with epochs, as this
// process last read them (docs/DESIGN.md, "Epochs"): the period, the
// slot new lineages start in, every slot, and the epochs removed, oldest
// first. The log's, the same for every caller.
type EpochStats struct {
	PeriodSeconds float64     `json:"periodSeconds"`
	Current       int         `json:"current"`
	Slots         []EpochSlot `json:"slots"`
	Removed       []int64     `json:"removed"`
}

// EpochSlot is one epoch slot: its epoch (the period number, Unix time
// divided by the period) with the period's start and end, and its state
// (open, sealed or free: a free slot has no epoch). Opened and Sealed
// are when that happened.
type EpochSlot struct {
	Slot   int        `json:"slot"`
	State  string     `json:"state"`
	Epoch  *int64     `json:"epoch,omitempty"`
	Start  *time.Time `json:"start,omitempty"`
	End    *time.Time `json:"end,omitempty"`
	Opened *time.Time `json:"opened,omitempty"`
	Sealed *time.Time `json:"sealed,omitempty"`
}

// PartitionStats is which of the Count timer partitions this process
// holds a lease on, and so acts on (releases, deliveries, timeouts,
// child reports, republishes, slot releases, schedule fires): Owned, in
// order, empty while it holds none. Instance names the process in the
// lease bucket; LeaseTTLSeconds is the leases' lifetime unrenewed. It is
// the process's, the same for every caller.
type PartitionStats struct {
	Count           int     `json:"count"`
	Owned           []int   `json:"owned"`
	Instance        string  `json:"instance"`
	LeaseTTLSeconds float64 `json:"leaseTtlSeconds"`
}

// MaxStatsRows bounds the keys and the schedules of one Stats answer.
const MaxStatsRows = 1000

// AlarmStats is the lateness of the alarm's actions (releases,
// deliveries, timeouts, child reports, republishes, slot releases,
// schedule fires) over the last 5 minutes, from the last 256 actions of
// each timer queue this process kept: over every queue, and per queue
// (by name; a queue with no action in the window is left out). It is
// the process's, the same for every caller.
type AlarmStats struct {
	Lateness Lateness            `json:"lateness"`
	Timers   map[string]Lateness `json:"timers"`
}

// Lateness is how late after their due time some actions ran: their
// count, the median, the 99th percentile (nearest rank) and the most.
// All are 0 with no samples.
type Lateness struct {
	Samples    int     `json:"samples"`
	P50Seconds float64 `json:"p50Seconds"`
	P99Seconds float64 `json:"p99Seconds"`
	MaxSeconds float64 `json:"maxSeconds"`
}

// KeyStats is one concurrency key (GET /v1/concurrency lists its tasks).
type KeyStats struct {
	CustomerID string `json:"customerId"`
	Key        string `json:"key"`
	// Limit is the concurrency limit of the key's tasks (of the first
	// holder, else of a waiting task: the tasks of a key normally agree).
	Limit int `json:"limit"`
	// Holders counts the tasks holding a slot (a finished one until the
	// alarm releases its slot).
	Holders int `json:"holders"`
	// Waiting counts the key's unfinished tasks that hold no slot: those
	// due wait for one, the others for their runAt.
	Waiting int `json:"waiting"`
}

// ScheduleStats is one live schedule (GET /v1/schedules/{id} has the
// rest).
type ScheduleStats struct {
	CustomerID string `json:"customerId"`
	ID         string `json:"id"`
	Paused     bool   `json:"paused"`
	// Next is the next instant due; left out while paused.
	Next time.Time `json:"next,omitzero"`
	// LastRun is the latest fire that made a task (a trigger too), with
	// the task's status ("" while the server has not seen it); left out
	// before the first.
	LastRun *ScheduleRun `json:"lastRun,omitempty"`
	// RunCount counts the fires that made a task.
	RunCount int `json:"runCount"`
}

// QueueStats are one customer's statistics on one queue, as the
// projections hold them (a finished lineage evicted by retention no
// longer counts).
type QueueStats struct {
	CustomerID string `json:"customerId"`
	Queue      string `json:"queue"`
	// Counts is the number of tasks per status; a status with none is
	// left out.
	Counts map[string]int `json:"counts"`
	// OldestQueuedSeconds is how long the queued task published longest
	// ago has been waiting for a claim; 0 with none queued.
	OldestQueuedSeconds float64 `json:"oldestQueuedSeconds"`
	Claims              Rate    `json:"claims"`  // Claimed events per second
	Results             Rate    `json:"results"` // ResultRecorded events per second
	// NearTimeout counts the running tasks past 80 % of their timeout.
	NearTimeout int `json:"nearTimeout"`
	// Retries counts the failed ready publishes being retried: the
	// current delivery attempts past the first of the tasks held.
	Retries int `json:"retries"`
	// Rejections counts the tasks admission refused.
	Rejections int `json:"rejections"`
}

// Rate is an event rate per second over the last 1 and 5 minutes of
// event time, counted since the process started (or rebuilt its
// projections).
type Rate struct {
	Last1m float64 `json:"last1m"`
	Last5m float64 `json:"last5m"`
}

// ErrStreamEnded is returned (wrapped) by Client.Stream when the server
// ended the stream other than by an overflow (it shut down, say): resume
// after the last event fn got.
var ErrStreamEnded = errors.New("api: event stream ended")

// maxStreamLine bounds one line of an event stream the client reads: an
// event is at most the NATS max payload (1 MiB by default) as JSON.
const maxStreamLine = 8 << 20

// Query returns f as the query parameters of GET /v1/events/stream.
func (f StreamFilter) Query() url.Values {
	q := url.Values{}
	for name, vs := range map[string][]string{"taskId": f.TaskIDs, "rootId": f.RootIDs, "queue": f.Queues, "type": f.Types} {
		if len(vs) > 0 {
			q.Set(name, strings.Join(vs, ","))
		}
	}
	return q
}

// Stats returns the statistics of GET /v1/stats.
func (c *Client) Stats(ctx context.Context) (s Stats, err error) {
	_, err = c.do(ctx, http.MethodGet, "/v1/stats", nil, &s)
	return s, err
}

// Stream follows GET /v1/events/stream from the first event after
// sequence after (0 with the log empty or to start at its beginning; a
// customer token may give only 0, and resumes with StreamAfter and an
// event's Cursor, its events having no Seq), calling fn
// for each event in log order. When the server drops the stream for
// reading too slowly, Stream reconnects after the last event fn got, so
// fn sees every event once. It returns fn's error, ctx.Err() once ctx
// ends, ErrStreamEnded (wrapped) when the server ends the stream
// otherwise, or the server's *Error.
func (c *Client) Stream(ctx context.Context, f StreamFilter, after uint64, fn func(Event) error) error {
	return c.stream(ctx, f, streamAt{seq: after}, fn)
}

// StreamAfter is Stream from the resume token after: a stream sequence,
// or on a sharded log (and always for a customer token, whose tokens are
// opaque) an event's Cursor (docs/API.md, "Live event stream"), "0" for
// the start.
func (c *Client) StreamAfter(ctx context.Context, f StreamFilter, after string, fn func(Event) error) error {
	return c.stream(ctx, f, streamAt{cursor: after}, fn)
}

// stream is Stream from at.
func (c *Client) stream(ctx context.Context, f StreamFilter, at streamAt, fn func(Event) error) error {
	for {
		overflow, err := c.streamOnce(ctx, f, &at, fn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		if !overflow {
			return fmt.Errorf("%w after %s", ErrStreamEnded, at.token())
		}
	}
}

// streamAt is where a stream client stands: the sequence of the last
// event it got, or on a sharded log the server's resume token.
type streamAt struct {
	seq    uint64
	cursor string
}

// token returns the after parameter that resumes from at.
func (at streamAt) token() string {
	if at.cursor != "" {
		return at.cursor
	}
	return strconv.FormatUint(at.seq, 10)
}

// streamOnce reads one connection of a stream, moving *after past each
// event fn got, and reports whether it ended with an overflow.
func (c *Client) streamOnce(ctx context.Context, f StreamFilter, after *streamAt, fn func(Event) error) (overflow bool, err error) {
	q := f.Query()
	q.Set("after", after.token())
	resp, err := c.open(ctx, "/v1/events/stream?"+q.Encode())
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, maxStreamLine)
	var event, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data == "" {
				continue
			}
			if event == StreamOverflowEvent {
				var o StreamOverflow
				if err := json.Unmarshal([]byte(data), &o); err != nil {
					return false, fmt.Errorf("decoding overflow: %w", err)
				}
				if after.seq = max(after.seq, o.After); o.Cursor != "" {
					after.cursor = o.Cursor
				}
				return true, nil
			}
			var e Event
			if err := json.Unmarshal([]byte(data), &e); err != nil {
				return false, fmt.Errorf("decoding event: %w", err)
			}
			event, data = "", ""
			if err := fn(e); err != nil {
				return false, err
			}
			after.seq, after.cursor = e.Seq, e.Cursor
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		}
	}
	return false, sc.Err()
}
