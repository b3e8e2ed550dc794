package aggregate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"pgregory.net/rapid"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// The reference model below is written from the transition table and
// the API's error reasons (docs/DESIGN.md, docs/API.md). It deliberately uses nothing from package
// aggregate but its command types and error sentinels.

const (
	mScheduled = "scheduled"
	mQueued    = "queued"
	mRunning   = "running"
	mSucceeded = "succeeded"
	mFailed    = "failed"
	mCanceled  = "canceled"
	mTimedOut  = "timed_out"
)

func mTerminal(s string) bool {
	return s == mSucceeded || s == mFailed || s == mCanceled || s == mTimedOut
}

// legal is the table of allowed transitions, "" being no task.
var legal = map[string][]string{
	"":         {mScheduled, mCanceled},
	mScheduled: {mQueued, mRunning, mSucceeded, mFailed, mCanceled},
	mQueued:    {mRunning, mSucceeded, mFailed, mCanceled},
	mRunning:   {mScheduled, mSucceeded, mFailed, mCanceled, mTimedOut}, // scheduled: RetryScheduled
}

var (
	modelID     = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	modelDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// model is a task as the reference sees it.
type model struct {
	status         string // "" before the task exists
	taskID, custID string
	runAt          time.Time // when the current attempt is due
	timeout        time.Duration
	retry          *events.RetryPolicy
	run            int      // the task's attempt, from 1
	usedTokens     []string // the tokens of the attempts before run
	token          string   // current delivery token, "" until released
	attempt        int
	published      bool
	readySeq       uint64 // ready stream sequence of the last (re)publish
	consumed       bool   // a claim consumed token
	executor       string // the executor of the last claim
	checkFailedAt  time.Time
	deadline       time.Time
	mail           []string
	cursor         int
	effects        []events.Effect // reported so far, in first-report order
	heartbeat      int             // the running claim's heartbeatSeconds
	started        time.Time       // when the running claim was made
	lost           []string        // tokens of claims that ended in a ClaimLost
	released       int             // claims handed back
	runRevision    uint64          // the Run's latest saved revision
}

// actor is who the model expects an accepted cmd's event to name: the
// claim's executor for what its holder writes under its token, else
// nobody (the store names the caller).
func (m model) actor(cmd aggregate.Command) string {
	switch c := cmd.(type) {
	case aggregate.RecordResult:
		if c.DeliveryID != "" {
			return m.executor
		}
	case aggregate.ReportEffects, aggregate.SaveRun:
		return m.executor
	case aggregate.ReadMail:
		if c.DeliveryID != "" {
			return m.executor
		}
	}
	return ""
}

// decide returns the payload the model expects cmd to append (nil for an
// accepted no-op) or the expected error sentinel.
func (m model) decide(cmd aggregate.Command, now time.Time) (events.Payload, error) {
	switch c := cmd.(type) {
	case aggregate.Schedule:
		spec, err := m.admit(c.TaskID, c.CustomerID, c.Spec, now)
		if err != nil {
			return nil, err
		}
		return events.TaskScheduled{Spec: spec}, nil
	case aggregate.Reject:
		if len(c.Reason) > 1<<10 && m.status == "" { // before the spec, after the id's existence
			return nil, aggregate.ErrInvalid
		}
		spec, err := m.admit(c.TaskID, c.CustomerID, c.Spec, now)
		if err != nil {
			return nil, err
		}
		return events.AdmissionRejected{Spec: spec, Reason: c.Reason}, nil
	}
	if m.status == "" {
		return nil, aggregate.ErrNotFound
	}
	var writer string // the token an executor's write names
	switch c := cmd.(type) {
	case aggregate.RecordResult:
		writer = c.DeliveryID
	case aggregate.ReportEffects:
		writer = c.DeliveryID
	case aggregate.LoseClaim:
		writer = c.DeliveryID
	case aggregate.SaveRun:
		writer = c.DeliveryID
	}
	if writer != "" && slices.Contains(m.lost, writer) {
		return nil, aggregate.ErrClaimLost
	}
	switch c := cmd.(type) {
	case aggregate.AppendMail:
		switch {
		case slices.Contains(m.mail, c.Message.ID):
			return nil, nil
		case mTerminal(m.status):
			return nil, aggregate.ErrTerminal
		case !modelID.MatchString(c.Message.ID) || len(c.Message.Content) == 0 || !validContent(c.Message):
			return nil, aggregate.ErrInvalid
		}
		msg := c.Message
		if msg.CreatedAt.IsZero() {
			msg.CreatedAt = now
		}
		return events.MailboxAppended{Index: len(m.mail) + 1, Message: msg}, nil
	case aggregate.ReadMail:
		switch {
		case c.DeliveryID != "" && (m.status != mRunning || c.DeliveryID != m.token):
			return nil, aggregate.ErrTokenMismatch
		case c.Cursor > len(m.mail):
			return nil, aggregate.ErrInvalid
		case c.Cursor <= m.cursor:
			return nil, nil
		}
		return events.MailboxRead{Cursor: c.Cursor}, nil
	case aggregate.Claim:
		switch {
		case m.status != mScheduled && m.status != mQueued || m.token == "":
			return nil, aggregate.ErrNotClaimable
		case c.DeliveryID != m.token:
			return nil, aggregate.ErrTokenMismatch
		case !modelID.MatchString(c.ExecutorID), c.HeartbeatSeconds < 0 || c.HeartbeatSeconds > 3600:
			return nil, aggregate.ErrInvalid
		}
		return events.Claimed{DeliveryID: c.DeliveryID, ExecutorID: c.ExecutorID, Deadline: now.Add(m.timeout), HeartbeatSeconds: c.HeartbeatSeconds}, nil
	case aggregate.CancelForAncestor: // in place of a claim (a token) or a release (none)
		switch {
		case c.DeliveryID != "" && (m.status != mScheduled && m.status != mQueued || m.token == ""):
			return nil, aggregate.ErrNotClaimable
		case c.DeliveryID != "" && c.DeliveryID != m.token:
			return nil, aggregate.ErrTokenMismatch
		case c.DeliveryID == "" && mTerminal(m.status):
			return nil, aggregate.ErrTerminal
		case c.DeliveryID == "" && (m.status != mScheduled || m.token != ""):
			return nil, aggregate.ErrStale
		}
		return events.Canceled{Reason: "ancestor_terminal"}, nil
	}
	if mTerminal(m.status) {
		return nil, aggregate.ErrTerminal
	}
	pending := func(id string) bool {
		return m.status == mScheduled && m.token != "" && id == m.token && !m.published
	}
	switch c := cmd.(type) {
	case aggregate.RecordCheckFailed:
		switch {
		case c.Failures < 1 || len(c.Error) > 16<<10:
			return nil, aggregate.ErrInvalid
		case !m.checkFailedAt.IsZero() && now.Sub(m.checkFailedAt) < time.Minute:
			return nil, nil
		}
		return events.CheckFailed{Since: c.Since, Failures: c.Failures, Error: c.Error}, nil
	case aggregate.ReleaseDue:
		switch {
		case m.status != mScheduled || m.token != "" || now.Before(m.runAt):
			return nil, aggregate.ErrStale
		case !modelID.MatchString(c.DeliveryID) || slices.Contains(m.usedTokens, c.DeliveryID):
			return nil, aggregate.ErrInvalid
		}
		return events.DeliveryPending{DeliveryID: c.DeliveryID, Attempt: 1, NextAt: now}, nil
	case aggregate.MarkReadyPublished:
		if !pending(c.DeliveryID) {
			return nil, aggregate.ErrStale
		}
		return events.ReadyPublished{DeliveryID: c.DeliveryID, ReadySeq: c.ReadySeq}, nil
	case aggregate.RepublishReady:
		if m.status != mQueued || c.DeliveryID != m.token || c.LostSeq != m.readySeq {
			return nil, aggregate.ErrStale
		}
		return events.ReadyRepublished{DeliveryID: c.DeliveryID, LostSeq: c.LostSeq, ReadySeq: c.ReadySeq}, nil
	case aggregate.RetryDelivery:
		if !pending(c.DeliveryID) {
			return nil, aggregate.ErrStale
		}
		return events.DeliveryRetryScheduled{DeliveryID: c.DeliveryID, Attempt: m.attempt + 1, NextAt: c.NextAt, Error: c.Error}, nil
	case aggregate.ExhaustDelivery:
		if !pending(c.DeliveryID) {
			return nil, aggregate.ErrStale
		}
		return events.DeliveryExhausted{DeliveryID: c.DeliveryID, Attempts: m.attempt, Reason: c.Reason}, nil
	case aggregate.RecordResult:
		if c.DeliveryID != "" && (m.status != mRunning || c.DeliveryID != m.token) {
			return nil, aggregate.ErrTokenMismatch
		}
		if len(c.Result.Effects) > 32 || len(c.Result.Summary) > 16<<10 || len(c.Result.Error) > 16<<10 ||
			slices.ContainsFunc(c.Result.Effects, badEffect) {
			return nil, aggregate.ErrInvalid
		}
		output, err := modelJSON(c.Result.Output)
		if err != nil {
			return nil, err
		}
		c.Result.Output = output
		if r := c.Result; !r.Success && m.status == mRunning && (r.Retryable == nil || *r.Retryable) && m.retries(events.RetryOnFailed) {
			return events.RetryScheduled{Attempt: m.run + 1, NextAt: m.nextAt(now), Cause: events.RetryOnFailed, DeliveryID: c.DeliveryID, Result: &r}, nil
		}
		return events.ResultRecorded{DeliveryID: c.DeliveryID, Result: c.Result}, nil
	case aggregate.ReportEffects:
		switch {
		case m.status != mRunning || c.DeliveryID != m.token:
			return nil, aggregate.ErrTokenMismatch
		case len(c.Effects) == 0 || len(c.Effects) > 32 || slices.ContainsFunc(c.Effects, badEffect):
			return nil, aggregate.ErrInvalid
		case len(mergeEffects(m.effects, c.Effects, now)) > 256:
			return nil, aggregate.ErrInvalid
		}
		effects := slices.Clone(c.Effects)
		for i := range effects {
			if effects[i].At.IsZero() {
				effects[i].At = now
			}
		}
		return events.EffectsReported{DeliveryID: c.DeliveryID, Effects: effects}, nil
	case aggregate.SaveRun:
		switch {
		case m.status != mRunning || c.DeliveryID != m.token:
			return nil, aggregate.ErrTokenMismatch
		case c.Revision == 0 || c.Revision > events.MaxRunRevisions || c.Size < 2 || !modelDigest.MatchString(c.Digest):
			return nil, aggregate.ErrInvalid
		case c.Revision != m.runRevision+1:
			return nil, aggregate.ErrRunRevision
		}
		return events.RunSaved{DeliveryID: c.DeliveryID, Revision: c.Revision, Digest: c.Digest, Size: c.Size}, nil
	case aggregate.Cancel:
		if len(c.Reason) > 1<<10 {
			return nil, aggregate.ErrInvalid
		}
		return events.Canceled{Reason: c.Reason}, nil
	case aggregate.LoseClaim:
		switch {
		case m.status != mRunning || c.DeliveryID != m.token:
			return nil, aggregate.ErrTokenMismatch
		case len(c.Note) > 1<<10:
			return nil, aggregate.ErrInvalid
		case c.Reason == events.ClaimLostHeartbeat && (m.heartbeat == 0 || now.Before(m.started.Add(time.Duration(m.heartbeat)*time.Second))):
			return nil, aggregate.ErrStale
		case c.Reason == events.ClaimLostHeartbeat && c.Note != "", c.Reason != events.ClaimLostHeartbeat && c.Reason != events.ClaimLostReleased:
			return nil, aggregate.ErrInvalid
		}
		ev := events.ClaimLost{DeliveryID: c.DeliveryID, ExecutorID: m.executor, Reason: c.Reason, Note: c.Note}
		if c.Reason == events.ClaimLostReleased && m.released < 100 || m.charged() < m.maxAttempts() {
			ev.Attempt = m.run + 1
		}
		return ev, nil
	case aggregate.TimeOut:
		if m.status != mRunning || now.Before(m.deadline) {
			return nil, aggregate.ErrStale
		}
		if m.retries(events.RetryOnTimedOut) {
			return events.RetryScheduled{Attempt: m.run + 1, NextAt: m.nextAt(now), Cause: events.RetryOnTimedOut, Deadline: m.deadline}, nil
		}
		return events.TimedOut{Deadline: m.deadline}, nil
	}
	panic(fmt.Sprintf("model: unknown command %T", cmd))
}

// retries reports whether an attempt ended by cause is tried again.
func (m model) retries(cause string) bool {
	return m.retry != nil && m.charged() < m.retry.MaxAttempts && slices.Contains(m.retry.On, cause)
}

// charged is the attempt as the retry policy counts it: the first 100
// releases are free.
func (m model) charged() int { return m.run - min(m.released, 100) }

func (m model) maxAttempts() int {
	if m.retry == nil {
		return 1
	}
	return m.retry.MaxAttempts
}

// nextAt is API.md's backoff: backoffSeconds·2^(attempt−1), at most
// maxBackoffSeconds, less the jitter (FNV-1a of "taskId/attempt") modulo
// a fifth of it plus 1 ns.
func (m model) nextAt(now time.Time) time.Time {
	base := time.Duration(m.retry.BackoffSeconds) * time.Second
	for range m.run - 1 {
		base = min(2*base, time.Duration(m.retry.MaxBackoffSeconds)*time.Second)
	}
	base = min(base, time.Duration(m.retry.MaxBackoffSeconds)*time.Second)
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", m.taskID, m.run)
	return now.Add(base - time.Duration(h.Sum64()%uint64(base/5+1)))
}

// validRetry: maxAttempts 1..100, backoffSeconds 0..86400,
// maxBackoffSeconds 0..604800, on failed and/or timed_out, each once.
func validRetry(p *events.RetryPolicy) bool {
	if p == nil {
		return true
	}
	if p.MaxAttempts < 1 || p.MaxAttempts > 100 || p.BackoffSeconds < 0 || p.BackoffSeconds > 86400 ||
		p.MaxBackoffSeconds < 0 || p.MaxBackoffSeconds > 604800 || len(p.On) == 0 || len(p.On) > 2 {
		return false
	}
	return !slices.ContainsFunc(p.On, func(on string) bool { return on != "failed" && on != "timed_out" }) &&
		(len(p.On) == 1 || p.On[0] != p.On[1])
}

func (m model) admit(taskID, custID string, spec events.TaskSpec, now time.Time) (events.TaskSpec, error) {
	if m.status != "" {
		return spec, aggregate.ErrExists
	}
	for _, id := range []string{taskID, custID, spec.RootID, spec.Queue} {
		if !modelID.MatchString(id) {
			return spec, aggregate.ErrInvalid
		}
	}
	if (spec.ParentID == "") != (spec.RootID == taskID) ||
		spec.ParentID != "" && !modelID.MatchString(spec.ParentID) ||
		spec.TimeoutSeconds < 1 || spec.TimeoutSeconds > 604800 || !validRetry(spec.Retry) ||
		!validContent(spec.Message) || len(spec.Repo) > 4<<10 || len(spec.Signal.URI) > 4<<10 ||
		slices.ContainsFunc([]string{spec.Signal.ID, spec.Signal.RequestID, spec.Signal.EventType, spec.Signal.EventAction},
			func(v string) bool { return len(v) > 256 }) || !modelLabels(spec.Labels) ||
		spec.Kind != "" && !modelKind.MatchString(spec.Kind) ||
		spec.RetryOf != "" && (spec.RetryOf != spec.RelatedTaskID || spec.ParentID != "") {
		return spec, aggregate.ErrInvalid
	}
	if c := spec.Concurrency; c != nil && (c.Key == "" || len(c.Key) > 256 || c.Limit < 1 || c.Limit > 1000) {
		return spec, aggregate.ErrInvalid
	}
	if len(spec.Labels) == 0 {
		spec.Labels = nil
	}
	payload, err := modelJSON(spec.Payload)
	if err != nil {
		return spec, err
	}
	spec.Payload = payload
	if spec.RunAt.IsZero() {
		spec.RunAt = now
	}
	return spec, nil
}

var modelKind = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

// modelJSON: a payload or an output is stored compact, none for blank or
// null; not JSON is invalid, more than 256 KiB compact too large.
func modelJSON(raw []byte) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	if !json.Valid(raw) {
		return nil, aggregate.ErrInvalid
	}
	var b bytes.Buffer
	_ = json.Compact(&b, raw)
	switch {
	case b.String() == "null":
		return nil, nil
	case b.Len() > 256<<10:
		return nil, aggregate.ErrTooLarge
	}
	return b.Bytes(), nil
}

