// Package executor is taskledger's executor SDK: a Worker claims tasks of
// one queue and runs a Handler on each, and the handler's Run keeps its
// durable progress (api.RunState: phase, Turns, transcript, contexts,
// pending tools, steps, effects, delegated children) in a CheckpointStore
// — by default the scheduler's run routes — so a restarted executor
// resumes instead of starting over. It needs only the scheduler's API:
// over HTTP (api.NewClient), or all of it over NATS with nothing but a
// NATS URL and a token (api.ConnectNATS and api.NewNATSClient as the
// WorkerConfig's API: claims, heartbeats, checks, Run saves, effects and
// results are NATS requests; docs/API.md, "NATS protocol"). It links no
// server code.
//
// # Run and Turn
//
// A handler re-runs from the top when its run is resumed, and meets its
// saved progress by a deterministic rule: the same calls in the same order
// find the same records.
//
//   - Step(name) and Effect(key) are found by name and key: a completed
//     step is skipped, a recorded outcome returned.
//   - The k-th call of Run.Turn is Turn k. A Turn whose end is saved is
//     skipped (its fn is not called); a Turn cut off mid-way runs fn
//     again, and its j-th Record or Dispatch (or the one with the same
//     explicit id) answers from the saved transcript: a recorded item is
//     returned as recorded, a settled tool with its saved result. A tool
//     still pending was cut off by the crash: its lookup decides, else it
//     is called again only if it is idempotent, else it settles as
//     uncertain.
//   - A handler whose Turns are skipped reads what they produced from
//     Run.State (see ExampleRun_Turn).
//
// Every boundary (a Step, an Effect, a Turn's start, a Dispatch, a
// delegation) checks stop first. Mailbox messages join the transcript at
// Turn boundaries only, each once under its message id. The Run and Turn
// contract, below, is the whole of it.
//
// # The Run and Turn contract
//
// A Run is the executor-owned, persisted progress of one task, in one shape
// for every SDK and the scheduler (api.RunState, docs/API.md, "Run state").
// The worker saves it after every change to a CheckpointStore: by default the
// scheduler's run routes (executor.SchedulerRuns, over PUT/GET
// /v1/tasks/{id}/run), so an executor needs nothing but the HTTP API to
// resume; a NATS KV bucket of the executor's own (OpenKVCheckpoints,
// TASKLEDGER_RUNS) is the option for executors with NATS; an in-memory store
// is for tests. The Run is not in the scheduler's log; the scheduler checks
// only the claim, the revision and the size.
//
//   - executorId (and the document's deliveryId) — meaning: which claim the
//     run belongs to
//   - phase — meaning: free text (Run.SetPhase)
//   - turn — meaning: index of the current Turn, from 1; 0 before the first
//   - transcript — meaning: ordered items, each under a deterministic id:
//     mailbox (the message id), model_input / model_output / note (t<k>.i<j>,
//     the j-th Record of Turn k, or the caller's id), tool_call (t<k>.c<j> or
//     the caller's id; pending) and tool_result (<call id>.result; its final
//     status), and t<k>.end when Turn k ended
//   - contexts — meaning: named snapshots (Run.SaveContext), each with a
//     version: 1, then +1 per replacement
//   - pendingTools — meaning: tool calls dispatched and not settled
//   - steps — meaning: names of the completed steps (Run.Step)
//   - effects — meaning: external writes by key: the intent is saved before
//     do, the outcome after it
//   - children — meaning: delegation key → child task id
//
// A Turn is one model iteration and its tool cycle (run.Turn(ctx, func(t
// *Turn) error)). It begins at a boundary: the stop check, then the mailbox
// messages received so far join the transcript, then the Run is saved with
// turn = k. Inside it t.Record(item) saves the model's input and output, and
// t.Dispatch(call, do, lookup) runs a tool: the call is saved as pending (in
// pendingTools and as a tool_call item) before do runs and as settled (ok with
// its output, error, timeout) after; a tool's failure is its status, not the
// Turn's. The Turn ends when fn returns nil with every dispatched tool
// settled: t<k>.end is saved, and the messages that arrived during the Turn
// join then, never in the middle of a tool call. An error from fn leaves the
// Turn open. A Turn cut off by a crash and run again joins no message at
// its start: the rest of its tool results follow its saved tool calls
// first, so a recovered transcript keeps every tool call next to its
// result (the pairing LLM APIs require).
//
// Resuming. A restarted worker finds the runs it still holds — with
// SchedulerRuns, the tasks GET /v1/tasks?status=running&queue=… lists under a
// claim with its executorId — and runs the handler again from the top with the
// saved Run. The handler meets its progress by a deterministic rule: the k-th
// call of run.Turn is Turn k.
//
//   - ended (t<k>.end, or a later Turn began) — what run.Turn does: skips it:
//     fn is not called; the handler reads what it made from run.State()
//   - begun, not ended (cut off) — what run.Turn does: runs fn again; its
//     Record and Dispatch calls answer from the saved transcript by id
//   - not begun — what run.Turn does: runs fn
//
// In a Turn run again, a recorded item comes back as it was recorded (the
// model's first answer, which the tools already dispatched were made from) and
// a settled tool with its saved result, without calling do. A tool still
// pending was cut off by the crash: lookup, if given, tells whether it
// happened (found: settled ok with its output; not found: do runs); without a
// lookup do runs again only if the call is idempotent, else the call settles
// uncertain and the handler decides. Step(name) skips a completed step, and
// Effect(key) returns a recorded outcome (an intent without an outcome is
// looked up, or reported uncertain). Every boundary — Step, Effect, a Turn's
// start, Dispatch, Delegate — checks stop first.
//
//   - Effects. Effect(key, do, lookup) runs do at most once per key. Its
//     outcome is reported to the scheduler as soon as it is known (POST
//     /v1/tasks/{id}/effects with the claim's delivery token), then saved; a
//     task that times out or is canceled keeps that evidence. A resumed run
//     that finds an intent without an outcome calls lookup (e.g. find the pull
//     request by its stable branch name) instead of do; without a lookup the
//     effect is reported uncertain. The result carries every outcome too.
//   - Children. Delegate(key, req) schedules a child whose request id is
//     DeriveID("d", parent, key), so a retried delegation, in this run or a
//     resumed one, finds the same child. Await(childId) waits for the message
//     child-<childId> to reach the run through checks, until its context ends
//     or its AwaitTimeout passes (ErrAwaitTimeout). Turn.Delegate(call, req)
//     is both as a tool call: the child (key "tool:<call id>") is awaited and
//     its result settles the call (its output), so the transcript pairs the
//     call with the child's result; that message then does not join the
//     transcript again. A delegation that timed out settles as timeout.
//   - Transcript. Checks hand the run mailbox messages (only the claim
//     holder's check, with the claim's delivery token, consumes them: a
//     monitor's check only peeks); each joins the transcript once, under its
//     message id, at a Turn boundary: a new Turn's start, a Turn's end, or
//     at once between Turns — never while a dispatched tool has not settled
//     nor while a Turn cut off by a crash has not ended. The transcript keeps
//     the message ids; a run that starts with mail reloads the content from
//     the mailbox, and messages handed out but not yet joined when the
//     executor died join at the next boundary.
//   - Superseded. A save the scheduler refuses because the claim no longer
//     holds the task (409 token_mismatch or terminal, or 404) stops the run
//     (ErrStopped, stop reason superseded, wrapping executor.ErrSuperseded)
//     and nothing more is saved. A stale revision (409 stale_revision: the
//     answer to an earlier save was lost, or an earlier process of this
//     executor saved) is read again and, when the stored document is still
//     this claim's, saved over; a document of another claim is superseded too.
//   - Retries. A task claimed for a retried attempt (attempt > 1) starts from
//     the checkpoint its previous attempt left, continued under the new claim,
//     when the store still holds it (the scheduler's run routes keep it; the
//     KV store deleted it when the attempt reported), so completed steps and
//     settled effects are not redone; a fresh Run would be refused at its
//     first save as another claim's.
//   - Ends. A run interrupted by the worker's shutdown or a kill is not
//     reported, so a restart resumes it. A run whose executor never comes back
//     ends when its timeoutSeconds pass (timed_out); its Run stays readable
//     for the scheduler's run retention. A Run with nothing in it is not
//     written (its task is found by its claim). With the KV store, saving the
//     done checkpoint deletes it and entries expire 8 days after their last
//     save (a day past the longest timeout). One behaviour suite runs against
//     the three stores.
//
// executor/kill_test.go runs a Go SDK executor in a child process and SIGKILLs
// it after the claim (before any save), while a tool is dispatched, after an
// effect's intent, and between a Turn's end and the next check; a fresh
// process with the same executor id resumes each run from its saved Run
// without repeating the tool or the effect, and one never restarted times out
// with its pending tool in the Run.
//
// # Typed handlers
//
// A task may carry a kind and a JSON payload (api.Task.Kind, Payload).
// Handle[T](w, kind, fn) registers fn for the tasks of kind: the payload is
// decoded into a T with encoding/json (none decodes as null) and fn runs
// with it; Run.SetOutput gives the result a structured output. A payload
// that does not decode fails its task for good (*PayloadError, retryable
// false) without calling fn. The tasks of a kind without a typed handler, or
// without a kind, run the worker's default Handler; a worker without one
// fails them with ErrNoHandler (kinds.go).
package executor
