package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Entry is one event of a timeline with the status it left its task in.
type Entry struct {
	Seq    events.Position `json:"seq"`
	At     time.Time       `json:"at"`
	TaskID string          `json:"taskId"`
	Type   string          `json:"type"`
	Actor  string          `json:"actor,omitempty"`
	Status string          `json:"status"`
	Detail string          `json:"detail"`
	Data   any             `json:"data"`
}

// Timeline folds events (of one task, or of several interleaved in log
// order) into entries, each with its task's status after it.
func Timeline(evs []events.Event) []Entry {
	t := NewStatusTracker()
	out := make([]Entry, 0, len(evs))
	for _, ev := range evs {
		out = append(out, t.Entry(ev))
	}
	return out
}

// StatusTracker turns a stream of events into entries, remembering each
// task's state. Not safe for concurrent use.
type StatusTracker struct {
	states    map[string]aggregate.State
	schedules map[string]aggregate.ScheduleState
}

// NewStatusTracker returns an empty tracker.
func NewStatusTracker() *StatusTracker {
	return &StatusTracker{states: map[string]aggregate.State{}, schedules: map[string]aggregate.ScheduleState{}}
}

// Entry applies ev and returns its entry. A task first seen mid-history
// shows the status its seen events give. A schedule's event shows the
// schedule's status (ScheduleStatus).
func (t *StatusTracker) Entry(ev events.Event) Entry {
	if events.IsSchedule(ev.Type()) {
		key := scheduleKey(ev)
		st := aggregate.ApplySchedule(t.schedules[key], ev)
		t.schedules[key] = st
		return Entry{
			Seq: ev.Seq, At: ev.At.UTC(), TaskID: ev.TaskID, Type: string(ev.Type()), Actor: ev.Actor,
			Status: ScheduleStatus(st), Detail: Describe(ev), Data: ev.Data,
		}
	}
	if task := SlotTask(ev); task != "" { // about the task, not a change of it
		return Entry{
			Seq: ev.Seq, At: ev.At.UTC(), TaskID: task, Type: string(ev.Type()), Actor: ev.Actor,
			Status: string(t.states[task].Status), Detail: Describe(ev), Data: ev.Data,
		}
	}
	st := aggregate.Apply(t.states[ev.TaskID], ev)
	t.states[ev.TaskID] = st
	return EntryOf(ev, st)
}

// EntryOf returns the entry of ev, which left its task at st.
func EntryOf(ev events.Event, st aggregate.State) Entry {
	return Entry{
		Seq: ev.Seq, At: ev.At.UTC(), TaskID: ev.TaskID, Type: string(ev.Type()), Actor: ev.Actor,
		Status: string(st.Status), Detail: Describe(ev), Data: ev.Data,
	}
}