var modelLabelKey = regexp.MustCompile(`^[a-z0-9][a-z0-9_./-]{0,62}$`)

// modelLabels: at most 16 pairs, keys as modelLabelKey, values of at
// most 256 bytes of UTF-8.
func modelLabels(labels map[string]string) bool {
	for k, v := range labels {
		if !modelLabelKey.MatchString(k) || len(v) > 256 || !utf8.ValidString(v) {
			return false
		}
	}
	return len(labels) <= 16
}

// validContent: at most 64 parts, each with a type of at most 256 bytes
// and a text, 64 KiB of types and texts in all.
func validContent(m events.Message) bool {
	n := 0
	for _, c := range m.Content {
		if c.Type == "" || c.Text == "" || len(c.Type) > 256 {
			return false
		}
		n += len(c.Type) + len(c.Text)
	}
	return len(m.Content) <= 64 && n <= 64<<10
}

func badEffect(e events.Effect) bool {
	return e.Kind == "" || len(e.Kind) > 256 || len(e.Ref) > 256 || len(e.URL) > 4<<10
}

// mergeEffects is the model's merge: the effects by kind and ref, each as
// last reported (a zero time being at), in the order first reported.
func mergeEffects(have, add []events.Effect, at time.Time) []events.Effect {
	type key struct{ kind, ref string }
	var order []key
	last := map[key]events.Effect{}
	for _, e := range slices.Concat(have, add) {
		k := key{e.Kind, e.Ref}
		if _, seen := last[k]; !seen {
			order = append(order, k)
		}
		if e.At.IsZero() {
			e.At = at
		}
		last[k] = e
	}
	var out []events.Effect
	for _, k := range order {
		out = append(out, last[k])
	}
	return out
}

