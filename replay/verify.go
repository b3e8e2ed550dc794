package replay

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/taskledger/taskledger/aggregate"
	"github.com/taskledger/taskledger/events"
)

// Kinds of violation the verifier reports.
const (
	Undecodable    = "undecodable"    // bytes that are not a known event (type, version, shape)
	WrongSubject   = "wrong_subject"  // stored on a subject other than its task's
	Gap            = "gap"            // event number is not the previous one plus one
	NoCreation     = "no_creation"    // the first event is not TaskScheduled or AdmissionRejected
	AfterTerminal  = "after_terminal" // a change after the task became terminal
	TokenReused    = "token_reused"   // a delivery token claimed more than once
	StaleClaim     = "stale_claim"    // a Claimed that does not match the then-current token
	IllegalEvent   = "illegal"        // an event the transition table does not allow here
	DuplicateEvent = "duplicate_id"   // an event id seen before
	BrokenLink     = "broken_link"    // prev is not the hash of the task's previous event
	Missing        = "missing"        // stream sequences absent from an append-only log
	Truncated      = "truncated"      // the log ends before its saved chain head
	HeadMismatch   = "head_mismatch"  // the message at the saved chain head is not the one saved
	BadRetry       = "bad_retry"      // a retry of a task that was not the same customer's terminal task
	// Runs (VerifyRuns): a stored Run revision the log's RunSaved does
	// not vouch for.
	RunMismatch   = "run_mismatch"   // a stored Run revision hashes to another digest than its RunSaved
	RunUnreadable = "run_unreadable" // a Run revision the log records is gone or cannot be read back
	// Concurrency (verifykeys.go): a concurrency key's promise broken.
)

// Violation is one broken invariant, located by log position (with one
// shard, the stream sequence) and task.
type Violation struct {
	Seq    events.Position `json:"seq"`
	TaskID string          `json:"taskId,omitempty"`
	Kind   string          `json:"kind"`
	Detail string          `json:"detail"`
}

// Report summarises a verification.
type Report struct {
	Events    int `json:"events"`
	Tasks     int `json:"tasks"`
	Schedules int `json:"schedules,omitempty"`
	// LastSeq is the last sequence read; on a sharded log the sum of
	// every shard's (so a log without holes has LastSeq = Events).
	LastSeq    uint64      `json:"lastSeq"`
	Violations []Violation `json:"violations"`
}

// Clean reports whether no invariant was broken.
func (r Report) Clean() bool { return len(r.Violations) == 0 }

// Verifier checks a log fed to it in stream order. Each event must be
// exactly the event the aggregate's Decide would produce for the command
// it records, on the state the task's earlier events give; on top of that
// it checks what the design promises explicitly (tokens, numbering,
// terminal states) so a violation is named precisely. Not safe for
// concurrent use.
type Verifier struct {
	subjects events.Subjects
	shards   events.Shards
	partial  bool     // the log holds only part of history (Partial)
	lastSeqs []uint64 // by shard, the stream sequence of the last message added
	starts   []uint64 // by shard, the first sequence its stream holds (StartAt), 0 for 1
	retries  []retry  // on a sharded log, checked by Report
	// slotUsers are the tasks key events name from another shard,
	// checked by Report.
	slotUsers []slotUser
	tasks     map[string]*aggregate.State
	keys      map[string]*aggregate.KeyState // concurrency keys by key id
	// schedules are the schedules' states by scheduleKey.
	schedules map[string]*aggregate.ScheduleState
	claimed   map[string]string // delivery token → task that claimed it
	numbers   map[string]int    // task → number of its previous event
	ids       map[string]struct{}
	chain     *Chain                   // the keyed chain's rule
	heads     []head                   // the saved chain heads (a sharded log's: one a shard), if any
	runs      map[string]*runRevisions // task → the Run revisions its RunSaved events record
	report    Report
}

// runRevisions are the Run revisions first, first+1, ... of one task
// the log records: each one's RunSaved position and digest.
type runRevisions struct {
	first   uint64
	seqs    []events.Position
	digests []string
}

// head is the chain head a log must still hold, and whether it was seen.
type head struct {
	seq  events.Position
	hash events.Hash
	seen bool
}

