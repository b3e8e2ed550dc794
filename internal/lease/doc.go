// Package lease splits the scheduler's timer work into partitions and
// gives each partition to one process at a time through a lease: a key
// of a JetStream key-value bucket that names its owner, expires on the
// server TTL after it was last written, and is taken and renewed only
// by compare-and-set on its revision.
//
// A lease saves work, it guarantees nothing: every action the alarm takes
// is still decided again by the aggregate and appended under the task's
// last sequence, so two processes acting on one partition (a lease that
// lapsed mid-action, a process that ignores leases) waste work and break
// no rule.
//
// # Timer partitions and leases
//
// Timer items are split into P partitions (--timer-partitions, 16): a task's
// is FNV-1a of its id mod P (lease.Partition; the alarm's skip gets only the
// id, so a child's report is in the child's partition, not its root's), a
// schedule's of its customerId/id. Every process must use the same P: the
// lease bucket records it in its metadata and a process with another count
// refuses to start. The alarm composes "not mine" into the skip it already
// gives the timer queues (Due, EarliestExcept, DueSchedules), so the queues
// are not restructured: every process keeps every timer in its projections,
// and acts on its own. One action reaches past its partition: having freed a
// slot, the alarm hands it to the key's first waiter at once, whichever
// partition the waiter is in (its owner's release then appends nothing), so a
// key's tasks follow each other as fast as with one process. The alarm wakes
// when it gains a partition.
//
// Ownership is a lease per partition in the KV bucket <stream>_LEASES (memory
// storage, history 1, the stream's replicas, the bucket's TTL = --lease-ttl, 5
// s): key p.<i>, value the owner's instance id (fresh per process start). The
// server expires a key TTL after its last write, so no live process has to
// declare a dead one dead. Every quarter TTL a process (Leases.Run):
//
//  1. puts its member key m.<instance> (expiring as the leases do);
//  2. reads every live key (one watcher's initial values);
//  3. forgets any partition the bucket does not show as its own, keeps at
//     most its share, ceil(P / live members), giving back the extras (it
//     stops acting on them first, then deletes them at their revision), and
//     renews the rest by Update at the revision the bucket shows;
//  4. takes free partitions up to its share by Create, starting at a random
//     one.
//
// The writes of a round go out at once (one round trip, not one per
// partition). Every write is compare-and-set on the key's revision (Create
// expects none), so of two processes writing one key in one round only one
// succeeds: two can never both win a renewal or a take. A partition is acted
// on until sent + TTL − TTL/5, where sent is when its last successful write
// was sent (the server stored it later, so it expires later): a process that
// cannot renew (NATS unreachable, paused, slow) stops acting at least TTL/5
// before another could take over. While its NATS connection is down it acts on
// nothing at all; it acts again once it holds leases. A clean shutdown gives
// its leases back at once; a killed process's are taken over once they expire,
// within about TTL plus a round (the cmd test TestPartitionTakeover kills one
// with SIGKILL and sees every timer of its partitions fire on the survivor).
// Leases are taken only once the projections are ready, so a process
// rebuilding holds none. A NATS restart (memory storage) forgets every lease;
// the processes take them again in their next round.
//
// What a lease does not guarantee: that no two processes act on one item. An
// action dispatched just before its lease lapses runs after it; clocks may
// drift; a process can be configured to ignore leases (serve
// --no-timer-leases, node.Config.NoLeases, which tests and make cluster-bench
// use). None of that matters for correctness, which comes only from OCC: every
// action is decided again on the task's state in the log and appended under
// its last sequence, so a second owner's action appends nothing
// (TestTimerPartitionsTwoOwners runs a holder and a lease-ignoring process
// side by side and finds one release, one claim and at most one publish per
// delivery, and a clean verifier). Leases only save work and conflicts: make
// cluster-bench counts taskledger_occ_conflicts_total{event} and finds no
// DeliveryPending conflict with leases against 58–127 per 1,000 tasks without
// them, for two and three processes; what remains is a claim on one process
// racing the ReadyPublished of the process that scheduled the task
// (docs/SCALING.md). With one process (the default) it holds every partition
// and nothing changes, but after a kill -9 of a process on an external NATS
// server its successor waits up to a TTL for the dead instance's leases to
// expire (with the embedded server the leases die with it).
package lease