// apply is the model's own transition for a payload it decided.
func (m model) apply(ev events.Event) model {
	switch p := ev.Data.(type) {
	case events.TaskScheduled:
		m.status, m.taskID, m.custID = mScheduled, ev.TaskID, ev.CustomerID
		m.runAt, m.timeout = p.Spec.RunAt, time.Duration(p.Spec.TimeoutSeconds)*time.Second
		m.retry, m.run = p.Spec.Retry, 1
	case events.AdmissionRejected:
		m.status, m.taskID, m.custID = mCanceled, ev.TaskID, ev.CustomerID
	case events.DeliveryPending:
		m.token, m.attempt = p.DeliveryID, p.Attempt
	case events.DeliveryRetryScheduled:
		m.attempt = p.Attempt
	case events.DeliveryExhausted:
		m.status = mFailed
	case events.ReadyPublished:
		m.status, m.published, m.readySeq = mQueued, true, p.ReadySeq
	case events.ReadyRepublished:
		m.readySeq = p.ReadySeq
	case events.Claimed:
		m.status, m.consumed, m.deadline = mRunning, true, p.Deadline
		m.heartbeat, m.started, m.executor = p.HeartbeatSeconds, ev.At, p.ExecutorID
	case events.ClaimLost:
		m.lost = append(slices.Clip(m.lost), p.DeliveryID)
		if p.Attempt == 0 {
			m.status = mTimedOut
			break
		}
		if p.Reason == events.ClaimLostReleased {
			m.released++
		}
		m.status, m.runAt, m.run = mScheduled, ev.At, p.Attempt
		m.usedTokens = append(slices.Clip(m.usedTokens), m.token)
		m.token, m.attempt, m.published, m.readySeq, m.consumed, m.deadline = "", 0, false, 0, false, time.Time{}
	case events.EffectsReported:
		m.effects = mergeEffects(m.effects, p.Effects, ev.At)
	case events.CheckFailed:
		m.checkFailedAt = ev.At
	case events.RunSaved:
		m.runRevision = p.Revision
	case events.ResultRecorded:
		m.status = mFailed
		if p.Result.Success {
			m.status = mSucceeded
		}
		m.effects = mergeEffects(m.effects, p.Result.Effects, ev.At)
		m.effects = m.effects[:min(len(m.effects), 256)] // the rest stay in the result only
	case events.RetryScheduled:
		m.status, m.runAt, m.run = mScheduled, p.NextAt, p.Attempt
		m.usedTokens = append(slices.Clip(m.usedTokens), m.token)
		m.token, m.attempt, m.published, m.readySeq, m.consumed, m.deadline = "", 0, false, 0, false, time.Time{}
		if p.Result != nil {
			m.effects = mergeEffects(m.effects, p.Result.Effects, ev.At)
			m.effects = m.effects[:min(len(m.effects), 256)]
		}
	case events.Canceled:
		m.status = mCanceled
	case events.TimedOut:
		m.status = mTimedOut
	case events.MailboxAppended:
		m.mail = append(slices.Clip(m.mail), p.Message.ID)
	case events.MailboxRead:
		m.cursor = p.Cursor
	}
	return m
}

