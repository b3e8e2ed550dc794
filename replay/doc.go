// Package replay is for auditors: a task's history as a timeline with the
// status after each event, and a verifier that proves the log keeps every
// invariant of the design. It reads no log itself; callers feed it events
// (internal/store reads them).
//
// # The verifier
//
// replay.Verifier takes the log in stream order and requires every event to be
// exactly what Decide would produce, for the command the event records, on the
// state the task's earlier events give. On top of that it checks what the design
// promises, so a violation is named precisely, by stream sequence and
// task:
//
//   - undecodable — violation: bytes that do not decode, or an unknown type or
//     schema version
//   - wrong_subject — violation: an event stored on a subject other than
//     tl.evt.<customer>.<task> of its own task
//   - duplicate_id — violation: an event id seen before
//   - gap — violation: an event number that is not the previous one plus one
//   - no_creation — violation: an event before the task's TaskScheduled or
//     AdmissionRejected
//   - after_terminal — violation: a lifecycle change after the task became
//     terminal
//   - token_reused — violation: a delivery token claimed a second time
//   - stale_claim — violation: a Claimed that does not match the then-current
//     token
//   - illegal — violation: any other event the transitions of package
//     aggregate do not allow there, a duplicate that changes nothing, or a
//     payload that differs from what the transition decides
//   - broken_link — violation: a v2 event whose prev is not the SHA-256 of its
//     task's previous event
//   - missing — violation: stream sequences that hold no message (the stream
//     denies deletes)
//   - truncated — violation: the log ends before its saved chain head
//   - head_mismatch — violation: the message at the saved chain head's
//     sequence is another one, or gone
//   - concurrency — violation: a SlotAcquired past the key's limit or for an
//     attempt the task has not reached, a keyed task's DeliveryPending without
//     a slot of its key, a SlotReleased of a live task (except a retried
//     one's, in its backoff, of an earlier attempt's slot), a slot event for a
//     task its customer did not schedule with that key
//   - bad_retry — violation: a new task whose retryOf names a task the log
//     does not hold before it, another customer's, or one that was not
//     terminal then
//   - unkeyed — violation (Chain): an event without a chain key where every
//     event must have one (after its stream's keying began): written by
//     someone without the key, or a downgrade to the unkeyed link
//   - bad_mac — violation (Chain): an event whose MAC is not the HMAC of its
//     bytes under the key it names: forged or changed
//   - unknown_key — violation (Chain): an event naming a key the verifier
//     was not given (reported once per key id), or, given no key, the first
//     keyed event
//
// A concurrency key's events are checked like a task's (subject
// tl.conc.<customer>.<keyId>, numbering, hash chain, duplicate ids) and
// re-decided with DecideKey on the key's state.
//
// taskledger replay verify runs it over the whole log and exits 0 only when
// the report is clean. It is audit only: it reads, it never repairs.
package replay