// NewVerifier returns a verifier for a log using subjects.
func NewVerifier(subjects events.Subjects) *Verifier {
	return &Verifier{subjects: subjects, lastSeqs: make([]uint64, 1), starts: make([]uint64, 1), tasks: map[string]*aggregate.State{}, keys: map[string]*aggregate.KeyState{}, schedules: map[string]*aggregate.ScheduleState{}, claimed: map[string]string{}, numbers: map[string]int{}, ids: map[string]struct{}{}, runs: map[string]*runRevisions{}, chain: NewChain(nil, nil)}
}

// Keyed tells the verifier the log's keyed chain (NewChain): its keys and
// where each part's stream began to be keyed. Without it, the verifier
// checks no MAC and reports the first keyed event (no key was given).
// Call it before the first Add; nil is NewChain(nil, nil).
func (v *Verifier) Keyed(c *Chain) {
	if c == nil {
		c = NewChain(nil, nil)
	}
	v.chain = c
}

// Shard tells the verifier how the log is sharded (one shard unless
// called): Add then takes positions (docs/DESIGN.md, "Sharded log"),
// looks for missing sequences in each shard and expects each event on
// its shard's subject. Call it before the first Add.
func (v *Verifier) Shard(shards events.Shards) {
	v.shards, v.lastSeqs, v.starts = shards, make([]uint64, shards.N()), make([]uint64, shards.N())
}

// ExpectHead tells the verifier a saved chain head of the log: the
// stream (of a sharded log: the shard of position seq) must reach seq and
// hold there a message whose SHA-256 is hash. Call it, once per head,
// before the first Add.
func (v *Verifier) ExpectHead(seq events.Position, hash events.Hash) {
	v.heads = append(v.heads, head{seq: seq, hash: hash})
}

// Report returns what the verifier found so far; once every message has
// been added, that includes a log that ends before its saved chain head.
func (v *Verifier) Report() Report {
	r := v.report
	r.Tasks, r.Schedules = len(v.tasks), len(v.schedules)
	for _, rt := range v.retries { // a sharded log's, checked at its end
		if detail := v.retryProblem(rt, "at its end"); detail != "" {
			r.Violations = append(slices.Clip(r.Violations), Violation{Seq: rt.seq, TaskID: rt.taskID, Kind: BadRetry, Detail: detail})
		}
	}
	for _, u := range v.slotUsers { // a sharded log's, checked at its end
		if detail := v.slotUserProblem(u); detail != "" {
			r.Violations = append(slices.Clip(r.Violations), Violation{Seq: u.seq, TaskID: u.keyID, Kind: Concurrency, Detail: detail})
		}
	}
	for _, h := range v.heads {
		shard, seq := v.shards.Split(h.seq)
		if h.seq == 0 || h.seen || seq < v.starts[shard] {
			continue // none, found, or in a removed epoch (its archive holds it)
		}
		last := v.shards.Position(shard, v.lastSeqs[shard]) // r.LastSeq with one shard
		kind, detail := Truncated, fmt.Sprintf("the log ends at sequence %d, before its saved chain head at %d: its last events are gone", last, h.seq)
		if last >= h.seq {
			kind, detail = HeadMismatch, fmt.Sprintf("the message at the saved chain head's sequence %d is missing", h.seq)
		}
		r.Violations = append(slices.Clip(r.Violations), Violation{Seq: h.seq, Kind: kind, Detail: detail})
	}
	return r
}