// harness runs commands against the aggregate and the model side by side.
type harness struct {
	m        model
	s        aggregate.State
	log      []events.Event
	now      time.Time
	claims   map[string]int // Claimed events per delivery token
	terminal *aggregate.State
	steps    map[string]int
	retries  []events.Event // the RetryScheduled events appended
}

func (h *harness) exec(t *rapid.T, cmd aggregate.Command) {
	t.Helper()
	wantP, wantErr := h.m.decide(cmd, h.now)
	got, err := aggregate.Decide(h.s, cmd, h.now)
	name := fmt.Sprintf("%T", cmd)
	if wantErr != nil {
		requireErrKind(t, err, wantErr)
		if got != nil {
			t.Fatalf("%s: events %+v returned with error %v", name, got, err)
		}
		h.steps[name+" "+strings.TrimPrefix(wantErr.Error(), "aggregate: ")]++
		return
	}
	if err != nil {
		t.Fatalf("%s %+v at %v: error %v, model expected %#v", name, cmd, h.now, err, wantP)
	}
	if wantP == nil {
		if len(got) != 0 {
			t.Fatalf("%s: events %+v, model expected none", name, got)
		}
		h.steps[name+" noop"]++
		return
	}
	taskID, custID := h.m.taskID, h.m.custID
	switch c := cmd.(type) {
	case aggregate.Schedule:
		taskID, custID = c.TaskID, c.CustomerID
	case aggregate.Reject:
		taskID, custID = c.TaskID, c.CustomerID
	}
	want := []events.Event{{TaskID: taskID, CustomerID: custID, Number: h.s.Version + 1, At: h.now, Actor: h.m.actor(cmd), Data: wantP}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s events\n got: %#v\nwant: %#v", name, got, want)
	}
	prev := h.s.Status
	for _, e := range got {
		e.Seq = events.Position(len(h.log)) + 1
		h.log = append(h.log, e)
		h.s = aggregate.Apply(h.s, e)
		h.m = h.m.apply(e)
		switch p := e.Data.(type) {
		case events.Claimed:
			h.claims[p.DeliveryID]++
		case events.RetryScheduled:
			h.retries = append(h.retries, e)
			h.steps[name+" retry"]++
		case events.ClaimLost:
			h.steps[name+" "+p.Reason]++
		case events.DeliveryPending:
			if n := len(h.retries); n > 0 && e.At.Before(h.retries[n-1].Data.(events.RetryScheduled).NextAt) {
				t.Fatalf("attempt released at %v, before its nextAt", e.At)
			}
		}
	}
	if prev != h.s.Status && !slices.Contains(legal[string(prev)], string(h.s.Status)) {
		t.Fatalf("%s moved %q → %q, not in the transition table", name, prev, h.s.Status)
	}
	h.steps[name+" ok"]++
}

