// Package eventlog is the log as JetStream streams: how the log is laid
// out over streams (shards and epoch slots), how those streams are
// created, the append pipeline, direct gets, the ordered reader, chain
// heads and the log's damage checks. It knows nothing of tasks' rules:
// internal/store, the repository, decides with the aggregate and appends
// through it; the projections, the verifier, archives and the offline
// tools read through it.
//
// # The event stream
//
// The log is the stream TASKLEDGER (--stream): file storage, one subject
// per task (tl.evt.<customerId>.<taskId>), one per concurrency key
// (tl.conc.<customerId>.<keyId>) and one per schedule
// (tl.sched.<customerId>.<scheduleId>). DenyDelete and DenyPurge make it
// append-only at the server; no retention limit is set. Duplicate window
// 2 minutes; direct get allowed (OpenPart creates it so).
//
// # Sharded log
//
// One stream is one leader: every append of every customer goes through
// the node that leads it. --shards K (default 1, at most 64: MaxShards,
// as every process follows every shard) spreads the log over K streams,
// each with a leader of its own.
//
//   - Layout. K = 1 is the layout above: one stream named
//     --stream (TASKLEDGER) on tl.evt.>, tl.conc.>, tl.sched.>. With K >
//     1 shard i (0 ≤ i < K) is the stream <stream>_<i> on the same
//     subjects under the root tl.<i> (tl.<i>.evt.<customerId>.<taskId>,
//     tl.<i>.conc.…, tl.<i>.sched.…): two streams of one account may not
//     share a subject, and a subject then names its shard. Every shard
//     has the event stream's settings (append-only, duplicate window,
//     replicas). Ready notifications, the run bucket, the snapshot
//     bucket, the lease bucket and the probe stream are not sharded.
//   - Routing (events.Shards, the one place that knows K). A task lives
//     in shard FNV-1a(customerId "/" rootId) mod K, so a whole lineage
//     shares one stream: a child's creation, its ancestor checks and its
//     report to its parent read and append within it. A concurrency
//     key's events live in FNV-1a(customerId "/" keyId) mod K, a
//     schedule's in FNV-1a(customerId "/" scheduleId) mod K: a key event
//     and a schedule event carry their key's or schedule's id where a
//     task event carries its task id, so the rule is one function of the
//     event's customer and its "shard id" (the root for a task event).
//   - Positions. A stream sequence names a message only within its
//     shard, so everything above this package speaks of positions
//     (events.Position): position = sequence × K + shard. With K = 1 a
//     position is the sequence. An event's Seq, a task's LastSeq and FirstSeq, what
//     WaitFor and the alarm wait for and the seq fields of the API are
//     positions; Position.Part and Position.Seq turn them back into a shard and its stream
//     sequence where JetStream needs one (the expected last subject
//     sequence of an append, the start of a read). Two positions of one
//     shard compare as their sequences do; positions of different shards
//     are not ordered, so what waits for several writes waits for each
//     shard's highest (a batch's answer), and a schedule's fire, whose
//     run task may be in another shard, waits for the schedule's
//     position.
//   - Optimistic concurrency is unchanged: an append expects the last
//     sequence of its subject, now within its shard's stream.
//   - Metadata. K is fixed when the log is created: the KV bucket
//     <stream>_META holds the entry shards ({"shards":K}). A start with
//     another --shards is refused (ErrShardsMismatch from AgreeLayout, exit 1). A
//     log from before sharding has no entry and a stream named <stream>:
//     it is K = 1, recorded on its first start, with no migration step.
//     A log with <stream>_0 but no entry (the bucket was lost) is
//     refused by a start and by the offline tools alike, whatever K they
//     name: guessing could start a second log beside it; restore the
//     entry. Offline tools (replay, history) read K from the entry, so
//     they take no --shards flag. The entry chainkeys records, by chain
//     key id, each key's fingerprint (never its secret; events/doc.go,
//     "Keyed chain"): AgreeChainKeys records a key at its first use and
//     refuses another key of a recorded id (ErrChainKeyMismatch), so the
//     processes of a log sign with one key.
//
// # Epochs
//
// The NATS server keeps an in-memory index entry for every subject a
// stream holds, a few hundred bytes per task ever written, and a start
// without a snapshot reads all history. Epochs bound both by the live
// work: serve --epoch-slots S --epoch-period P (S from 2 to 16:
// MaxEpochSlots; P at least MinEpochPeriod, default 30 days) gives a new
// log S slots of K streams each for its tasks, one epoch to a slot.
//
//   - Layout. The K shards (<stream>_<i>, subjects tl.<i>.…) hold the
//     log's concurrency keys and schedules, which live for as long as
//     their customer uses them (their index entries grow with keys and
//     schedules, not tasks). Slot s is the K streams <stream>_s<s>_<i>;
//     events.Shards{K, Slots} numbers every stream as a part: shard i
//     is part i, shard i of slot s part K×(1+s)+i, and positions are
//     sequence × N + part with N = K×(1+S). The streams are named by
//     slot, not by epoch, so every process follows a fixed set of
//     streams and the projections' vector keeps its length.
//   - Epochs. Epoch n is the period unix time ÷ P = n. The entry epochs
//     of <stream>_META (Epochs) records each slot's epoch, state
//     (open, sealed, free) and times, the current slot and the removed
//     epochs; it changes only by compare-and-set (UpdateEpochs). A new lineage starts
//     in the current slot (shard FNV-1a(customerId "/" rootId) mod K of
//     it) and stays there for life: a child is appended in its root's
//     part (the projections' Locate, else a direct get in each slot).
//     Routing reads the epochs from memory; every node re-reads them
//     each epoch check (--epoch-check, default P ÷ 10 between 100 ms and
//     1 min).
//
// A slot whose epoch ended and whose lineages all ended is sealed
// (SealSlot: JetStream's Sealed, immutable); once archived, RemoveEpoch
// records each stream's next sequence in the slot, deletes each sealed
// stream and creates it again empty and unsealed with FirstSeq at that
// sequence, so no position is ever used twice, then frees the slot. A
// crash in between is finished by running it again, and OpenPart creates
// a missing stream of such a slot from the recorded sequences.
//
// # Appends
//
// Pipeline sends appends on one connection without waiting for each
// other's acks, each with its own expected subject sequence, and hands
// each ack to its caller; IsConflict recognises the server's answer to a
// wrong expected sequence, which the store maps to aggregate.ErrConflict.
// DirectGetter reads one subject's messages with JetStream's batch
// direct get, or from the stream leader where a follower may lag.
//
// # Reading in order
//
// Log is the one ordered reader of the log, for the projections (Tail,
// through projections.Log), the live event stream (Follow), replay,
// archives and the offline tools (Read). Read and Events read what the
// streams hold now, part after part, each in its order; Follow reads
// from a vector of positions (one a part) and keeps following, the
// parts' events interleaving as they arrive; Tail is one part's raw
// follow, each message with its position, for a reader that decodes
// itself. Read, Follow and Tail share one consumer loop. Task, Lineage and
// Customer are Read with a subject filter. A Log needs no Store, so
// offline tools read a log they have not opened for writing.
//
// A message that does not decode is quarantined, never the end of a
// read: Events and Follow hand it, as an *events.CorruptError (position,
// subject, storage time, why), to the caller's quarantine function and go
// on (GET /v1/events and the event stream put a marker in its place); a
// caller without one gets the error. The store's reads of one subject
// (a task, key or schedule) skip it too and report it once they are done.
//
// # Chain heads
//
// Every task's events are chained by their hashes, but the last events
// of a stream have no successor to vouch for them: a Head (a position and
// the SHA-256 of the message there), saved with every projection
// snapshot and at clean shutdown, lets Check tell a log that lost its
// tail (ErrLogTruncated) or its messages (ErrEventsMissing,
// ErrHeadMismatch) from one that simply ended; a stream that holds no
// event at all under a head (deleted and created again, or purged) is
// ErrLogEmpty, which a start refuses (node.ErrLogLost). While a process
// runs, CheckStreams compares the streams with what the projections
// read: a stream deleted (ErrStreamMissing), replaced by an emptier one
// (ErrLogTruncated) or purged (ErrEventsMissing) makes /readyz fail.
package eventlog
