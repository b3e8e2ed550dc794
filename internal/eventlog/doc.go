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
// 2 minutes; direct get allowed (OpenPart).
//
// # Sharded log
//
// One stream is one leader: every append of every customer goes through
// the node that leads it. --shards K (default 1, at most MaxShards, as
// every process follows every shard) spreads the log over K streams,
// each with a leader of its own.
//
//   - Layout. K = 1 is one stream named --stream on tl.evt.>, tl.conc.>
//     and tl.sched.>. With K > 1 shard i is the stream <stream>_<i> on the
//     same subjects under the root tl.<i>: two streams of one account may
//     not share a subject, and a subject then names its shard. Every
//     shard has the event stream's settings. Ready notifications, the run
//     bucket, the snapshot bucket, the lease bucket and the probe stream
//     are not sharded.
//   - Routing (events.Shards, the one place that knows K). A task lives
//     in shard FNV-1a(customerId "/" rootId) mod K, so a whole lineage
//     shares one stream; a concurrency key's events in FNV-1a(customerId
//     "/" keyId) mod K, a schedule's in FNV-1a(customerId "/" scheduleId)
//     mod K.
//   - Positions (events.Position). A stream sequence names a message only
//     within its part, so everything above this package speaks of
//     positions: sequence × N + part, N the number of parts (K without
//     epochs). With one part a position is the sequence. Position.Part
//     and Position.Seq turn one back into its part and stream sequence
//     where JetStream needs one (the expected last subject sequence of an
//     append, the start of a read). Two positions of one part compare as
//     their sequences do; positions of different parts are not ordered.
//   - Metadata. The layout is fixed when the log is created: the KV
//     bucket <stream>_META (MetaBucket) holds the entry "shards"
//     (Layout). AgreeLayout records it or refuses another one
//     (ErrShardsMismatch). A log from before sharding has no entry and a
//     stream named <stream>: it is K = 1. A log with <stream>_0 but no
//     entry is refused: guessing could start a second log beside it.
//     Offline tools read the layout with ReadShards.
//
// # Epochs
//
// With epoch slots S > 0 (--epoch-slots, at most MaxEpochSlots; period
// at least MinEpochPeriod) the K shards hold the log's concurrency keys
// and schedules, and its tasks live in S slots of K streams each
// (<stream>_s<s>_<i>), one epoch to a slot: part K×(1+s)+i is shard i of
// slot s, and N = K×(1+S). The entry "epochs" of <stream>_META (Epochs)
// records each slot's epoch, state (SlotOpen, SlotSealed, SlotFree) and
// times, the current slot and the removed epochs; it changes only by
// compare-and-set (UpdateEpochs). A new lineage starts in the current
// slot and stays there for life. A slot whose epoch ended and whose
// lineages all ended is sealed (SealSlot: JetStream's Sealed, immutable);
// once archived, RemoveEpoch deletes its streams and creates them again
// empty with FirstSeq after the removed sequences, so no position is
// ever used twice, and frees the slot. A crash in between is finished by
// running it again; OpenPart creates a missing stream of such a slot
// from the recorded sequences.
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
// Log is the one ordered reader of the log. Read and Events read what the
// streams hold now, part after part, each in its order; Follow reads
// from a vector of positions (one a part) and keeps following, the
// parts' events interleaving as they arrive. Task, Lineage and Customer
// are Read with a subject filter. A Log needs no Store, so offline tools
// read a log they have not opened for writing.
//
// # Chain heads
//
// Every task's events are chained by their hashes, but the last events
// of a stream have no successor to vouch for them: a Head (a position and
// the SHA-256 of the message there), saved with every projection
// snapshot and at clean shutdown, lets Check tell a log that lost its
// tail (ErrLogTruncated) or its messages (ErrEventsMissing,
// ErrHeadMismatch) from one that simply ended.
package eventlog