// check holds after every step.
func (h *harness) check(t *rapid.T) {
	t.Helper()
	s := h.s
	if got, want := string(s.Status), h.m.status; got != want {
		t.Fatalf("status %q, model %q", got, want)
	}
	if !slices.Equal(s.MailIDs, h.m.mail) || s.Cursor != h.m.cursor {
		t.Fatalf("mailbox %v cursor %d, model %v cursor %d", s.MailIDs, s.Cursor, h.m.mail, h.m.cursor)
	}
	if s.Version != len(h.log) || s.LastSeq != events.Position(len(h.log)) {
		t.Fatalf("Version %d LastSeq %d after %d events", s.Version, s.LastSeq, len(h.log))
	}
	if !reflect.DeepEqual(s.Effects, h.m.effects) {
		t.Fatalf("effects %+v, model %+v", s.Effects, h.m.effects)
	}
	if s.Delivery.ReadySeq != h.m.readySeq {
		t.Fatalf("ready seq %d, model %d", s.Delivery.ReadySeq, h.m.readySeq)
	}
	if s.Run.Revision != h.m.runRevision {
		t.Fatalf("run revision %d, model %d", s.Run.Revision, h.m.runRevision)
	}
	if s.Attempt() != h.m.run && s.Exists() && !s.Rejected || s.Charged() > s.MaxAttempts() || len(s.Attempts()) > s.MaxAttempts()+h.m.released {
		t.Fatalf("attempt %d of %d (%d listed), model attempt %d", s.Attempt(), s.MaxAttempts(), len(s.Attempts()), h.m.run)
	}
	if n := len(h.retries); n > 0 {
		// Each retry waits backoff·2^(k−1) (at most the maximum), less at
		// most a fifth of it.
		e := h.retries[n-1]
		p, r := e.Data.(events.RetryScheduled), s.Spec.Retry
		base := time.Duration(min(float64(r.BackoffSeconds)*math.Pow(2, float64(p.Attempt-2)), float64(r.MaxBackoffSeconds)) * float64(time.Second))
		if d := p.NextAt.Sub(e.At); d > base || d < base-base/5 {
			t.Fatalf("retry %d waits %v, want %v less at most a fifth", p.Attempt, d, base)
		}
	}
	if s.Status == aggregate.StatusRunning && s.Claim.DeliveryID != h.m.token {
		t.Fatalf("running with claim %q, model token %q", s.Claim.DeliveryID, h.m.token)
	}
	for token, n := range h.claims {
		if n > 1 {
			t.Fatalf("delivery token %q claimed %d times", token, n)
		}
	}
	if s.Status.Terminal() {
		if h.terminal == nil {
			h.terminal = &s
		}
		frozen := *h.terminal
		frozen.MailIDs, frozen.Cursor, frozen.Version, frozen.LastSeq = s.MailIDs, s.Cursor, s.Version, s.LastSeq
		if !reflect.DeepEqual(s, frozen) {
			t.Fatalf("terminal task changed\n now: %+v\nthen: %+v", s, *h.terminal)
		}
	} else if h.terminal != nil {
		t.Fatalf("task left terminal status %s for %s", h.terminal.Status, s.Status)
	}
	if replayed := aggregate.Replay(h.log); !reflect.DeepEqual(replayed, s) {
		t.Fatalf("Replay differs from incremental Apply\nreplay: %+v\n apply: %+v", replayed, s)
	}
}

// drawSpec draws a spec that is mostly valid: rapid favours the first
// entries of each list, so valid choices come first and faults last.
func drawSpec(t *rapid.T, taskID string, now time.Time) events.TaskSpec {
	spec := events.TaskSpec{
		RootID:         taskID,
		Queue:          "default",
		Message:        events.Message{ID: "objective", CreatedAt: now, Content: []events.ContentPart{{Type: "text", Text: "go"}}},
		TimeoutSeconds: rapid.SampledFrom([]int{5, 30, 1, 120, 604800}).Draw(t, "timeout"),
	}
	if off := rapid.SampledFrom([]int{0, 10, 30, -5, 60, 120, 1}).Draw(t, "runAtOffset"); off != 1 {
		spec.RunAt = now.Add(time.Duration(off) * time.Second)
	} // else zero, which means now
	spec.Retry = drawRetry(t)
	switch rapid.IntRange(0, 27).Draw(t, "specVariant") {
	case 1:
		spec.ParentID, spec.RootID = "parent-1", "root-9" // a valid child
	case 2:
		spec.ParentID = "parent-1" // a child claiming to be its own root
	case 3:
		spec.RootID = "root-9" // a root task naming another root
	case 4:
		spec.RootID = ""
	case 5:
		spec.Queue = "bad.queue"
	case 6:
		spec.TimeoutSeconds = 0
	case 7:
		spec.TimeoutSeconds = 604801
	case 8:
		spec.ParentID, spec.RootID = "bad parent", "root-9"
	case 9:
		spec.Message.Content[0].Text = strings.Repeat("x", 64<<10)
	case 10:
		spec.Signal.URI = strings.Repeat("u", rapid.SampledFrom([]int{4 << 10, 4<<10 + 1}).Draw(t, "uriLen"))
	case 11:
		spec.Repo = strings.Repeat("r", rapid.SampledFrom([]int{4 << 10, 4<<10 + 1}).Draw(t, "repoLen"))
	case 12:
		spec.Signal.EventAction = strings.Repeat("a", rapid.SampledFrom([]int{256, 257}).Draw(t, "actionLen"))
	case 13:
		spec.Message.Content = slices.Repeat(spec.Message.Content, rapid.SampledFrom([]int{0, 64, 65}).Draw(t, "parts"))
	case 14:
		spec.Message.Content[0].Text = ""
	case 15:
		spec.Concurrency = &events.Concurrency{
			Key:   strings.Repeat("k", rapid.SampledFrom([]int{1, 256, 0, 257}).Draw(t, "keyLen")),
			Limit: rapid.SampledFrom([]int{1, 3, 1000, 0, 1001, -1}).Draw(t, "limit"),
		}
	case 16:
		spec.Labels = map[string]string{"repo": "example/storefront", "team.a/b_c-d": ""} // valid
	case 17:
		spec.Labels = map[string]string{rapid.SampledFrom([]string{"Repo", "-x", "", strings.Repeat("k", 64), strings.Repeat("k", 63), "a b"}).Draw(t, "labelKey"): "v"}
	case 18:
		spec.Labels = map[string]string{"k": rapid.SampledFrom([]string{strings.Repeat("v", 256), strings.Repeat("v", 257), "\xff", "ü"}).Draw(t, "labelValue")}
	case 19:
		spec.Labels = map[string]string{}
		for i := range rapid.SampledFrom([]int{16, 17}).Draw(t, "labelCount") {
			spec.Labels[fmt.Sprint("k", i)] = "v"
		}
	case 20:
		spec.RetryOf, spec.RelatedTaskID = "old-1", "old-1" // a valid retry
	case 21:
		spec.RetryOf, spec.RelatedTaskID = "old-1", "old-2"
	case 22:
		spec.RetryOf, spec.RelatedTaskID, spec.ParentID, spec.RootID = "old-1", "old-1", "parent-1", "root-9"
	case 23:
		spec.Kind = rapid.SampledFrom([]string{"resize", "image.resize-v2_x", strings.Repeat("k", 64), "Resize", "-x", strings.Repeat("k", 65), "a/b"}).Draw(t, "kind")
	case 24:
		spec.Kind, spec.Payload = "resize", drawJSON(t, "payload")
	case 25:
		spec.Payload = []byte(rapid.SampledFrom([]string{" null ", "", "{", `{"a":1} {"b":2}`, "'x'"}).Draw(t, "oddPayload"))
	case 26:
		spec.Payload = bigJSON(rapid.SampledFrom([]int{256 << 10, 256<<10 + 1}).Draw(t, "payloadLen"))
	}
	return spec
}

