// Package projections folds the event log into the read models the
// scheduler serves from: tasks, the timer queues, status views,
// lineage and usage. They may lag the log; every action they
// trigger is decided again by the aggregate.
//
// # The fold loop and the views
//
// Two nouns. Engine is the fold loop (engine.go, tail.go, snapshot.go): it
// reads the log in order and folds each event into the views under their
// write lock, keeps the applied positions (Applied, Covers, WaitFor, and
// ApplyOwn for read-your-writes), writes and restores snapshots, rebuilds,
// and says when the views are complete (Ready, CaughtUp) and when the timer
// queues changed (TimersChanged); the corrections the alarm and the service
// make without an event (Repair, Postpone, Renew, SettleRun: repair.go) are its
// writes too. Views are the read models it keeps (view.go and the files of
// each view): every query (query.go, due.go, keys.go, schedules.go,
// stats.go) only reads, under the read lock, from the events applied so
// far. Engine embeds Views, so one *Engine serves every small interface its
// consumers declare, those that mix the two included (reactors.Projection,
// internal/scheduler's).
//
// # Projections
//
// One engine consumes the log in order and feeds every view. It reads through
// an ordered consumer on its own goroutine (events are decoded there, up to
// 256 ahead of the fold). If the engine is behind what a caller waits for and
// has made no progress for 3 s (a lost cluster node holding its consumer), it
// follows the log with a new consumer from where it is. An event that does not
// decode is counted (taskledger_projection_undecodable_events_total), skipped
// and reported by the verifier; the views record it as quarantined (its
// position and why, the first 1,000 listed, Views.Quarantined), in the snapshot
// too, for /readyz and the operator's statistics.
//
// The views:
//
//   - tasks: every task's state folded by aggregate.Apply, packed into a small
//     record (ids, customer, queue, status, times, delivery, claim, result,
//     retried attempts, mailbox ids, sequences; of the spec only root, parent,
//     queue, runAt, the retry policy, and the signal until the notification is
//     published, or for a task with a retry policy until it is terminal, since
//     a retry publishes again). The rest of the spec, message included, is
//     read from the task's first event when a list or tree needs it.
//   - status sets and per-queue counts, for lists and taskledger_tasks;
//   - ordered ids: each customer's task ids in sorted blocks of at most 512
//     (projections/ids.go), so a list without a status filter, or with
//     idPrefix, walks them from its cursor and stops at the page instead of
//     reading and sorting every task;
//   - statistics (GET /v1/stats): per customer and queue the counts, rate
//     rings and 80 % marks kept as events apply; the keys' holders and live
//     sets and the schedules give their rows. The alarm's lateness is not a
//     view: the alarm's Observe feeds a constant-memory window
//     (reactors.LatenessWindow, the last 256 actions per timer queue);
//   - lineage: children in creation order and ancestors, for trees and stop
//     checks;
//   - usage: active root tasks and root admissions of the last minute per
//     customer, for quotas;
//   - concurrency keys: each key's holders, and its live tasks
//     (docs/DESIGN.md, "Concurrency keys").
//   - the timer queues (below), the fire queue among them, holding the
//     schedules;
//   - schedules: every schedule (deleted ones too) with its last 20 fires, and
//     each customer's live count.
//
// Mailbox contents are not projected: mailbox reads and checks replay the task
// from the log.
//
// # The timer queues
//
// projections/view.go (timerOf) is the one definition of membership:
//
//   - release (release) — holds: scheduled tasks not yet released; due at:
//     runAt, after a retry its nextAt (State.DueAt); the alarm issues:
//     ReleaseDue with a new token
//   - delivery (deliver) — holds: released tasks whose notification is not yet
//     published; due at: the delivery's nextAt; the alarm issues: publish,
//     then MarkReadyPublished, RetryDelivery or ExhaustDelivery
//   - running deadline (expire) — holds: running tasks; due at: deadline; the
//     alarm issues: TimeOut
//   - child report (report) — holds: terminal children whose live parent has
//     no message child-<childId> yet; due at: the child's completedAt; the
//     alarm issues: AppendMail of the child's result to the parent
//   - republish (republish) — holds: queued tasks; due at: when their
//     notification was last published (ReadyPublished or ReadyRepublished);
//     the alarm issues: acted on --republish-after later: check the
//     notification is in the ready stream, else publish it again and
//     RepublishReady
//   - free (free) — holds: terminal tasks (or ones evicted by retention) that
//     still hold a slot of their concurrency key, and retried tasks that hold
//     the slot of an earlier attempt; due at: the task's completedAt, for a
//     retried one when its attempt ended (projections.FreeAt); the alarm
//     issues: ReleaseSlot on the key (a retried task's with Before its
//     attempt), then the release of the key's first waiter
//   - fire (fire) — holds: live, unpaused schedules (keyed customer/id); due
//     at: their next instant, or at once while their last run's task is not in
//     the views; the alarm issues: FireSchedule through the service
//     (docs/DESIGN.md, "Schedules")
//
// Each queue is a min-heap of due times per customer plus a heap of customers
// by their earliest item, so due work is taken in turns across customers:
// every customer with a due item gets its earliest one before any customer
// gets a second. The republish queue keys its heaps by customer and queue,
// which also lists a customer's queued tasks of one queue in publish order for
// its claims (below). A child leaves the report queue when its report lands on
// its own parent or when the parent becomes terminal.
//
// What the alarm acts on, and when, is one rule (projections/due.go,
// actionable): an item its skip does not report (the alarm's own items in
// flight, other processes' partitions) and, in the release queue, only a
// task its concurrency key lets run (releasable: it holds its slot, or the
// key has room counting the earlier due tasks). Due hands such items out
// once due and Next gives the alarm the earliest of them to sleep until, so
// a due task waiting for a full key's slot neither runs nor holds back the
// alarm's wake-up for a later item; the SlotReleased that frees a slot wakes
// the alarm (TimersChanged).
//
// Every heap item points at the slot that holds its index, kept as the heap
// moves it. The four queues of timerOf (release, delivery, running deadline,
// republish), of which a task is in one at a time, keep that slot in the
// task's record, so a queued task costs its heap item and no map entry;
// putting a task into one of them takes it out of another (a repair of a
// projection behind the log). Report, free and fire keep their slots in a map
// of their own. The status sets likewise hold record pointers, each record its
// index in its set. The record itself is 256 bytes, its rarely set fields
// (reason, result, effects, retries, mailbox and children, the lineage's
// closing sequence) behind one pointer that a queued task leaves nil: about
// 460 bytes of heap per queued task in all (go run ./cmd/taskledger bench
// --scale 1 --only memory).
//
// Appending a message to a live task also checks that it is in the timer queue
// its state calls for (release, delivery, republish or deadline) and puts it
// back from the log if not (taskledger_timer_repairs_total).
//
// The views also count each customer's live tasks per queue (for
// --max-queues-per-customer) and remember every queue a task was scheduled on
// (only those get a ready consumer).
//
// # Read-your-writes
//
// The engine exposes the last applied stream sequence, and WaitFor(seq) blocks
// until an event is applied. Every write through the service is in the local
// projections before it answers, so a list or a tree right after a write on
// the same process sees it. Reads by id go to the log and are current on every
// process.
//
// Most writes need no wait: right after the ack the service hands its own
// events (with the sequence and hash the ack gave) to the engine (ApplyOwn),
// which folds them in at once where that cannot change what the log's order
// gives: the task is in the views exactly at the event before (or, for a root
// task's TaskScheduled, not there yet), and the event changes only its own
// task's views (DeliveryPending, DeliveryRetryScheduled, ReadyPublished,
// ReadyRepublished, Claimed, MailboxRead, a root's TaskScheduled). A child's
// creation (the parent's children in creation order, a reopened lineage), a
// terminal event (reports, lineages closing, retention's eviction order) and
// mail follow the order of other tasks' events, so for those, and for anything
// after one of them, the service waits up to 10 s for the tail to apply the
// write's last sequence; past that it answers 503 (the write is in the log).
// The tail skips a sequence folded in already without decoding it, and a task
// record never applies an event at or below its own last sequence again (so a
// snapshot taken with such events in it restores right). The applied sequence
// still moves only with the tail; TestApplyOwnRacesTheTail races the two and
// checks every task against its replay and the views against a rebuild. The
// tail applies what its reader has fetched ahead, up to 64 events, in order
// under one hold of the views' lock, and wakes WaitFor callers and the alarm
// once for them: with a lock round per event, a burst's releases and claims,
// each folding its own event in under the same lock, queued behind the tail
// event by event.
//
// The engine is caught up once it has applied everything the stream held when
// it started; /readyz is 503 until then, the alarm does not start before, and
// a stop check that needs ancestors answers check_failed.
//
// # Retention and eviction
//
// The log keeps every task forever; memory holds what is live plus a bounded
// number of finished ones. A lineage is finished when every task in it is
// terminal and has reported to its parent. The views keep at most --retain
// (default 100,000; -1 keeps all) tasks of finished lineages and evict older
// lineages whole, the one that finished first first. Evicting whole lineages
// keeps every view consistent: an open task's ancestors and a kept task's
// children are always there. Eviction depends on log order alone, so a rebuild
// or a snapshot restore keeps exactly the same tasks. A child whose scheduling
// raced its parent's end reopens the lineage.
//
// An evicted task answers every read by id exactly as before (get, history,
// lineage history, tree, mailbox, check) from the log; only the list no longer
// returns it. taskledger_projection_evicted_tasks_total counts evictions.
//
// # Snapshots
//
// The engine writes a snapshot to <stream>_SNAPSHOTS every 100,000 events or 5
// minutes, whichever comes first (only when it has applied something new, one
// at a time, in the background). A snapshot holds a format version (7; 3 added
// the tasks' effects, 4 the concurrency keys and the schedules, 5 the key
// holders' attempts, 6 the tasks' labels, 7 their kinds), the applied sequence, a SHA-256 of
// the body, and the body: every task record with its children and lineage
// closing sequence, the recent admissions, and every schedule with its last
// fires and whether its last run's task is still awaited. Derived views (timer
// queues, status sets, active roots, reports, retention) are recomputed on
// load exactly as the log would have built them. On start the engine loads the
// snapshot and catches up from its sequence. A snapshot that fails its
// checksum, has another format or is ahead of the stream is logged and
// ignored, and the projections are rebuilt from sequence 1.
//
// Rebuild. POST /v1/admin/projections/rebuild folds the whole log into fresh
// views side by side with the live ones, which keep serving, applies the last
// few events with the live engine paused, and swaps them in atomically.
// taskledger replay rebuild does the same offline and writes a fresh snapshot.
// The digest (/readyz?digest=1) is a SHA-256 over every task record, the
// retention count, the timer queues, active roots, admissions, status sets,
// concurrency keys, schedules and the label and kind indexes: a rebuilt projection must
// show the live one's digest. It is a function of the log position alone:
// the timer due times that move without an event (a queued task's next
// republish check, Postpone; a claim's heartbeat expiry, Renew, and its
// grace after a restart) are hashed as the log gives them, so live,
// rebuilt and snapshot-restored projections agree at any time.
//
// # Label index
//
// GET /v1/tasks?label=k=v is answered from an index in the views: for each
// label pair, the ids of the tasks that carry it, and each labeled task's
// labels. Only labeled tasks are in it; the task record itself holds no
// labels, so a task without any costs no memory. A list with label filters
// checks only the tasks of its rarest pair (then every other filter), a
// requestId filter only the one task id it derives; other filters scan
// (status: its set). The index is filled when a task is created, emptied when
// retention evicts it, and rebuilt from the labels in a snapshot's task
// records.
//
// GET /v1/tasks?kind= is answered the same way from the kind index
// (kinds.go): each task's kind and each kind's task ids, only for the tasks
// that have one. A list with a kind filter and no label filter checks only
// that kind's tasks. A task's payload is not in the views: like its message,
// it is read from the task's first event when the task is asked for.
package projections
