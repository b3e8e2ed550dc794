// Package scheduler is taskledger's service layer: it validates requests,
// executes them as aggregate commands through the store, waits for the
// projections to apply its writes (read-your-writes), and serves reads.
// The HTTP API and in-process callers use it alike.
//
// # Parts
//
// Service is a thin façade: it embeds one part per noun and exports their
// methods as its own. Each part holds only what it needs and declares the
// few views it reads from the projections; projections.Engine serves them
// all, and Config.Views takes their union (Views).
//
//   - tasks (tasks.go, mailbox.go, retry.go, admission.go): POST /v1/tasks
//     and /v1/tasks/batch, GET /v1/tasks/{id}, cancel, retry, the mailbox
//     and the stop check. It reads TaskViews (a lineage's size and
//     ancestors, a terminal ancestor, a customer's queues, the timer
//     queues' repair).
//   - claims (claimnext.go, batch.go): POST /v1/claims/next and /v1/claims,
//     a claim by delivery, results (one or a batch) and effects. It reads
//     ClaimViews (which queues exist, a customer's queued tasks and their
//     signal, a terminal ancestor) and waits on the ready queue.
//   - schedules (schedules.go; ScheduleTimeline in timeline.go): the
//     /v1/schedules routes and the alarm's
//     fires (FireSchedule). It reads ScheduleViews and the schedules' log,
//     and schedules each run's task through the tasks part.
//   - runs (runs.go): PUT and GET /v1/tasks/{id}/run (every revision,
//     each recorded in the task's log as RunSaved), the run stream and
//     progress lines, on the run storage and its feed; it reads no views.
//   - feed (feed.go, history.go, list.go, stream.go, timeline.go, stats.go,
//     concurrency.go): histories and trees, the task list, the event stream
//     and its cursors, a customer's events, statistics and concurrency
//     keys. It reads FeedViews (children, the list, queue and key
//     statistics, a key's holders and waiters) and, for the statistics,
//     ScheduleViews.
//
// What the parts share lives once, in core (core.go): the log, the
// read-your-writes wait (Applied: CaughtUp, WaitFor, ApplyOwn, and Task for
// who owns a task), the mapping of the log's failures to ErrUnavailable,
// and running a command on a task the principal may see.
//
// # The service
//
// internal/scheduler validates requests (ids, limits, runAt after 1970 and at
// most 52 weeks ahead, timeoutSeconds 1..604,800 with default 3,600, runAt xor
// delaySeconds), executes them as commands through the store, and waits for
// read-your-writes.
//
//   - Tenancy. A principal is a customer or the operator. A customer's request
//     for another customer's task answers ErrNotFound, as for a missing task.
//     The projections answer who owns a task when they know it (a task's
//     customer never changes); otherwise the log does.
//   - Idempotency. A request id fixes the task id (DeriveID("r", customer,
//     requestId)), so racing retries meet in the OCC check; the loser finds
//     the task exists and answers it (200). A request id whose task sits
//     under another parent (or none) is ErrRequestIDConflict.
//   - Closed lineages. No child is scheduled under a terminal parent
//     (ErrParentTerminal) or a parent with a terminal ancestor
//     (ErrAncestorTerminal); a claim of a task with a terminal ancestor
//     records it canceled instead (aggregate.CancelForAncestor, reason
//     ancestor_terminal), as the alarm does at its release.
//   - Admission. New root tasks pass per-customer quotas counted from the
//     usage view (durable: it is rebuilt from the log) and an optional
//     external checker that fails open after 500 ms. A repeat is looked up
//     before admission, so it is not charged twice; children are never
//     charged. A refusal is persisted (AdmissionRejected) and answered 429.
//   - Stop checks. check replays the task from the log: missing or not the
//     principal's → stop (missing); terminal → stop (terminal); any ancestor
//     terminal in the projections → stop (ancestor_terminal); else continue
//     (active). It hands out the messages after the cursor; only the
//     claim holder's check (its delivery token) consumes them and appends
//     MailboxRead, any other peeks. Any fault answers continue
//     (check_failed), logged, counted and recorded on the task
//     (CheckFailed, at most one a minute; checkfailed.go): a scheduler
//     problem never stops a healthy run, and an auditor sees it.
//   - Claims. claims/next and batch claims wait on their queue's dispatcher
//     in internal/delivery (its package doc).
//   - Tenants on a shared queue. Notifications of one queue come in one order
//     for every customer, so a customer's claim would wait behind another
//     customer's backlog. A customer principal therefore first claims its own
//     queued tasks of the queue straight from the projections (the republish
//     queue's bucket of that customer and queue, published longest ago first)
//     with their current tokens, skipping tasks another claim in this process
//     is trying, and deletes each claimed task's notification from the ready
//     stream. While it has none, it waits on the dispatcher and on a signal
//     the projections give when one of its tasks is queued, whichever comes
//     first. An operator takes notifications in order (after any delivery held
//     for the queue's claimers, docs/DESIGN.md, "The alarm"). A customer holds
//     at most --max-polls-per-customer (256) long polls per process; one more
//     is ErrTooManyPolls (429).
//   - Notifications carry no tenancy. Every claim through a notification
//     (claims/next, batch claims, the API over NATS) expects the task to be
//     the caller's (an operator's: the customer the notification names) and
//     on the queue claimed on; the aggregate decides it on the log
//     (aggregate.ErrWrongTenant), and a notification that fails it (forged)
//     is logged, counted (taskledger_claims_wrong_tenant_total) and
//     terminated, and the claimer waits on. A task whose subject holds a
//     message that does not decode (quarantined) is passed over the same way.
//   - Queues. A claim on a queue no task was scheduled on (as the projections
//     know) waits without creating anything: it looks again every 100 ms and
//     answers nothing at its deadline; the first claim on a real queue creates
//     its consumer (internal/delivery). Schedule refuses (ErrInvalid) a task of a customer that has
//     live tasks on --max-queues-per-customer (100) queues, on a queue not
//     among them; counts come from the projections, so racing requests can
//     overshoot by those in flight.
//   - Batches. POST /v1/tasks/batch and POST /v1/results run their items 256
//     at a time, each exactly as its single route except for the
//     read-your-writes wait: an item whose events the views cannot fold in
//     themselves (ApplyOwn; a result ends its task) records the sequence it
//     needs instead of waiting, and the batch waits once for the highest
//     before it answers (an item that needed it is 503 if that wait times out,
//     as its single call would be). Items that count against a limit the
//     projections count (a child: the lineage limits; a root of a customer
//     with an admission quota or a usage checker) run at most 64 at once and
//     settle before the next is checked, so a batch overshoots such a limit no
//     more than 64 racing single requests. A batch claim takes up to max
//     notifications from the dispatcher once the first is there (waiting 2 ms
//     more for others) and claims them in parallel.
package scheduler