func (v *Verifier) fail(seq events.Position, taskID, kind, format string, args ...any) {
	v.report.Violations = append(v.report.Violations, Violation{Seq: seq, TaskID: taskID, Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// Add checks the message stored at log position seq on subject. Messages
// must be added in stream order; a sequence skipped is reported as
// missing (the event stream denies deletes, so nothing may leave a hole).
func (v *Verifier) Add(seq events.Position, subject string, data []byte) {
	shard, raw := v.shards.Split(seq)
	if last := v.lastSeqs[shard]; raw > last+1 {
		v.fail(seq, "", Missing, "sequences %d to %d are absent", last+1, raw-1)
	}
	if raw > v.lastSeqs[shard] { // always, when added in stream order
		v.report.LastSeq += raw - v.lastSeqs[shard]
		v.lastSeqs[shard] = raw
	}
	v.report.Events++
	for i := range v.heads {
		if h := &v.heads[i]; seq == h.seq {
			h.seen = true
			if events.HashOf(data) != h.hash {
				v.fail(seq, taskFromSubject(subject), HeadMismatch, "the message at the saved chain head is not the one saved")
			}
		}
	}
	ev, err := events.DecodeHashed(data, seq)
	if err != nil {
		v.fail(seq, taskFromSubject(subject), Undecodable, "%v", err)
		return
	}
	if kind, detail := v.chain.Check(shard, raw, ev, data); kind != "" {
		v.fail(seq, ev.TaskID, kind, "%s", detail)
	}
	if events.KeyEvent(ev.Type()) {
		v.addKey(ev, subject, shard)
		return
	}
	if want := v.shards.Subjects(v.subjects, shard).Of(ev); subject != want {
		v.fail(seq, ev.TaskID, WrongSubject, "stored on %s, belongs on %s", subject, want)
	}
	if want := v.partOf(ev, shard); want != shard {
		v.fail(seq, ev.TaskID, WrongSubject, "stored in part %d, belongs in part %d", shard, want)
	}
	if _, dup := v.ids[ev.ID]; dup {
		v.fail(seq, ev.TaskID, DuplicateEvent, "event id %s seen before", ev.ID)
	}
	v.ids[ev.ID] = struct{}{}
	if events.IsSchedule(ev.Type()) {
		v.addSchedule(ev)
		return
	}

	st := v.tasks[ev.TaskID]
	if st == nil {
		st = &aggregate.State{}
		v.tasks[ev.TaskID] = st
	}
	// Compared with the previous event's number, not the count of events
	// seen, so one missing event is reported once, not at every later one.
	if prev := v.numbers[ev.TaskID]; ev.Number != prev+1 {
		v.fail(seq, ev.TaskID, Gap, "event number %d after %d", ev.Number, prev)
	}
	v.numbers[ev.TaskID] = ev.Number
	// A v1 event predates the chain and starts it; from v2 on each event
	// names the hash of its task's previous one (none for the first).
	if ev.Version >= 2 && ev.Prev != st.LastHash {
		v.fail(seq, ev.TaskID, BrokenLink, "event %d names previous hash %s, the task's previous event hashes to %s", ev.Number, short(ev.Prev), short(st.LastHash))
	}
	v.checkTransition(*st, ev)
	v.checkSlot(*st, ev, shard)
	before := st.Run.Revision
	*st = aggregate.Apply(*st, ev)
	if p, ok := ev.Data.(events.RunSaved); ok && st.Run.Revision != before {
		v.addRun(ev.Seq, ev.TaskID, p)
	}
}

// shardOf is the shard ev belongs in: its schedule's or key's, else its
// lineage's (its root from the task's first event).
func (v *Verifier) shardOf(ev events.Event) int {
	return v.shards.OfEvent(ev, v.rootOf(ev))
}

// partOf is the part ev, stored in part at, belongs in: without epochs
// its shard; with epochs a key's or schedule's shard, or its lineage's
// part (the root's), a new lineage's being its shard in at's epoch slot.
func (v *Verifier) partOf(ev events.Event, at int) int {
	shard := v.shardOf(ev)
	if v.shards.Slots == 0 || events.IsSchedule(ev.Type()) {
		return shard
	}
	for _, id := range []string{ev.TaskID, v.rootOf(ev)} {
		if st := v.tasks[id]; st != nil && st.FirstSeq > 0 {
			return v.partOfTask(*st)
		}
	}
	slot, _ := v.shards.SlotOf(at)
	return v.shards.Part(max(slot, 0), shard)
}

// rootOf returns the root of ev's task: its state's, or its creation's.
func (v *Verifier) rootOf(ev events.Event) string {
	if st := v.tasks[ev.TaskID]; st != nil && st.Spec.RootID != "" {
		return st.Spec.RootID
	}
	return events.CreationRoot(ev)
}

// partOfTask returns the part holding st's task: its first event's.
func (v *Verifier) partOfTask(st aggregate.State) int {
	return st.FirstSeq.Part(v.shards)
}

// StartAt tells the verifier that part's stream starts at stream
// sequence first: the sequences before it belonged to a removed epoch
// (eventlog.RemoveEpoch) and are not missing, nor is a saved chain head
// among them, and the log is Partial. Call it before the first Add.
func (v *Verifier) StartAt(part int, first uint64) {
	if first > v.lastSeqs[part]+1 {
		v.lastSeqs[part], v.starts[part] = first-1, first
		v.partial = true
	}
}

// Partial tells the verifier that the log it reads holds only part of
// history: an archive of one epoch, or a log some of whose epochs were
// removed. A retry's original or a key's task it does not hold may then
// be in another epoch, and is not a violation; one it holds is checked.
// Call it before the first Add.
func (v *Verifier) Partial() { v.partial = true }

// checkTransition reports why ev could not have been decided on st.
func (v *Verifier) checkTransition(st aggregate.State, ev events.Event) {
	switch p := ev.Data.(type) {
	case events.TaskScheduled, events.AdmissionRejected:
		if st.Exists() {
			v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s for a task that already exists", ev.Type())
			return
		}
		v.checkRetry(ev)
	case events.MailboxRead: // a check may read the mailbox of a terminal task
		if !st.Exists() {
			v.fail(ev.Seq, ev.TaskID, NoCreation, "%s before the task was scheduled", ev.Type())
			return
		}
	default:
		if !st.Exists() {
			v.fail(ev.Seq, ev.TaskID, NoCreation, "%s before the task was scheduled", ev.Type())
			return
		}
		if st.Status.Terminal() && ev.Type() != events.TypeMailboxAppended {
			v.fail(ev.Seq, ev.TaskID, AfterTerminal, "%s after the task became %s", ev.Type(), st.Status)
			return
		}
		if c, ok := p.(events.Claimed); ok {
			if other, seen := v.claimed[c.DeliveryID]; seen {
				v.fail(ev.Seq, ev.TaskID, TokenReused, "token %s already claimed (task %s)", c.DeliveryID, other)
				return
			}
			v.claimed[c.DeliveryID] = ev.TaskID
			if c.DeliveryID != st.Delivery.ID {
				v.fail(ev.Seq, ev.TaskID, StaleClaim, "claimed token %s, current token is %q", c.DeliveryID, st.Delivery.ID)
				return
			}
		}
	}
	cmd := commandFor(ev)
	got, err := aggregate.Decide(st, cmd, ev.At)
	switch {
	case err != nil:
		v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s from status %s: %v", ev.Type(), describe(st), err)
	case len(got) != 1:
		v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s changes nothing from status %s (a duplicate)", ev.Type(), describe(st))
	case !reflect.DeepEqual(got[0].Data, ev.Data):
		v.fail(ev.Seq, ev.TaskID, IllegalEvent, "%s is not what the transition decides: logged %+v, expected %+v", ev.Type(), ev.Data, got[0].Data)
	}
}

// checkRetry reports a new task that retries (spec.RetryOf) a task the
// log does not hold before it, another customer's, or one not terminal
// then: the service retries only the caller's terminal tasks.
func (v *Verifier) checkRetry(ev events.Event) {
	var spec events.TaskSpec
	switch p := ev.Data.(type) {
	case events.TaskScheduled:
		spec = p.Spec
	case events.AdmissionRejected:
		spec = p.Spec
	}
	if spec.RetryOf == "" {
		return
	}
	r := retry{seq: ev.Seq, taskID: ev.TaskID, customerID: ev.CustomerID, of: spec.RetryOf}
	if v.shards.N() > 1 {
		// A retry is a root of its own, in its own shard: the task it
		// retries may be in a shard read later.
		v.retries = append(v.retries, r)
	} else if detail := v.retryProblem(r, "before it"); detail != "" {
		v.fail(ev.Seq, ev.TaskID, BadRetry, "%s", detail)
	}
}

// retry is a new task that retries another.
type retry struct {
	seq                    events.Position
	taskID, customerID, of string
}

// retryProblem says what is wrong with r given the task it retries as
// the verifier holds it now (when: "before it", or at the log's end), or
// returns "".
func (v *Verifier) retryProblem(r retry, when string) string {
	switch of := v.tasks[r.of]; {
	case (of == nil || !of.Exists()) && v.partial:
		return ""
	case of == nil || !of.Exists():
		return fmt.Sprintf("retries task %s, which the log does not hold %s", r.of, when)
	case of.CustomerID != r.customerID:
		return fmt.Sprintf("retries task %s of another customer", r.of)
	case !of.Status.Terminal():
		return fmt.Sprintf("retries task %s while it is %s", r.of, of.Status)
	}
	return ""
}

// short abbreviates a hash for a violation's detail.
func short(h events.Hash) string {
	if h.IsZero() {
		return "(none)"
	}
	return fmt.Sprintf("%x…", h[:6])
}

func describe(st aggregate.State) string {
	if !st.Exists() {
		return "(none)"
	}
	return string(st.Status)
}

// commandFor is the command whose decision the event records.
func commandFor(ev events.Event) aggregate.Command {
	switch p := ev.Data.(type) {
	case events.TaskScheduled:
		return aggregate.Schedule{TaskID: ev.TaskID, CustomerID: ev.CustomerID, Spec: p.Spec, DeliveryID: p.DeliveryID, NextAt: p.NextAt}
	case events.AdmissionRejected:
		return aggregate.Reject{TaskID: ev.TaskID, CustomerID: ev.CustomerID, Spec: p.Spec, Reason: p.Reason}
	case events.DeliveryPending:
		return aggregate.ReleaseDue{DeliveryID: p.DeliveryID, NextAt: p.NextAt}
	case events.DeliveryRetryScheduled:
		return aggregate.RetryDelivery{DeliveryID: p.DeliveryID, NextAt: p.NextAt, Error: p.Error}
	case events.DeliveryExhausted:
		return aggregate.ExhaustDelivery{DeliveryID: p.DeliveryID, Reason: p.Reason}
	case events.ReadyPublished:
		return aggregate.MarkReadyPublished{DeliveryID: p.DeliveryID, ReadySeq: p.ReadySeq}
	case events.ReadyRepublished:
		return aggregate.RepublishReady{DeliveryID: p.DeliveryID, LostSeq: p.LostSeq, ReadySeq: p.ReadySeq}
	case events.Claimed:
		return aggregate.Claim{DeliveryID: p.DeliveryID, ExecutorID: p.ExecutorID, HeartbeatSeconds: p.HeartbeatSeconds}
	case events.TimedOut:
		return aggregate.TimeOut{}
	case events.ClaimLost:
		return aggregate.LoseClaim{DeliveryID: p.DeliveryID, Reason: p.Reason, Note: p.Note}
	case events.ResultRecorded:
		return aggregate.RecordResult{DeliveryID: p.DeliveryID, Result: p.Result}
	case events.EffectsReported:
		return aggregate.ReportEffects{DeliveryID: p.DeliveryID, Effects: p.Effects}
	case events.RunSaved:
		return aggregate.SaveRun{DeliveryID: p.DeliveryID, Revision: p.Revision, Digest: p.Digest, Size: p.Size}
	case events.RetryScheduled: // the result or the timeout it was decided for
		if p.Cause == events.RetryOnTimedOut {
			return aggregate.TimeOut{}
		}
		var r events.Result
		if p.Result != nil {
			r = *p.Result
		}
		return aggregate.RecordResult{DeliveryID: p.DeliveryID, Result: r}
	case events.Canceled:
		return aggregate.Cancel{Reason: p.Reason}
	case events.MailboxAppended:
		return aggregate.AppendMail{Message: p.Message}
	case events.MailboxRead:
		return aggregate.ReadMail{Cursor: p.Cursor}
	case events.CheckFailed:
		return aggregate.RecordCheckFailed{Since: p.Since, Failures: p.Failures, Error: p.Error}
	}
	return nil
}

// taskFromSubject returns the last token of a subject, the task id on a
// well-formed log subject.
func taskFromSubject(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}