// drawRetry draws no policy, a valid one, or one with a fault.
func drawRetry(t *rapid.T) *events.RetryPolicy {
	if rapid.IntRange(0, 2).Draw(t, "hasRetry") == 2 {
		return nil
	}
	p := &events.RetryPolicy{
		MaxAttempts:       rapid.SampledFrom([]int{3, 2, 1, 100}).Draw(t, "maxAttempts"),
		BackoffSeconds:    rapid.SampledFrom([]int{0, 1, 10, 86400}).Draw(t, "backoff"),
		MaxBackoffSeconds: rapid.SampledFrom([]int{30, 0, 3600, 604800}).Draw(t, "maxBackoff"),
		On:                rapid.SampledFrom([][]string{{"failed"}, {"failed", "timed_out"}, {"timed_out"}}).Draw(t, "on"),
	}
	switch rapid.IntRange(0, 12).Draw(t, "retryFault") {
	case 9:
		p.MaxAttempts = rapid.SampledFrom([]int{0, 101, -1}).Draw(t, "badMaxAttempts")
	case 10:
		p.BackoffSeconds = rapid.SampledFrom([]int{-1, 86401}).Draw(t, "badBackoff")
	case 11:
		p.MaxBackoffSeconds = rapid.SampledFrom([]int{-1, 604801}).Draw(t, "badMaxBackoff")
	case 12:
		p.On = rapid.SampledFrom([][]string{nil, {"failed", "failed"}, {"canceled"}, {"failed", "timed_out", "failed"}}).Draw(t, "badOn")
	}
	return p
}

var (
	tokenPool    = []string{"d1", "d2", "d3", ""}
	executorPool = []string{"e1", "e2", "", "bad id"}
	mailPool     = []string{"m1", "m2", "m3", "m4", "", "m.5"}
)

func drawResult(t *rapid.T) events.Result {
	r := events.Result{Success: rapid.IntRange(0, 2).Draw(t, "success") == 2}
	r.Summary = strings.Repeat("s", rapid.SampledFrom([]int{0, 10, 16 << 10, 16<<10 + 1}).Draw(t, "summaryLen"))
	r.Error = strings.Repeat("e", rapid.SampledFrom([]int{0, 10, 16 << 10, 16<<10 + 1}).Draw(t, "errorLen"))
	r.Effects = drawEffects(t, []int{0, 1, 2, 32, 33})
	if v := rapid.IntRange(0, 3).Draw(t, "retryable"); v < 2 {
		r.Retryable = &[]bool{true, false}[v]
	}
	switch rapid.IntRange(0, 3).Draw(t, "outputVariant") {
	case 1:
		r.Output = drawJSON(t, "output")
	case 2:
		r.Output = []byte(rapid.SampledFrom([]string{"null", "{", "[1,]"}).Draw(t, "oddOutput"))
	case 3:
		r.Output = bigJSON(rapid.SampledFrom([]int{256 << 10, 256<<10 + 1}).Draw(t, "outputLen"))
	}
	return r
}

// drawJSON draws a small JSON value, sometimes with spaces to compact.
func drawJSON(t *rapid.T, label string) []byte {
	return []byte(rapid.SampledFrom([]string{`{"w":640,"h":480}`, "{ \"src\" : [1, 2.5, \"ü\"] ,\n \"x\": null }", `"text"`, `0`, `[]`}).Draw(t, label))
}

// bigJSON returns a JSON string of exactly n bytes.
func bigJSON(n int) []byte {
	return []byte(`"` + strings.Repeat("x", n-2) + `"`)
}

// drawEffects draws a list of effects of one of the lengths: mostly valid,
// their refs either from a small pool (later reports replace earlier
// ones) or most likely new (so that reports fill a task up to its limit
// of distinct effects), sometimes with a time or a fault.
func drawEffects(t *rapid.T, lengths []int) []events.Effect {
	n := rapid.SampledFrom(lengths).Draw(t, "effects")
	first := 0
	if rapid.Bool().Draw(t, "newRefs") {
		first = rapid.IntRange(100, 1<<30).Draw(t, "firstRef")
	}
	var effects []events.Effect
	for i := range n {
		e := events.Effect{Kind: "comment", Ref: fmt.Sprint(first + i), Uncertain: rapid.Bool().Draw(t, "uncertain")}
		if rapid.IntRange(0, 3).Draw(t, "effectAt") == 0 {
			e.At = t0
		}
		effects = append(effects, e)
	}
	if n > 0 {
		switch rapid.IntRange(0, 12).Draw(t, "effectFault") {
		case 0:
			effects[0].Kind = ""
		case 1:
			effects[n-1].URL = strings.Repeat("u", rapid.SampledFrom([]int{4 << 10, 4<<10 + 1}).Draw(t, "urlLen"))
		case 2:
			effects[0].Ref = strings.Repeat("r", rapid.SampledFrom([]int{256, 257}).Draw(t, "refLen"))
		}
	}
	return effects
}

// TestModel runs random command sequences against the aggregate and the
// reference model. Several rapid runs (100 cases each by default) make
// sure every command is accepted somewhere, which the end of the test
// checks: after five runs, more (up to 40) while a command is still
// never accepted, since a rare state (a republish needs a published,
// unclaimed delivery) can miss five runs by chance.
func TestModel(t *testing.T) {
	t.Parallel()
	total := map[string]int{}
	commands := []aggregate.Command{
		aggregate.Schedule{}, aggregate.Reject{}, aggregate.ReleaseDue{}, aggregate.MarkReadyPublished{},
		aggregate.RepublishReady{}, aggregate.RetryDelivery{}, aggregate.ExhaustDelivery{}, aggregate.Claim{}, aggregate.RecordResult{},
		aggregate.Cancel{}, aggregate.TimeOut{}, aggregate.AppendMail{}, aggregate.ReadMail{}, aggregate.ReportEffects{},
		aggregate.RecordCheckFailed{},
		aggregate.LoseClaim{},
		aggregate.CancelForAncestor{},
		aggregate.SaveRun{},
	}
	neverAccepted := func() []string {
		var never []string
		for _, cmd := range commands {
			if name := fmt.Sprintf("%T", cmd); total[name+" ok"] == 0 {
				never = append(never, name)
			}
		}
		return never
	}
	for run := 0; run < 5 || (run < 40 && len(neverAccepted()) > 0); run++ {
		t.Run(fmt.Sprintf("Run%d", run), func(t *testing.T) { rapid.Check(t, modelProperty(total, defaultWeights, nil)) })
	}
	// Every command must have been accepted somewhere in the runs, or the
	// generators have drifted out of reach of a branch.
	for _, name := range neverAccepted() {
		t.Errorf("%s never accepted in 40 runs; outcomes: %v", name, total)
	}
	if testing.Verbose() {
		for _, k := range slices.Sorted(maps.Keys(total)) {
			t.Logf("%-50s %d", k, total[k])
		}
	}
}

