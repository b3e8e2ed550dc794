// Package archive writes a sealed epoch of the log to a directory, proves
// such a directory whole (Verify) and still matching the live log
// (CheckLive), and reads it as the store reads a live log (Archive).
//
// An archive is one file a part (a shard stream of the epoch) and a
// manifest.json. A part file is the magic "TLARCV1\n" and then one record
// per stored message, in stream order, little-endian:
//
//	u32 n        length of the rest of the record (18 + s + len(data))
//	u64 seq      the message's stream sequence
//	i64 time     its stored time, Unix nanoseconds
//	u16 s        length of its subject
//	[s]byte      the subject
//	[]byte       the stored bytes (the encoded event), the rest of the record
//
// The records are chained: chain_0 is 32 zero bytes and chain_i =
// SHA-256(chain_{i-1} || record_i), record_i being all its bytes from n
// on. The manifest names each part's final chain value, the SHA-256 of
// its whole file and the live log's chain head at its last event
// (see Archives below).
//
// # Archives
//
// An epoch is a set of the log's parts: for a log with epochs (docs/DESIGN.md,
// "Epochs") the K streams of the slot that holds it, named by its number; a
// log without epochs has one, 0, made of all its parts. Once an epoch's
// streams are sealed (Sealed: true: the server takes no write and no delete),
// archive.Write (taskledger archive EPOCH --to DIR) copies them to a
// directory, and archive.Verify and archive.CheckLive decide whether the
// streams may go.
//
//   - Files. One part-<i>.tlar a part: the magic TLARCV1\n, then one record
//     per stored message in stream order, little-endian: u32 n (the rest's
//     length), u64 stream sequence, i64 stored time (Unix ns), u16 subject
//     length, the subject, the stored bytes (the encoded event; headers are
//     not kept: nothing reads them back). A reader refuses a record longer
//     than 8 MiB of data plus its header and the longest subject
//     (archive.MaxData: where nats-server warns that max_payload is too large;
//     every taskledger event is far smaller) before allocating it, so a
//     corrupt length cannot make it allocate gigabytes; Write refuses to
//     archive a larger message.
//   - Chain. chain_0 is 32 zero bytes, chain_i = SHA-256(chain_{i-1} ‖
//     record_i) over each record's bytes from its length on: a record changed,
//     dropped, reordered or added changes the final value.
//   - Manifest (manifest.json): format version (1), the stream base name,
//     subjects root, K and epoch slots of the log (Manifest.Layout: its
//     positions and routing), the epoch's name (and its period's times), and
//     per part: stream, first and last sequence, count, file bytes, the
//     chain's final value, the file's SHA-256 and the live log's chain head at
//     the part's last event (eventlog.Log.HeadAt: position and SHA-256 of the
//     stored bytes), which ties the archive to the log's own chain.
//   - Write refuses an unsealed stream and a DIR that exists and is not empty;
//     it writes into a temporary sibling directory, fsyncs, and renames it
//     into place last, so a crash leaves no half archive at DIR. It streams:
//     one message in memory at a time. A stream with a hole, or whose reads
//     disagree with its state or its chain head, is refused.
//   - Verify reads every file: magic, framing, sequences contiguous from the
//     first to the last, count, size, chain and file hash against the
//     manifest; every event decodes; each task's, key's and schedule's prev
//     links hold between its archived events (as replay verify checks them; an
//     event whose predecessor is in an earlier epoch starts the chain); and
//     each part's last event is the manifest's chain head. The error names the
//     part and the sequence of the first problem (a changed byte that breaks
//     no record shows as the part's chain or hash). It holds one hash a
//     subject of the part being read.
//   - CheckLive proves the archive complete against the cluster: each part's
//     stream exists, is sealed, has no hole and the manifest's first and last
//     sequence and count, and its chain head at the last event is the
//     manifest's; on a log with epochs the manifest's parts are all those of
//     the live epoch it names, so epoch remove cannot delete a stream the
//     archive does not hold. Verify then CheckLive is what an operator runs
//     before removing the streams.
//   - Reading. archive.Archive mirrors eventlog.Log: Read (raw, for the
//     verifier), Events, Task and LineageOf (the same lookup and lineage rule:
//     eventlog.FindLineage, eventlog.InLineage), positions as the live log's.
//     Every read streams the files from their start and checks the framing,
//     and at a part's end its count, chain and hash. history, show and
//     replay verify take --archive DIR.
package archive
