// Package aggregate decides which events a command may append to a task's
// log. It is pure: Apply folds events into a State and Decide turns a
// State and a Command into new events or a typed error. There is no I/O,
// no logger and no clock here; the caller passes the time.
//
// # Statuses and transitions
//
// scheduled, queued, running are live; succeeded, failed, canceled, timed_out
// are terminal. A scheduled task is first waiting for its runAt; once released
// it holds a delivery token and is claimable, before and after its
// notification is published.
//
// Each command of aggregate.Decide, what it needs and what it appends. Any
// command but Schedule and Reject on a task with no events is ErrNotFound.
//
//   - Schedule (POST /v1/tasks) — allowed when: no event yet; appends:
//     TaskScheduled; when it carries a fresh delivery id and the task is due
//     (now ≥ runAt), released in the same event (the token, attempt 1, nextAt
//     as given); status after: scheduled; otherwise: ErrExists (the service
//     answers with the existing task); ErrInvalid for bad ids, rootId/parentId
//     mismatch, timeout out of 1..604800, a retry policy out of its bounds
//     (maxAttempts 1..100, backoffSeconds 0..86400, maxBackoffSeconds
//     0..604800, on: failed and/or timed_out once each; the service fills the
//     defaults first), a field over its limit (message, content parts, repo,
//     signal, labels, kind; events/limits.go, docs/API.md, "Limits"), a
//     payload that is not JSON; a retryOf that is not the relatedTaskId of a
//     root task; ErrTooLarge for a payload over 256 KiB of compact JSON (the
//     payload is stored compact)
//   - Reject (admission) — allowed when: no event yet; appends:
//     AdmissionRejected; status after: canceled (rejected); otherwise: as
//     Schedule; ErrInvalid for a reason over 1 KiB
//   - ReleaseDue (alarm, release queue) — allowed when: scheduled, no delivery
//     yet, now ≥ runAt (after a retry: the retry's nextAt); appends:
//     DeliveryPending (new token, attempt 1, nextAt now); status after:
//     scheduled; otherwise: ErrTerminal; ErrStale if already released or not
//     due; ErrInvalid for a token an earlier attempt was claimed with
//   - MarkReadyPublished (alarm, after a publish) — allowed when: scheduled,
//     this token pending and not yet published; appends: ReadyPublished (with
//     the ready stream sequence); status after: queued; otherwise:
//     ErrTerminal; ErrStale otherwise
//   - RepublishReady (alarm, after publishing a lost notification again) —
//     allowed when: queued, with this token, and the ready sequence found lost
//     is the task's current one; appends: ReadyRepublished (the lost and the
//     new ready stream sequence); status after: queued; otherwise:
//     ErrTerminal; ErrStale otherwise (another process recorded the loss
//     first)
//   - RetryDelivery (alarm, after a failed publish) — allowed when: as
//     MarkReadyPublished; appends: DeliveryRetryScheduled (attempt + 1,
//     nextAt); status after: scheduled; otherwise: as MarkReadyPublished
//   - ExhaustDelivery (alarm, a failed publish past the delivery budget) —
//     allowed when: as MarkReadyPublished; appends: DeliveryExhausted; status
//     after: failed; otherwise: as MarkReadyPublished
//   - Claim (claim, claims/next) — allowed when: scheduled or queued with a
//     token, and the token given is it; appends: Claimed (deadline = now +
//     timeoutSeconds, and the claim's heartbeatSeconds if given); status after:
//     running; otherwise: ErrNotClaimable (any other status, terminal
//     included, or not released); ErrTokenMismatch; ErrInvalid for the
//     executor id or a heartbeatSeconds other than 0 or 1..3600
//   - LoseClaim, reason heartbeat (alarm, running deadline queue, at the
//     claim's heartbeat due time) — allowed when: running under this token,
//     the claim has a heartbeat, now ≥ claimedAt + heartbeatSeconds (renewals
//     are not in the log); appends: ClaimLost (reason heartbeat; attempt + 1
//     while the retry policy, counting charged attempts, has one left);
//     status after: scheduled (no delivery, no claim, due now), or timed_out
//     without an attempt left; otherwise: ErrClaimLost (a token already
//     lost); ErrTerminal; ErrTokenMismatch; ErrStale (not due, no heartbeat)
//   - LoseClaim, reason released (POST release) — allowed when: running under
//     this token; appends: ClaimLost (reason released, the note, attempt + 1:
//     the first 100 releases of a task are not charged to the retry policy;
//     later ones are, as a missed heartbeat); status after: scheduled, due
//     now; otherwise: ErrClaimLost; ErrTerminal; ErrTokenMismatch;
//     ErrInvalid for a note over 1 KiB or another reason
//   - RecordResult, ReportEffects, LoseClaim with the token of a claim that
//     ended in a ClaimLost — in any status: ErrClaimLost (the late executor
//     hears that its claim was lost, not only that its token is stale)
//   - RecordResult (POST result), a failure of a running task whose retry
//     policy has attempts left and lists failed, not marked retryable: false —
//     allowed when: as below; appends: RetryScheduled (attempt + 1, nextAt =
//     now + backoff, cause failed, the result); status after: scheduled (no
//     delivery, no claim); otherwise: as below
//   - RecordResult (POST result) — allowed when: not terminal; with a
//     deliveryId: running and it is the claim's token; appends:
//     ResultRecorded; status after: succeeded or failed; otherwise:
//     ErrTerminal; ErrTokenMismatch; ErrInvalid (over 32 effects, an effect
//     without kind, an effect's kind, ref or url, the summary or the error
//     over its limit, an output that is not JSON); ErrTooLarge for an
//     output over 256 KiB of compact JSON (the output is stored compact);
//     effects past the task's 256 stay in the result only
//   - ReportEffects (POST effects) — allowed when: running, and the deliveryId
//     is the claim's token; appends: EffectsReported (an effect without at
//     gets now); status after: running; otherwise: ErrTerminal;
//     ErrTokenMismatch (any other status or token); ErrInvalid (no effect,
//     over 32, an effect's limits as for a result, more than 256 distinct
//     effects on the task)
//   - SaveRun (PUT run) — allowed when: running, the deliveryId is the
//     claim's token, and the revision is the latest plus one (at most
//     100000); appends: RunSaved (revision, digest, size); status after:
//     running; otherwise: ErrTerminal; ErrTokenMismatch (any other status or
//     token); ErrRunRevision (another revision); ErrInvalid (revision 0 or
//     past the limit, a digest that is not 64 lowercase hex digits, a size
//     under 2)
//   - Cancel (POST cancel) — allowed when: not terminal; appends: Canceled;
//     status after: canceled; otherwise: ErrTerminal; ErrInvalid for a reason
//     over 1 KiB
//   - CancelForAncestor (a claim or release of a task whose ancestor has
//     ended) — allowed when: with a token, as Claim; without, scheduled and
//     not released yet; appends: Canceled (reason ancestor_terminal); status
//     after: canceled; otherwise: with a token as Claim; without, ErrTerminal;
//     ErrStale if already released
//   - TimeOut (alarm, running deadline queue), the retry policy has attempts
//     left and lists timed_out — allowed when: running, now ≥ deadline;
//     appends: RetryScheduled (attempt + 1, nextAt = now + backoff, cause
//     timed_out, the deadline); status after: scheduled (no delivery, no
//     claim); otherwise: ErrTerminal; ErrStale
//   - TimeOut (alarm, running deadline queue) — allowed when: running, now ≥
//     deadline; appends: TimedOut; status after: timed_out; otherwise:
//     ErrTerminal; ErrStale
//   - AppendMail (POST mailbox, child report) — allowed when: a message id
//     seen before: nothing, in any status; a new one: not terminal; appends:
//     MailboxAppended (next index); status after: unchanged; otherwise:
//     ErrTerminal; ErrInvalid (id, no content, content limits)
//   - ReadMail (check by the claim holder) — allowed when: running under
//     the command's delivery token (without one, as a log written before
//     checks named their claim: any status, terminal included); cursor ≤
//     messages; appends: MailboxRead, only when the cursor moves, with the
//     claim's executor as actor; status after: unchanged; otherwise:
//     ErrTokenMismatch; ErrInvalid beyond the last message
//   - RecordCheckFailed (a stop check answered check_failed) — allowed
//     when: not terminal; failures ≥ 1, error within its limit; appends:
//     CheckFailed, only when the last was CheckFailedInterval (a minute) or
//     more before now (else nothing: the caller counts the failures into
//     the next); status after: unchanged; otherwise: ErrTerminal;
//     ErrInvalid
//
// Retries. Running → scheduled is the one transition back, and only
// RetryScheduled makes it. A retry is not a separate command: the aggregate
// decides it in place of the ResultRecorded or TimedOut it would otherwise
// append, from the task's own retry policy (in its TaskScheduled spec) and the
// attempt count (one plus the RetryScheduled events so far), so every attempt
// ends in exactly one event and a result racing the timeout of the same
// attempt is decided by the OCC check like any two commands: the loser finds
// the task no longer running under that claim (ErrTokenMismatch, ErrStale).
// The backoff is pure: nextAt = now + min(maxBackoffSeconds,
// backoffSeconds·2^(n−1)) less a jitter of up to a fifth derived from FNV-1a
// of the task id and n (docs/API.md, "Retries"), so the verifier re-decides
// the same event. The retried task is a scheduled task again (its release
// queue due time is State.DueAt, the retry's nextAt), and its next release
// makes a new token; tokens of earlier attempts are refused. The effects,
// mailbox and Run state carry over. Retrying on timed_out repeats work whose
// effects are unknown, so it is opt-in only.
//
// Attribution. An event the claim's holder causes — a result or a mailbox
// read under the claim's delivery token, effects — names the claim's
// executor id as its actor (Event.Actor); Decide leaves every other
// event's actor empty for the store to name the caller.
//
// An empty result with no error means the command is already satisfied (a
// repeated message id, a cursor that does not move). ErrStale is for reactor
// commands only: a duplicated, late or lagging action that no longer applies.
// Reactors drop it, with ErrTerminal and ErrNotFound. ErrConflict comes from
// the store, never from Decide.
//
// Apply accepts any event (the log is the truth) but never moves a task
// backwards or sideways: an event the list above does not allow from the
// current status (a second TaskScheduled, a Claimed for a running task, a
// lifecycle event after a terminal one, a ReadyPublished for another or
// already claimed token) changes nothing but the version. Decide never
// produces such events and the verifier reports them. So a late ReadyPublished
// after a claim leaves the task running.
//
// The aggregate is pure: no I/O, no logger, no clock (the caller passes now).
// The service maps its errors to the wire once, in internal/httpapi:
// ErrInvalid → 400, ErrNotFound → 404, ErrTerminal, ErrTokenMismatch,
// ErrNotClaimable and the service's ErrParentTerminal → 409 with that reason,
// ErrClaimLost → 409 claim_lost, ErrConflict and unavailability → 503.
//
// # The delivery-token rule
//
// A task is claimable only while it is scheduled or queued and holds a
// delivery token (it has been released). A claim must present that token, and
// consumes it and sets running in one event (Claimed), so there is no moment
// when the token is gone but the task is not yet running, and a token is
// claimed at most once: of two racing claims the optimistic concurrency check
// lets one append. A result may name the claim's token, and is then accepted
// only for that running claim; an old executor's late result is refused.
// Tokens are never reused: each release makes a new one.
package aggregate