// Describe says in a line what an event means.
func Describe(ev events.Event) string {
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	switch p := ev.Data.(type) {
	case events.TaskScheduled:
		s := fmt.Sprintf("queue %s, run at %s, timeout %ds", p.Spec.Queue, ts(p.Spec.RunAt), p.Spec.TimeoutSeconds)
		if r := p.Spec.Retry; r != nil {
			s += fmt.Sprintf(", up to %d attempts (backoff %ds..%ds, on %s)", r.MaxAttempts, r.BackoffSeconds, r.MaxBackoffSeconds, strings.Join(r.On, ","))
		}
		if p.Spec.ParentID != "" {
			s += ", parent " + p.Spec.ParentID
		}
		if p.Spec.RetryOf != "" {
			s += ", retry of " + p.Spec.RetryOf
		}
		if l := labelText(p.Spec.Labels); l != "" {
			s += ", labels " + l
		}
		if p.Spec.Kind != "" {
			s += ", kind " + p.Spec.Kind
		}
		if n := len(p.Spec.Payload); n > 0 {
			s += fmt.Sprintf(", payload %d bytes", n)
		}
		if p.DeliveryID != "" {
			s += "; released, delivery " + p.DeliveryID + " attempt 1"
		}
		if t := text(p.Spec.Message.Content); t != "" {
			s += ": " + t
		}
		return s
	case events.AdmissionRejected:
		return "rejected by admission: " + p.Reason
	case events.DeliveryPending:
		return fmt.Sprintf("released; delivery %s attempt %d", p.DeliveryID, p.Attempt)
	case events.DeliveryRetryScheduled:
		return fmt.Sprintf("publish failed (%s); attempt %d at %s", p.Error, p.Attempt, ts(p.NextAt))
	case events.DeliveryExhausted:
		return fmt.Sprintf("gave up after %d attempts: %s", p.Attempts, p.Reason)
	case events.ReadyPublished:
		return "ready notification published for delivery " + p.DeliveryID
	case events.ReadyRepublished:
		return fmt.Sprintf("ready notification for delivery %s was lost (at %d); published again at %d", p.DeliveryID, p.LostSeq, p.ReadySeq)
	case events.Claimed:
		s := fmt.Sprintf("claimed by %s with delivery %s; deadline %s", p.ExecutorID, p.DeliveryID, ts(p.Deadline))
		if p.HeartbeatSeconds > 0 {
			s += fmt.Sprintf("; heartbeat every %ds", p.HeartbeatSeconds)
		}
		return s
	case events.TimedOut:
		return "running deadline " + ts(p.Deadline) + " passed"
	case events.ClaimLost:
		s := "claim of " + p.ExecutorID + " with delivery " + p.DeliveryID + " lost: missed its heartbeat"
		if p.Reason == events.ClaimLostReleased {
			s = "claim of " + p.ExecutorID + " with delivery " + p.DeliveryID + " released"
		}
		if p.Note != "" {
			s += ": " + oneLine(p.Note)
		}
		if p.Attempt == 0 {
			return s + "; no attempt left: timed out"
		}
		return s + fmt.Sprintf("; attempt %d due now", p.Attempt)
	case events.ResultRecorded:
		r := p.Result
		s := "failure"
		if r.Success {
			s = "success"
		}
		if r.Summary != "" {
			s += ": " + oneLine(r.Summary)
		}
		if r.Error != "" {
			s += "; error: " + oneLine(r.Error)
		}
		for _, e := range r.Effects {
			s += "; effect " + EffectText(e)
		}
		if n := len(r.Output); n > 0 {
			s += fmt.Sprintf("; output %d bytes", n)
		}
		return s
	case events.RunSaved:
		return fmt.Sprintf("saved run revision %d (%d bytes, sha256 %.12s)", p.Revision, p.Size, p.Digest)
	case events.EffectsReported:
		texts := make([]string, len(p.Effects))
		for i, e := range p.Effects {
			texts[i] = EffectText(e)
		}
		noun := "effects"
		if len(p.Effects) == 1 {
			noun = "effect"
		}
		return fmt.Sprintf("reported %d %s: %s", len(p.Effects), noun, strings.Join(texts, ", "))
	case events.RetryScheduled:
		s := fmt.Sprintf("attempt %d %s", p.Attempt-1, strings.ReplaceAll(p.Cause, "_", " "))
		if p.Result != nil && p.Result.Error != "" {
			s += ": " + oneLine(p.Result.Error)
		}
		if p.Result != nil {
			for _, e := range p.Result.Effects {
				s += "; effect " + EffectText(e)
			}
		}
		return s + fmt.Sprintf("; attempt %d at %s", p.Attempt, ts(p.NextAt))
	case events.Canceled:
		return "canceled: " + p.Reason
	case events.MailboxAppended:
		return fmt.Sprintf("mailbox #%d (%s): %s", p.Index, p.Message.ID, text(p.Message.Content))
	case events.MailboxRead:
		return fmt.Sprintf("messages up to #%d handed out", p.Cursor)
	case events.CheckFailed:
		s := fmt.Sprintf("stop check failed %d times since %s (fail-open): cancellation could not be verified", p.Failures, ts(p.Since))
		if p.Error != "" {
			s += "; error: " + oneLine(p.Error)
		}
		return s
	case events.SlotAcquired:
		return fmt.Sprintf("took a slot of concurrency key %q (limit %d)", p.Key, p.Limit) + attemptText(p.Attempt)
	case events.SlotReleased:
		if p.Status == string(aggregate.StatusScheduled) {
			return fmt.Sprintf("gave back its slot of concurrency key %q (retried)", p.Key) + attemptText(p.Attempt)
		}
		return fmt.Sprintf("gave back its slot of concurrency key %q (task %s)", p.Key, p.Status) + attemptText(p.Attempt)
	}
	return describeSchedule(ev)
}

// attemptText names a slot's attempt, stored as 0 for the first: nothing
// for the first, "for attempt N" for a later one.
func attemptText(attempt int) string {
	if attempt <= 1 {
		return ""
	}
	return fmt.Sprintf(" for attempt %d", attempt)
}

// SlotTask returns the task a concurrency key's event is about, "" for
// any other event.
func SlotTask(ev events.Event) string {
	switch p := ev.Data.(type) {
	case events.SlotAcquired:
		return p.TaskID
	case events.SlotReleased:
		return p.TaskID
	}
	return ""
}

// EffectText says in a few words what an effect is: its kind, ref and
// url, and whether it is uncertain.
func EffectText(e events.Effect) string {
	s := strings.TrimSpace(strings.Join([]string{e.Kind, e.Ref, e.URL}, " "))
	if e.Uncertain {
		s += " (uncertain)"
	}
	return s
}

// labelText lists labels as k=v in key order, "" for none.
func labelText(labels map[string]string) string {
	pairs := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		pairs = append(pairs, k+"="+oneLine(labels[k]))
	}
	return strings.Join(pairs, " ")
}

func text(parts []events.ContentPart) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return oneLine(b.String())
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// WriteText prints a timeline for a terminal: times relative to the first
// entry, the status after each event, and what it meant.
func WriteText(w io.Writer, entries []Entry, withTask bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "SEQ\t+TIME\tEVENT\tSTATUS\tACTOR\tDETAIL"
	if withTask {
		head = "SEQ\t+TIME\tTASK\tEVENT\tSTATUS\tACTOR\tDETAIL"
	}
	fmt.Fprintln(tw, head)
	for _, e := range entries {
		rel := "+" + e.At.Sub(entries[0].At).Round(time.Millisecond).String()
		if withTask {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, rel, e.TaskID, e.Type, e.Status, e.Actor, e.Detail)
		} else {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.Seq, rel, e.Type, e.Status, e.Actor, e.Detail)
		}
	}
	if len(entries) > 0 {
		fmt.Fprintf(tw, "\nfirst event at %s\n", entries[0].At.Format(time.RFC3339Nano))
	}
	return tw.Flush()
}

// WriteNDJSON prints one JSON entry per line, for tools.
func WriteNDJSON(w io.Writer, entries []Entry) error {
	enc := json.NewEncoder(w)
	for _, e := range entries {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return nil
}