// defaultWeights: commands that end the task are drawn less often than
// those that move it along, so deep states are reached.
var defaultWeights = map[string]int{
	"Schedule": 1, "ReleaseDue": 4, "MarkReadyPublished": 3, "RepublishReady": 2, "RetryDelivery": 2, "ExhaustDelivery": 1,
	"Claim": 4, "RecordResult": 2, "ReportEffects": 4, "Cancel": 1, "TimeOut": 3, "AppendMail": 3, "ReadMail": 3,
	"RecordCheckFailed": 2,
	"LoseClaim":         2,
	"CancelForAncestor": 1,
	"SaveRun":           3,
}

// TestModelRetries runs the model on tasks with a valid retry policy,
// with the commands of an attempt's cycle (release, claim, result,
// timeout) drawn most, so that tasks go through many attempts: the
// aggregate must never exceed maxAttempts, wait outside its backoff
// bounds or release an attempt before its nextAt (harness.check).
func TestModelRetries(t *testing.T) {
	t.Parallel()
	total := map[string]int{}
	weights := map[string]int{
		"ReleaseDue": 4, "MarkReadyPublished": 1, "Claim": 4, "RecordResult": 3, "ReportEffects": 1, "TimeOut": 2, "Cancel": 1, "ReadMail": 1,
		"LoseClaim": 1,
	}
	retry := func(t *rapid.T) *events.RetryPolicy {
		return &events.RetryPolicy{
			MaxAttempts:       rapid.IntRange(2, 6).Draw(t, "maxAttempts"),
			BackoffSeconds:    rapid.SampledFrom([]int{0, 1, 10, 86400}).Draw(t, "backoff"),
			MaxBackoffSeconds: rapid.SampledFrom([]int{30, 0, 3600, 604800}).Draw(t, "maxBackoff"),
			On:                rapid.SampledFrom([][]string{{"failed", "timed_out"}, {"failed"}, {"timed_out"}}).Draw(t, "on"),
		}
	}
	want := []string{"aggregate.RecordResult retry", "aggregate.TimeOut retry", "aggregate.LoseClaim heartbeat", "aggregate.LoseClaim released"}
	missing := func() bool { return slices.ContainsFunc(want, func(name string) bool { return total[name] == 0 }) }
	// Three runs, more (up to 20) while an outcome is still missing: a
	// rare one can miss three runs by chance.
	for run := 0; run < 3 || (run < 20 && missing()); run++ {
		t.Run(fmt.Sprintf("Run%d", run), func(t *testing.T) { rapid.Check(t, modelProperty(total, weights, retry)) })
	}
	for _, name := range want {
		if total[name] == 0 {
			t.Errorf("%s never happened in 20 runs; outcomes: %v", name, total)
		}
	}
}

