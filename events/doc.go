// Package events defines taskledger's log: the v1 event types, the
// envelope every event travels in, its msgpack codec, subject naming and id
// validation. It is the leaf of the module and imports nothing else of ours.
//
// # Envelope and codec
//
// Events are msgpack (vmihailenco/msgpack/v5) with a fixed envelope:
//
//   - id — field: ID; meaning: event id, a ULID; on a replicated stream also
//     the Nats-Msg-Id of its append
//   - t — field: Type; meaning: event type name
//   - v — field: Version; meaning: schema version of the type (2 today,
//     TaskScheduled 3; the payloads of 1 and 2 are the same, and a
//     TaskScheduled before v3 is one not released)
//   - task — field: TaskID; meaning: the task
//   - cust — field: CustomerID; meaning: its owner
//   - n — field: Number; meaning: 1-based position in the task's history,
//     gap-free per task
//   - at — field: At; meaning: when the scheduler decided it (UTC)
//   - actor — field: Actor; meaning: the scheduler process (--name), or the
//     executor id for a claim
//   - prev — field: Prev; meaning: since v2: the SHA-256 (32 bytes) of the
//     stored bytes of the task's previous event; absent on its first
//   - kid — field: Key; meaning: on a keyed event (below, "Keyed chain"):
//     the id of the chain key that signed it; absent on an unkeyed one
//   - data — field: Data; meaning: the payload, keyed by its JSON field names
//   - mac — field: none (Keyring.Verify reads it); meaning: on a keyed event, always the last
//     field: the HMAC-SHA256, under key kid, of every stored byte of the
//     event before the MAC's own 32 bytes; absent on an unkeyed one
//
// The event type is also the Tl-Type header, so a consumer can skip an event
// without decoding it. events.Decode never panics: bytes that are not a
// well-formed envelope, an id that is not valid, or a number outside 1..2^31
// wrap ErrMalformed; an unknown type wraps ErrUnknownType; a version of 0 or
// newer than the build knows wraps ErrUnknownVersion. The current version
// decodes in one pass; anything else goes through upcast, the one place that
// turns older payload bytes into the current structs.
//
// Hash chain. Each event names the SHA-256 of its task's previous event's
// stored bytes, so an event edited, removed or reordered inside a task breaks
// the next link. The store computes the hash from bytes it already has: the
// append's own encoding (kept in the state cache as State.LastHash) and, on a
// load or a catch-up after a conflict, the bytes it read; no append reads
// anything extra. Version 2 added prev to the envelope; a v1 event has none
// and is accepted as the start of a chain (the committed v1 fixture still
// decodes), and the next v2 event links to its bytes. The chain cannot vouch
// for the last events of the stream: a chain head (the last sequence and the
// SHA-256 of the message there, JSON in the object chainhead of
// <stream>_SNAPSHOTS) is saved after every projection snapshot and at clean
// shutdown. At start the node checks the log against it (two reads) and logs a
// warning, shown on /readyz as log, when the log ends before it or holds
// another message there, or when the stream counts deleted sequences; the
// projections also warn about sequences they find missing as they read. replay
// verify checks all of it over the whole log. What JetStream does with damaged
// files, tried on nats-server 2.15.2: a flipped byte in a block file fails the
// record's checksum and the server drops that message without a word (a hole:
// missing, and a broken_link or gap on its task); a tail cut off the last
// block is dropped too, while the stream's state still names the old last
// sequence (truncated against the head; the projections target the last
// message that is really stored, not the state's sequence, or they would wait
// for it forever). With no head saved (a first crash before any snapshot or
// clean shutdown) a cut tail is invisible.
//
// Keyed chain. The hash chain alone proves nothing against someone who
// can write to the event stream: they can append a well-formed event with
// the right number and the right SHA-256 link. So each event the scheduler
// appends is keyed: it names a chain key (kid) and ends with the
// HMAC-SHA256 of its own bytes under that key (mac), bytes that include
// its prev link, so every event vouches for itself and, through prev, for
// its task's history before it. The keys (Keyring) are the scheduler's and
// live outside the log (a key file, internal/chainkey; docs/operations.md,
// "Chain key"); whoever lacks them can neither sign a new event nor change
// a signed one. Signing is in the encoder (Keyring.AppendEncode: the MAC's
// place is written as zeros, the bytes before it are signed, and the MAC
// is copied in place), with pooled HMAC states, so it allocates nothing
// more than an unkeyed encode; the link (prev, State.LastHash) stays the
// SHA-256 of the stored bytes, so readers that continue a chain, chain
// heads and archives are unchanged. Decode checks the shape only (a kid
// with a 32-byte mac that is the event's last bytes, or neither); whether
// the MAC verifies is Keyring.Verify's, which needs the key. Keying adds
// a field and no schema version: a build from before keying reads keyed
// events as the v2 events they also are.
//
// No downgrade. An attacker's unkeyed event is refused by position, not
// by what it claims: replay.Chain, the one rule replay verify and the
// scheduler's own checks apply, accepts an unkeyed event only in a stream
// that held events before its log was keyed, and there only below the
// sequence the key file records as the stream's first keyed one
// (keyedFrom); every later event, in any stream, must be keyed. A new log
// is keyed from its first event. So v1 and v2 events written before keying
// verify by their hash links as always, and an unkeyed (or v1, linkless)
// event appended after keying is a violation (unkeyed), as is a MAC that
// does not verify (bad_mac) and a key id the key file does not hold
// (unknown_key). Rotation adds a key with a higher id, which signs from
// then on; the older keys stay in the file and verify what they signed.
// replay verify checks every event; the scheduler checks each once (at
// start those after the saved chain heads, then those a head is about to
// move past) and warns (log, /readyz) rather than refuse to start; it
// refuses only a keyed log whose key file is missing (internal/node).
// What the MAC cannot tell: a byte-for-byte copy of a signed event, stored
// again, is signed; it repeats an event id and an event number, which
// replay verify reports (duplicate_id, gap). The chain heads and the
// snapshots are not signed: the NATS permissions keep writers out of them.
//
// Schema evolution. To change a payload: bump that type's version in
// events/codec.go, add a case to upcast that reads the old bytes into the new
// struct, and keep the committed v1 fixture (events/testdata) passing: it
// proves an old log still replays. Never rename an event type; add a new one.
//
// # Event types (v1)
//
//   - TaskScheduled (v3) — payload (JSON names): spec: rootId, parentId,
//     requestId, relatedTaskId, queue, signal, repo, message, runAt,
//     timeoutSeconds, retry (maxAttempts, backoffSeconds, maxBackoffSeconds,
//     on; absent without a policy), optional concurrency, labels, retryOf,
//     kind and payload (compact JSON);
//     since v3 optional deliveryId, nextAt; meaning: the task was accepted; it
//     waits for runAt. With deliveryId it was due when scheduled and is
//     released in the same event, as a DeliveryPending (attempt 1, due at
//     nextAt) would release it: one write fewer
//   - AdmissionRejected — payload (JSON names): spec (as above), reason;
//     meaning: admission refused a new root task; the candidate is kept
//     (canceled) so a retry with its request id gets the same answer
//   - DeliveryPending — payload (JSON names): deliveryId, attempt (1), nextAt;
//     meaning: released: a ready notification with this token is due at nextAt
//   - DeliveryRetryScheduled — payload (JSON names): deliveryId, attempt,
//     nextAt, error; meaning: publishing failed; attempt attempt of the same
//     token is due at nextAt
//   - DeliveryExhausted — payload (JSON names): deliveryId, attempts, reason;
//     meaning: the notification could not be published within the delivery
//     budget; the task failed
//   - ReadyPublished — payload (JSON names): deliveryId, readySeq (optional:
//     absent in events written before it); meaning: the notification for this
//     token is in the ready stream, at that sequence
//   - ReadyRepublished — payload (JSON names): deliveryId, lostSeq (absent:
//     unknown), readySeq; meaning: the queued task's notification, last at
//     lostSeq, was gone from the ready stream and was published again, same
//     token, at readySeq
//   - Claimed — payload (JSON names): deliveryId, executorId, deadline,
//     heartbeatSeconds (optional: absent for a claim without heartbeats);
//     meaning: an executor consumed the token and owns the run until deadline,
//     renewing it within every heartbeatSeconds if set
//   - ClaimLost — payload (JSON names): deliveryId, executorId, reason
//     (heartbeat or released), note (optional: the releaser's reason), attempt
//     (the next one; absent: none was left); meaning: the claim ended without
//     a result: its executor missed a heartbeat or handed it back. With
//     attempt the task is scheduled again, due at once (a new token follows);
//     without, it timed out
//   - TimedOut — payload (JSON names): deadline; meaning: the running deadline
//     passed without a result
//   - ResultRecorded — payload (JSON names): deliveryId (optional), result:
//     success, summary, error, effects, retryable (optional), output
//     (optional, compact JSON); meaning: the task finished
//   - EffectsReported — payload (JSON names): deliveryId, effects: each kind,
//     ref, url, uncertain, at; meaning: the run under this claim made these
//     effects (before its result, if any)
//   - RunSaved — payload (JSON names): deliveryId, revision, digest (SHA-256
//     of the revision's canonical JSON, lowercase hex), size (its bytes);
//     meaning: the run under this claim saved that revision of the task's
//     Run (the previous revision plus one); its bytes are kept beside the
//     log, in the runs bucket
//   - RetryScheduled — payload (JSON names): attempt (the next one), nextAt,
//     cause (failed or timed_out), deliveryId and result (cause failed: the
//     failure as reported), deadline (cause timed_out); meaning: the attempt
//     before attempt ended without success and the task is scheduled again,
//     due at nextAt
//   - Canceled — payload (JSON names): reason; meaning: someone canceled the
//     task (reason ancestor_terminal: the scheduler did, at its claim or
//     release, because an ancestor had ended)
//   - MailboxAppended — payload (JSON names): index, message: id, createdAt,
//     content; meaning: a message was added at the 1-based index
//   - MailboxRead — payload (JSON names): cursor; meaning: the scheduler
//     handed out messages up to the cursor
//   - CheckFailed — payload (JSON names): since, failures, error; meaning:
//     stop checks of the task failed (fail-open, check_failed) from since
//     on, failures of them, the last with error: whether it should stop
//     could not be verified then; at most one a minute per task
//   - SlotAcquired — payload (JSON names): key, taskId, limit, attempt (absent
//     for the first); meaning: on a concurrency key's subject: the task took
//     one of the key's slots for that attempt; the key had fewer than limit
//     holders
//   - SlotReleased — payload (JSON names): key, taskId, status, attempt (the
//     slot's, absent for the first); meaning: on a concurrency key's subject:
//     the holder gave its slot back, being terminal (status, empty when the
//     alarm no longer knew it) or retried past the slot's attempt (status
//     scheduled)
//   - ScheduleCreated — payload (JSON names): spec: cron, every, timezone,
//     task (a task spec without ids, retryOf and runAt; its labels, retry and
//     concurrency go to every run's task), overlap, catchup; paused; meaning:
//     a schedule was created (or created again after a delete); instants after
//     the event are due
//   - ScheduleUpdated — payload (JSON names): spec; meaning: a live schedule's
//     spec changed; instants after the event are due
//   - SchedulePaused, ScheduleResumed, ScheduleDeleted — payload (JSON names):
//     (none); meaning: the schedule stopped firing, fires again from now,
//     stopped for good (its history is kept)
//   - ScheduleFired — payload (JSON names): at, taskId, requestId, skipped
//     (overlap, missed), missed, manual; meaning: a fire of instant at (a
//     trigger's: its time): the run whose task is taskId, or no run when
//     skipped; missed earlier instants passed over
//
// spec.concurrency (key, limit) is left out of the stored bytes when absent,
// so a TaskScheduled without one is stored as before: an addition that old
// events mean as "no limit", not a change of shape.
//
// A spec's retry and a result's retryable are left out of the stored bytes
// when unset, so events without them are stored as before and still decode at
// version 2 (no upcast): a task without a policy has one attempt, a result
// without retryable is retryable.
//
// A spec's labels (a map of key=value pairs, encoded in key order so a spec
// always has the same bytes) and retryOf (the terminal task a manual retry
// repeats, also its relatedTaskId) were added the same way: absent from the
// stored bytes when empty, so every spec written before them is stored and
// decoded exactly as before (no labels, not a retry), and they need no version
// of their own (the spec reads the same at every version). A label never
// changes after the task is scheduled, and a child does not inherit its
// parent's.
//
// A spec's kind and payload (the job's type, ValidKind, and its arguments as
// compact JSON of at most MaxPayloadBytes) and a result's output (compact
// JSON, at most MaxOutputBytes) were added the same way: absent when unset,
// so earlier events are stored and decoded as before. The payload is a
// msgpack bin holding the JSON text, so the stored bytes of a payload are
// the bytes the aggregate accepted. A ready notification carries the kind,
// never the payload.
//
// Manual retry (POST /v1/tasks/{id}/retry) appends no event to the retried
// task, which is terminal and stays as it is: it schedules a new root task
// whose spec aggregate.RetrySpec derives from the old task's state (its spec,
// retry policy and concurrency included, without root, parent, request id and
// runAt, with relatedTaskId and retryOf naming it; ErrNotTerminal for a live
// task). The new task's TaskScheduled (or AdmissionRejected, as any new root)
// is the fact; the retried task being terminal is final, so no race can undo
// the check. With a request id the new id is derived as for schedule, so
// racing retries make one task; a crash after the append is answered by the
// repeat. The verifier checks each retryOf against the log (bad_retry).
//
// An effect's at (since EffectsReported) is omitted from the stored bytes when
// zero, so a ResultRecorded whose effects have no time is stored exactly as
// before and still decodes at version 2: the field is an addition that old
// events mean as "unknown", not a change of shape.
//
// The state keeps every effect reported (State.Effects): each EffectsReported
// and each result's effects merge into one list by kind and ref, a later
// report of the same pair replacing the earlier in its place, so a timed-out
// or canceled task keeps what its run did. The projected task holds the list
// behind a pointer, nil for the tasks that have none, so they do not grow.
//
// Where two facts must land together they are one event (a claim consumes the
// token and starts the run), never two appends or a batch.
package events