// modelProperty is one random history of commands drawn by weight,
// counting outcomes into total. retry, if not nil, draws the first task's
// retry policy.
func modelProperty(total map[string]int, weights map[string]int, retry func(*rapid.T) *events.RetryPolicy) func(*rapid.T) {
	return func(t *rapid.T) {
		h := &harness{now: t0, claims: map[string]int{}, steps: total}
		token := func() string { return rapid.SampledFrom(tokenPool).Draw(t, "deliveryID") }
		schedule := func(t *rapid.T) {
			id := rapid.SampledFrom([]string{"task-1", "task-1", "task-1", "task.1"}).Draw(t, "taskID")
			cust := rapid.SampledFrom([]string{"cust-1", "cust-1", "cust-1", "*"}).Draw(t, "customerID")
			spec := drawSpec(t, id, h.now)
			if rapid.IntRange(0, 4).Draw(t, "reject") == 4 {
				reason := strings.Repeat("q", rapid.SampledFrom([]int{5, 1<<10 + 1}).Draw(t, "reasonLen"))
				h.exec(t, aggregate.Reject{TaskID: id, CustomerID: cust, Spec: spec, Reason: reason})
				return
			}
			h.exec(t, aggregate.Schedule{TaskID: id, CustomerID: cust, Spec: spec})
		}
		actions := map[string]func(*rapid.T){
			"Schedule": schedule,
			"ReleaseDue": func(t *rapid.T) {
				id := rapid.SampledFrom([]string{"d1", "d2", "d3", "", "d.4"}).Draw(t, "deliveryID")
				h.exec(t, aggregate.ReleaseDue{DeliveryID: id})
			},
			"MarkReadyPublished": func(t *rapid.T) {
				h.exec(t, aggregate.MarkReadyPublished{DeliveryID: token(), ReadySeq: rapid.Uint64Range(0, 9).Draw(t, "readySeq")})
			},
			"RepublishReady": func(t *rapid.T) {
				lost := h.m.readySeq // mostly the current one, sometimes not
				if rapid.IntRange(0, 3).Draw(t, "staleLost") == 0 {
					lost = rapid.Uint64Range(0, 9).Draw(t, "lostSeq")
				}
				h.exec(t, aggregate.RepublishReady{DeliveryID: token(), LostSeq: lost, ReadySeq: rapid.Uint64Range(1, 9).Draw(t, "readySeq")})
			},
			"RetryDelivery": func(t *rapid.T) {
				next := h.now.Add(time.Duration(rapid.IntRange(0, 60).Draw(t, "retryIn")) * time.Second)
				h.exec(t, aggregate.RetryDelivery{DeliveryID: token(), NextAt: next, Error: "publish failed"})
			},
			"ExhaustDelivery": func(t *rapid.T) { h.exec(t, aggregate.ExhaustDelivery{DeliveryID: token(), Reason: "gave up"}) },
			"Claim": func(t *rapid.T) {
				id := h.m.token // often the current token, else any
				if rapid.Bool().Draw(t, "otherToken") {
					id = token()
				}
				hb := rapid.SampledFrom([]int{0, 5, 1, 3600, -1, 3601}).Draw(t, "heartbeatSeconds")
				h.exec(t, aggregate.Claim{DeliveryID: id, ExecutorID: rapid.SampledFrom(executorPool).Draw(t, "executorID"), HeartbeatSeconds: hb})
			},
			"RecordResult": func(t *rapid.T) {
				id := h.m.token // mostly the running claim's, sometimes another or none
				if rapid.IntRange(0, 2).Draw(t, "otherToken") == 2 {
					id = rapid.SampledFrom([]string{"", "d1", "d2", "d3"}).Draw(t, "deliveryID")
				}
				h.exec(t, aggregate.RecordResult{DeliveryID: id, Result: drawResult(t)})
			},
			"ReportEffects": func(t *rapid.T) {
				id := rapid.SampledFrom([]string{"d1", "d2", "d3", ""}).Draw(t, "deliveryID")
				h.exec(t, aggregate.ReportEffects{DeliveryID: id, Effects: drawEffects(t, []int{1, 2, 32, 0, 33})})
			},
			"SaveRun": func(t *rapid.T) {
				id := h.m.token // mostly the running claim's, sometimes another
				if rapid.IntRange(0, 3).Draw(t, "otherToken") == 3 {
					id = rapid.SampledFrom([]string{"", "d1", "d2"}).Draw(t, "deliveryID")
				}
				rev := h.m.runRevision + 1 // mostly the next, sometimes stale, ahead or out of range
				switch rapid.IntRange(0, 6).Draw(t, "revisionFault") {
				case 4:
					rev = h.m.runRevision
				case 5:
					rev += 1
				case 6:
					rev = rapid.SampledFrom([]uint64{0, events.MaxRunRevisions + 1}).Draw(t, "revision")
				}
				digest := strings.Repeat("ab", 32)
				if rapid.IntRange(0, 8).Draw(t, "digestFault") == 8 {
					digest = rapid.SampledFrom([]string{"", strings.Repeat("AB", 32), strings.Repeat("a", 63), strings.Repeat("g", 64)}).Draw(t, "digest")
				}
				h.exec(t, aggregate.SaveRun{DeliveryID: id, Revision: rev, Digest: digest, Size: rapid.SampledFrom([]int{2, 100, 1 << 20, 1, 0}).Draw(t, "size")})
			},
			"Cancel": func(t *rapid.T) {
				h.exec(t, aggregate.Cancel{Reason: strings.Repeat("c", rapid.SampledFrom([]int{5, 0, 1 << 10, 1<<10 + 1}).Draw(t, "reasonLen"))})
			},
			"CancelForAncestor": func(t *rapid.T) {
				id := h.m.token // mostly a claim's step (the current token or another), sometimes a release's
				switch rapid.IntRange(0, 3).Draw(t, "ancestorStep") {
				case 0:
					id = ""
				case 1:
					id = token()
				}
				h.exec(t, aggregate.CancelForAncestor{DeliveryID: id})
			},
			"TimeOut": func(t *rapid.T) { h.exec(t, aggregate.TimeOut{}) },
			"LoseClaim": func(t *rapid.T) {
				id := h.m.token // mostly the running claim's, sometimes a lost one or another
				switch rapid.IntRange(0, 5).Draw(t, "loseToken") {
				case 4:
					id = token()
				case 5:
					if len(h.m.lost) > 0 {
						id = h.m.lost[0]
					}
				}
				reason := rapid.SampledFrom([]string{events.ClaimLostHeartbeat, events.ClaimLostReleased, "crashed"}).Draw(t, "loseReason")
				note := rapid.SampledFrom([]string{"", "", "shutting down", strings.Repeat("n", 1<<10+1)}).Draw(t, "loseNote")
				h.exec(t, aggregate.LoseClaim{DeliveryID: id, Reason: reason, Note: note})
			},
			"AppendMail": func(t *rapid.T) {
				m := events.Message{ID: rapid.SampledFrom(mailPool).Draw(t, "messageID"), Content: []events.ContentPart{{Type: "text", Text: "more"}}}
				if rapid.Bool().Draw(t, "createdAt") {
					m.CreatedAt = t0
				}
				switch rapid.IntRange(0, 12).Draw(t, "mailFault") {
				case 0:
					m.Content[0].Text = strings.Repeat("x", 64<<10)
				case 1:
					m.Content = nil
				case 2:
					m.Content[0].Text = ""
				}
				h.exec(t, aggregate.AppendMail{Message: m})
			},
			"RecordCheckFailed": func(t *rapid.T) {
				h.exec(t, aggregate.RecordCheckFailed{Since: h.now, Failures: rapid.IntRange(0, 3).Draw(t, "failures"),
					Error: strings.Repeat("e", rapid.SampledFrom([]int{10, 0, 16 << 10, 16<<10 + 1}).Draw(t, "errorLen"))})
			},
			"ReadMail": func(t *rapid.T) {
				id := h.m.token // mostly the running claim's, sometimes another or none
				if rapid.IntRange(0, 2).Draw(t, "otherToken") == 2 {
					id = rapid.SampledFrom([]string{"", "d1", "d2", "d3"}).Draw(t, "deliveryID")
				}
				h.exec(t, aggregate.ReadMail{Cursor: rapid.IntRange(-1, 5).Draw(t, "cursor"), DeliveryID: id})
			},
		}
		// Most cases start from a valid task so that the run gets past
		// admission. rapid favours the first entries of a SampledFrom, so
		// each case also draws its own order of actions.
		var weighted []string
		for name, weight := range weights {
			weighted = append(weighted, slices.Repeat([]string{name}, weight)...)
		}
		if weights["Schedule"] > 0 && len(weighted) < len(actions) {
			t.Fatalf("an action has no weight")
		}
		names := rapid.Permutation(slices.Sorted(slices.Values(weighted))).Draw(t, "actionOrder")
		spec := events.TaskSpec{
			RootID: "task-1", Queue: "default",
			RunAt:          h.now.Add(time.Duration(rapid.IntRange(-10, 60).Draw(t, "runAtOffset")) * time.Second),
			TimeoutSeconds: rapid.IntRange(1, 120).Draw(t, "timeout"),
			Retry:          drawRetry(t),
		}
		if retry != nil {
			spec.Retry = retry(t)
		}
		switch rapid.IntRange(0, 9).Draw(t, "start") {
		case 9: // no task yet
		case 8:
			h.exec(t, aggregate.Reject{TaskID: "task-1", CustomerID: "cust-1", Spec: spec, Reason: "quota"})
		default:
			h.exec(t, aggregate.Schedule{TaskID: "task-1", CustomerID: "cust-1", Spec: spec})
		}
		h.check(t)
		for range rapid.IntRange(10, 80).Draw(t, "steps") {
			h.now = h.now.Add(time.Duration(rapid.SampledFrom([]int{0, 0, 1, 3, 10, 30, 90}).Draw(t, "advance")) * time.Second)
			actions[rapid.SampledFrom(names).Draw(t, "action")](t)
			h.check(t)
		}
	}
}
