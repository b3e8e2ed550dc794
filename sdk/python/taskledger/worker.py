"""The executor SDK: a Worker claims tasks of one queue and runs a handler
on each; the handler's Run keeps its durable progress (Turns, tool calls,
steps, effects, children, the mailbox transcript) in the scheduler's Run
document (PUT/GET /v1/tasks/{id}/run), so a restarted executor with the
same executor id resumes instead of starting over. The semantics are the
Go SDK's (package executor; docs/DESIGN.md, "Run and Turn"), and both
persist the same RunState.

Turns. The k-th call of ``run.turn`` in a handler is Turn k, so a
restarted handler that makes the same calls in the same order meets its
Turns again: a Turn whose end is in the saved Run is skipped (its function
is not called); a Turn cut off mid-way runs again, and its ``record`` and
``dispatch`` calls answer from the saved transcript instead of doing their
work twice; any other Turn runs for the first time.
"""

from __future__ import annotations

import copy
import datetime
import json
import logging
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .client import Client
from .errors import ClaimLost, NotFound, StaleRevision, TaskledgerError, Terminal, TokenMismatch
from .types import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_QUEUE,
    ITEM_HANDOVER,
    ITEM_MAILBOX,
    ITEM_MODEL_INPUT,
    ITEM_MODEL_OUTPUT,
    ITEM_NOTE,
    ITEM_TOOL_CALL,
    ITEM_TOOL_RESULT,
    MAX_BATCH_ITEMS,
    MAX_EFFECTS,
    MAX_ERROR_BYTES,
    MAX_HEARTBEAT_SECONDS,
    MAX_OUTPUT_BYTES,
    MAX_SUMMARY_BYTES,
    REASON_ANCESTOR_TERMINAL,
    REASON_CHECK_FAILED,
    STATUS_RUNNING,
    TOOL_ERROR,
    TOOL_OK,
    TOOL_PENDING,
    TOOL_TIMEOUT,
    TOOL_UNCERTAIN,
    ChildResult,
    ContentPart,
    Effect,
    EffectRecord,
    MailItem,
    ResultRequest,
    RunContext,
    RunState,
    ScheduleRequest,
    Task,
    ToolCall,
    TranscriptItem,
    child_result_id,
    derive_id,
)

log = logging.getLogger("taskledger")

R = TypeVar("R")

# A task's kind (events.ValidKind in Go).
_KIND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")

# The stop reason of a run whose save the scheduler refused because its
# claim no longer holds the task.
REASON_SUPERSEDED = "superseded"

# The stop reason of a run whose claim was lost (a missed heartbeat) or
# released: another executor may hold the task and resume its Run.
REASON_CLAIM_LOST = "claim_lost"


class Stopped(Exception):
    """Raised by a Run's boundaries once a stop check said stop (the task or
    an ancestor is terminal, or the task is gone), once a save was refused
    because the claim no longer holds the task (``superseded``), or while
    the worker shuts down. The handler should let it propagate."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"taskledger: run stopped ({reason})")


Handler = Callable[["Run"], str]
# A typed handler: fn(run, payload) -> summary (or None), payload decoded.
KindHandler = Callable[["Run", Any], "str | None"]


class NoHandler(Exception):
    """The failure a worker reports for a task whose kind has no handler
    (Worker.handler) when the worker has no default handler either."""


class PayloadError(Exception):
    """The failure a typed handler's task reports when its ``decode``
    refused the payload; the result says it is final (retryable false)."""


@dataclass(frozen=True)
class CheckOutcome:
    """What a run's stop check found (``Run.last_check``): the scheduler's
    ``reason`` (active, terminal, ancestor_terminal, missing, or
    check_failed: it failed open), or "" with ``error`` when no answer
    came."""

    at: str
    reason: str = ""
    error: str = ""

    @property
    def failed(self) -> bool:
        """Whether the check could not tell whether to stop. The run goes
        on, and the next background check comes sooner (a quarter of
        check_interval)."""
        return bool(self.error) or self.reason == REASON_CHECK_FAILED


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _truncate(s: str, n: int) -> str:
    """The longest prefix of s of at most n UTF-8 bytes."""
    b = s.encode()
    return s if len(b) <= n else b[:n].decode(errors="ignore")


def _content(content: str | list[ContentPart]) -> list[ContentPart]:
    return [ContentPart("text", content)] if isinstance(content, str) else list(content)


class Worker:
    """Claims tasks from one queue and runs ``handler(run) -> summary`` on
    each, ``concurrency`` at a time, each in a thread of its own.

    A handler that returns reports success with the summary; one that
    raises reports failure with the error (Stopped reports nothing: the
    task ended, or another claim holds it). ``executor_id`` names this
    executor in claims: keep it stable across restarts, so a restarted
    worker resumes the runs it still holds (running tasks of its queue
    claimed under its id). ``check_interval`` is the period of the
    background stop check, ``poll_wait`` the long poll of a claim (stop()
    takes effect when the poll in flight ends).

    Typed handlers: ``@worker.handler("resize")`` registers a function
    ``fn(run, payload)`` for the tasks of that kind (Task.kind), which gets
    the task's payload (decoded JSON, None for none). The default
    ``handler`` runs every other task; it may be None when every kind has
    a handler, and then a task of another kind fails with NoHandler.

    Liveness. Claims declare ``heartbeat_seconds`` (default 30; negative:
    claims without heartbeats, held until their deadline) and each run
    renews its claim every third of it in the background, so a claim is
    lost about one interval after this process dies, and its task handed
    to another executor (any id), which resumes the saved Run. A run whose
    claim is lost stops with ``REASON_CLAIM_LOST`` and reports nothing. On
    stop() the runs in progress release their claims (their tasks are
    claimable again at once, the attempt not charged against the retry
    policy), unless ``keep_claims_on_shutdown``: then a restarted worker
    with the same id resumes them while their claims hold.
    """

    def __init__(self, client: Client, handler: Handler | None = None, *, queue: str = DEFAULT_QUEUE,
                 executor_id: str = "", concurrency: int = 4, check_interval: float = 2.0,
                 poll_wait: float = 30.0, heartbeat_seconds: int = DEFAULT_HEARTBEAT_SECONDS,
                 keep_claims_on_shutdown: bool = False) -> None:
        self.client = client
        self.default_handler = handler
        self._kinds: dict[str, Handler] = {}
        self.queue = queue or DEFAULT_QUEUE
        self.executor_id = executor_id or "executor-" + socket.gethostname()
        self.concurrency = max(concurrency, 1)
        self.check_interval = check_interval if check_interval > 0 else 2.0
        self.poll_wait = poll_wait if poll_wait > 0 else 30.0
        if heartbeat_seconds > MAX_HEARTBEAT_SECONDS:
            raise ValueError(f"heartbeat_seconds {heartbeat_seconds} is over {MAX_HEARTBEAT_SECONDS}")
        self.heartbeat_seconds = heartbeat_seconds if heartbeat_seconds > 0 else 0
        self.keep_claims_on_shutdown = keep_claims_on_shutdown
        self._stopping = threading.Event()
        self._mu = threading.Lock()
        self._runs: set[Run] = set()  # the runs in progress
        self._check_failures = 0

    @property
    def check_failures(self) -> int:
        """How many stop checks of this worker's runs could not tell
        whether to stop (CheckOutcome.failed); each went on fail-open."""
        with self._mu:
            return self._check_failures

    def handler(self, kind: str, *, decode: Callable[[Any], Any] | None = None) -> Callable[[KindHandler], KindHandler]:
        """Returns a decorator registering ``fn(run, payload) -> summary``
        as the handler of the tasks of ``kind`` (1 to 64 bytes of
        ``[a-z0-9._-]``, starting with a letter or digit; ValueError
        otherwise). ``decode``, if given, turns the payload into the
        handler's argument (say ``lambda p: Resize(**p)``); when it raises,
        the task fails for good with PayloadError and fn is not called.
        A result's output is what fn gave ``run.set_output``. Registering a
        kind again replaces its handler; register before run()."""
        if not _KIND.fullmatch(kind):
            raise ValueError(f"taskledger: {kind!r} is not a kind ([a-z0-9][a-z0-9._-]{{0,63}})")

        def register(fn: KindHandler) -> KindHandler:
            def run_kind(run: Run) -> str:
                payload = run.task.payload
                if decode is not None:
                    try:
                        payload = decode(payload)
                    except Exception as e:
                        raise PayloadError(f"taskledger: the payload of kind {kind!r} does not decode: {e}") from e
                return str(fn(run, payload) or "")

            self._kinds[kind] = run_kind
            return fn

        return register

    def _handler_for(self, kind: str) -> Handler:
        """The handler of a task of kind: its typed handler, else the
        default one, else one failing with NoHandler."""
        h = self._kinds.get(kind) or self.default_handler
        if h is not None:
            return h

        def none(run: Run) -> str:
            raise NoHandler(f"taskledger: no handler for the task's kind {kind!r}")

        return none

    def stop(self) -> None:
        """Asks run() to return. Runs in progress stop at their next
        boundary, unreported, and release their claims for any executor to
        resume (or, with keep_claims_on_shutdown, are left for a restarted
        worker with the same id). Safe to call from any thread, and more
        than once."""
        self._stopping.set()
        with self._mu:
            for r in self._runs:
                r._halt.set()

    def run(self) -> None:
        """Resumes the runs this executor still holds, then claims and runs
        tasks until stop(). Returns once every run it started returned.
        Raises TaskledgerError or OSError when the runs it holds cannot be
        listed; a failed claim is logged and retried with a backoff."""
        slots = threading.BoundedSemaphore(self.concurrency)
        threads: list[threading.Thread] = []

        def start(task: Task, state: RunState, revision: int) -> None:
            def go() -> None:
                try:
                    self._execute(task, state, revision)
                finally:
                    self.client.close_thread()
                    slots.release()

            th = threading.Thread(target=go, name=f"taskledger-run-{task.id}", daemon=True)
            threads[:] = [t for t in threads if t.is_alive()] + [th]
            th.start()

        try:
            for task, state, revision in self._held():
                while not slots.acquire(timeout=self.check_interval):
                    if self._stopping.is_set():
                        return
                log.info("resuming run of %s at turn %d", task.id, state.turn)
                start(task, state, revision)
            backoff = 0.1
            while not self._stopping.is_set():
                if not slots.acquire(timeout=self.check_interval):
                    continue
                free = 1
                while free < self.concurrency and slots.acquire(blocking=False):
                    free += 1
                try:
                    tasks = self._poll(free)
                    backoff = 0.1
                except (TaskledgerError, OSError) as e:
                    log.warning("claiming from %s failed; retrying: %s", self.queue, e)
                    tasks = []
                    self._stopping.wait(backoff)
                    backoff = min(2 * backoff, 5.0)
                for t in tasks:
                    if self._stopping.is_set() and self._release(t, "claimed as it was shutting down"):
                        slots.release()  # a poll in flight at stop() claimed it: hand it back unstarted
                        continue
                    start(t, *self._attempt_run(t))
                for _ in range(free - len(tasks)):
                    slots.release()
        finally:
            for th in threads:
                th.join()

    def _release(self, task: Task, why: str) -> bool:
        """Hands task's claim back (unless keep_claims_on_shutdown) and
        reports whether it did."""
        if self.keep_claims_on_shutdown or task.claim is None:
            return False
        try:
            self.client.release(task.id, task.claim.delivery_id, f"executor {self.executor_id} {why}")
            return True
        except (TaskledgerError, OSError) as e:
            log.warning("claim of %s not released (it is lost after its heartbeat interval): %s", task.id, e)
            return False

    def _held(self) -> list[tuple[Task, RunState, int]]:
        """The running tasks of the queue claimed under this executor id,
        each with its saved Run and revision (an empty Run, revision 0,
        when it saved none)."""
        out = []
        for t in self.client.list_all(status=STATUS_RUNNING, queue=self.queue, limit=1000):
            if t.claim is None or t.claim.executor_id != self.executor_id:
                continue
            try:
                doc = self.client.get_run(t.id)
                out.append((t, doc.run, doc.revision))
            except NotFound:
                out.append((t, RunState(executor_id=self.executor_id), 0))
        return out

    def _attempt_run(self, task: Task) -> tuple[RunState, int]:
        """The Run a freshly claimed task starts from, with its revision:
        empty on the first attempt; on a retry (docs/API.md, "Retries")
        the previous attempt's, continued under the new claim, so completed
        steps and settled effects are not redone (a fresh Run would be
        refused at its first save as another claim's)."""
        if task.attempt > 1:
            try:
                doc = self.client.get_run(task.id)
                claim = task.claim.delivery_id if task.claim else ""
                handover = "handover-" + claim
                if doc.delivery_id and doc.delivery_id != claim and _item(doc.run, handover) is None:
                    text = (f"attempt {task.attempt}: executor {self.executor_id} took the Run over under delivery {claim} "
                            f"from executor {doc.run.executor_id or '(unknown)'} (delivery {doc.delivery_id}), at turn {doc.run.turn}")
                    doc.run.transcript.append(TranscriptItem(id=handover, kind=ITEM_HANDOVER, turn=doc.run.turn, at=_now(),
                                                             content=[ContentPart("text", text)]))
                doc.run.executor_id = self.executor_id
                return doc.run, doc.revision
            except NotFound:
                pass
            except (TaskledgerError, OSError) as e:
                log.warning("previous attempt's run of %s not read; starting afresh: %s", task.id, e)
        return RunState(executor_id=self.executor_id), 0

    def _poll(self, free: int) -> list[Task]:
        hb = self.heartbeat_seconds
        if free > 1:
            return self.client.claim_batch(self.executor_id, self.queue, min(free, MAX_BATCH_ITEMS), self.poll_wait,
                                           heartbeat_seconds=hb)
        t = self.client.claim_next(self.executor_id, self.queue, self.poll_wait, heartbeat_seconds=hb)
        return [] if t is None else [t]

    def _execute(self, task: Task, state: RunState, revision: int) -> None:
        run = Run(self, task, state, revision)
        with self._mu:
            self._runs.add(run)
            if self._stopping.is_set():
                run._halt.set()
        try:
            self._execute_run(run)
        finally:
            with self._mu:
                self._runs.discard(run)

    def _execute_run(self, run: Run) -> None:
        task = run.task
        if task.mailbox.count > 0:
            # Resumed, or mail came before the claim: the transcript keeps
            # message ids only, so reload the content, and let messages
            # handed out but not yet in the transcript join it now.
            try:
                run._receive(self.client.mailbox(task.id).messages)
            except (TaskledgerError, OSError) as e:
                log.warning("mailbox of %s not read: %s", task.id, e)
        checking = threading.Thread(target=run._check_loop, name=f"taskledger-check-{task.id}", daemon=True)
        checking.start()
        beating = threading.Thread(target=run._heartbeat_loop, name=f"taskledger-heartbeat-{task.id}", daemon=True)
        beating.start()
        summary, error, final = "", "", False
        try:
            summary = str(self._handler_for(task.kind)(run) or "")
        except Exception as e:  # a failure of the handler fails the task, unless it stopped
            error = str(e) or type(e).__name__
            final = isinstance(e, PayloadError)
        finally:
            run._done.set()
            checking.join()
            beating.join()
        if run.stop_reason == REASON_CLAIM_LOST:
            log.warning("claim of %s lost; run stopped", task.id)  # another executor may hold it: report nothing
            return
        if run.stop_reason:
            if run.stop_reason == REASON_ANCESTOR_TERMINAL:
                try:
                    self.client.cancel(task.id, "an ancestor task is terminal")
                except (TaskledgerError, OSError) as e:
                    log.warning("cancel of %s after an ancestor stop: %s", task.id, e)
            log.info("run of %s stopped: %s", task.id, run.stop_reason)
            return
        if self._stopping.is_set() and self._release(task, "shutting down"):
            log.info("worker shutting down; claim of %s released for another executor to resume", task.id)
            return
        if self._stopping.is_set():
            log.info("worker shutting down; run of %s left to resume", task.id)
            return
        res = ResultRequest(success=not error, summary=_truncate(summary, MAX_SUMMARY_BYTES),
                            error=_truncate(error, MAX_ERROR_BYTES), effects=run._effects()[:MAX_EFFECTS],
                            delivery_id=run.delivery_id, output=run._output, retryable=False if final else None)
        try:
            self.client.record_result(task.id, res)
        except (TaskledgerError, OSError) as e:
            log.warning("result of %s not recorded: %s", task.id, e)


class Run:
    """A handler's handle on one claimed task: its durable progress, saved
    in the scheduler after every change. Safe for use from several
    threads (tools may be dispatched in parallel)."""

    def __init__(self, worker: Worker, task: Task, state: RunState, revision: int) -> None:
        self.task = task
        self._w = worker
        self._client = worker.client
        self._state = state
        self._revision = revision
        self._mu = threading.RLock()
        self._save_mu = threading.Lock()  # orders saves: a later state is never overwritten by an older one
        self._items: dict[str, MailItem] = {}  # mailbox messages known, by id
        self._inbox: list[str] = []  # ids of mailbox messages not yet in the transcript
        self._in_turn = 0  # Turns running now; mailbox messages wait for a boundary
        self._turns = 0  # calls of turn() so far
        self._stop_reason = ""
        self._halt = threading.Event()  # set once stopped, or when the worker shuts down
        self._done = threading.Event()  # set when the handler returned
        self._output: Any = None  # the result's output (set_output)
        self._last_check: CheckOutcome | None = None

    def set_output(self, value: Any) -> None:
        """Sets the structured output of the run's result: any JSON value
        (None clears it), at most MAX_OUTPUT_BYTES once compact. The last
        call before the handler returns wins. Raises ValueError, keeping
        the output as it was, when value is not JSON or too large."""
        if value is not None:
            try:
                # As the client sends it: its size is the size the server counts.
                n = len(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())
            except (TypeError, ValueError) as e:
                raise ValueError(f"taskledger: output is not JSON: {e}") from e
            if n > MAX_OUTPUT_BYTES:
                raise ValueError(f"taskledger: output is {n} bytes of JSON, more than {MAX_OUTPUT_BYTES}")
        with self._mu:
            self._output = value

    @property
    def delivery_id(self) -> str:
        """The delivery token of the claim this run works under."""
        return self.task.claim.delivery_id if self.task.claim else ""

    @property
    def state(self) -> RunState:
        """A copy of the run's state as it is saved."""
        with self._mu:
            return copy.deepcopy(self._state)

    @property
    def stop_reason(self) -> str:
        """Why the run stopped ("" while it runs)."""
        with self._mu:
            return self._stop_reason

    @property
    def stopped(self) -> bool:
        """Whether a stop check said stop, the run was superseded or the
        worker is shutting down: long work should end then."""
        return bool(self.stop_reason) or self._w._stopping.is_set()

    def wait(self, timeout: float) -> bool:
        """Waits up to timeout seconds or until the run stops; reports
        whether it stopped. For handlers that wait on something."""
        return self._halt.wait(timeout)

    def _stop(self, reason: str) -> None:
        with self._mu:
            if not self._stop_reason:
                self._stop_reason = reason
        self._halt.set()

    def _raise_if_stopped(self) -> None:
        if self.stop_reason:
            raise Stopped(self.stop_reason)
        if self._w._stopping.is_set():
            raise Stopped("worker shutting down")

    def _interrupted(self, err: BaseException) -> BaseException:
        """err, or Stopped (caused by err) when a stop cut the work short,
        so a handler can tell a stop from a failure."""
        if self.stopped:
            s = Stopped(self.stop_reason or "worker shutting down")
            s.__cause__ = err
            return s
        return err

    # -- saving --

    def _update(self, fn: Callable[[RunState], R]) -> R:
        """Changes the state with fn and saves it; returns fn's value. A
        save that fails while the run is stopping raises Stopped."""
        with self._mu:
            out = fn(self._state)
        try:
            self._save()
        except (TaskledgerError, OSError) as e:
            raise self._interrupted(e)
        return out

    def _save(self) -> None:
        """Saves the state (PUT /run). A refused claim (token_mismatch,
        terminal, not found) or a document of another claim stops the run
        as superseded and raises Stopped; nothing more is saved then. A
        stale revision (a lost answer, an earlier process of this executor)
        is read again and, while the document is this claim's, retried."""
        with self._save_mu:
            if self.stop_reason in (REASON_SUPERSEDED, REASON_CLAIM_LOST):
                raise Stopped(self.stop_reason)
            state = self.state
            if self._revision == 0 and _empty_run(state):
                return  # nothing worth a write yet
            for _ in range(2):
                try:
                    doc = self._client.save_run(self.task.id, self.delivery_id, self._revision, state)
                    self._revision = doc.revision
                    return
                except ClaimLost as e:
                    self._stop(REASON_CLAIM_LOST)
                    raise Stopped(REASON_CLAIM_LOST) from e
                except (TokenMismatch, Terminal, NotFound) as e:
                    self._stop(REASON_SUPERSEDED)
                    raise Stopped(REASON_SUPERSEDED) from e
                except StaleRevision:
                    doc = self._client.get_run(self.task.id)
                    if doc.delivery_id != self.delivery_id:
                        self._stop(REASON_SUPERSEDED)
                        raise Stopped(REASON_SUPERSEDED) from None
                    self._revision = doc.revision
            raise StaleRevision(409, "conflict", "stale_revision", f"run of {self.task.id} kept moving")

    # -- checks and the mailbox --

    @property
    def last_check(self) -> CheckOutcome | None:
        """The outcome of the run's last stop check (None before the
        first)."""
        with self._mu:
            return self._last_check

    def _checked(self, outcome: CheckOutcome) -> None:
        """Keeps a check's outcome; a failed one is logged and counted
        (Worker.check_failures)."""
        with self._mu:
            self._last_check = outcome
        if not outcome.failed:
            return
        with self._w._mu:
            self._w._check_failures += 1
            n = self._w._check_failures
        log.warning("stop check of %s failed (%s): whether to stop is unknown; continuing (fail-open) and "
                    "checking again sooner (%d failed checks)", self.task.id, outcome.error or outcome.reason, n)

    def check(self) -> None:
        """Asks the scheduler whether to stop and collects new mailbox
        messages, consumed as the claim's holder (its delivery token): they
        join the transcript at the next Turn boundary (at once between
        Turns, never while a tool call waits for its result). A failed
        check — no answer, or the scheduler's check_failed — keeps the run
        going (fail-open): it is logged, counted (Worker.check_failures)
        and kept (last_check), and the next background check comes
        sooner. Raises Stopped once stopped."""
        self._raise_if_stopped()
        try:
            res = self._client.check(self.task.id, self.delivery_id)
        except ClaimLost as e:
            self._stop(REASON_CLAIM_LOST)
            raise Stopped(REASON_CLAIM_LOST) from e
        except (TaskledgerError, OSError) as e:
            self._checked(CheckOutcome(at=_now(), error=str(e) or type(e).__name__))
            return
        self._checked(CheckOutcome(at=_now(), reason=res.reason))
        if self._receive(res.messages):
            try:
                self._save()
            except Stopped:
                raise
            except (TaskledgerError, OSError) as e:
                log.warning("run of %s not saved: %s", self.task.id, e)
        if res.should_stop:
            self._stop(res.reason)
            raise Stopped(res.reason)

    def _heartbeat_loop(self) -> None:
        """Renews the claim every third of its heartbeat interval until the
        handler returns; nothing for a claim without heartbeats. A claim
        the scheduler says is lost (or no longer this run's) stops the
        run; any other failure is logged and the next beat comes sooner, at
        a tenth of the interval."""
        interval = self.task.claim.heartbeat_seconds if self.task.claim else 0
        if interval <= 0:
            return
        pause = interval / 3
        try:
            while not self._done.wait(pause):
                try:
                    self._client.heartbeat(self.task.id, self.delivery_id)
                    pause = interval / 3
                except ClaimLost:
                    self._stop(REASON_CLAIM_LOST)
                    return
                except (TokenMismatch, Terminal, NotFound):
                    self._stop(REASON_SUPERSEDED)
                    return
                except (TaskledgerError, OSError) as e:
                    log.warning("heartbeat of %s failed; trying again sooner: %s", self.task.id, e)
                    pause = interval / 10
        finally:
            self._client.close_thread()

    def _check_loop(self) -> None:
        try:
            while not self._done.wait(self._w.check_interval / 4 if (c := self.last_check) and c.failed
                                      else self._w.check_interval):
                self.check()
        except Stopped:
            pass
        finally:
            self._client.close_thread()

    def _receive(self, msgs: list[MailItem]) -> bool:
        """Takes messages not seen before (by id) and, at a boundary between
        Turns (_at_boundary), joins them to the transcript; reports whether
        the transcript grew."""
        with self._mu:
            for m in msgs:
                if m.id in self._items:
                    continue
                self._items[m.id] = m
                if _item(self._state, m.id) is None and not _delegated_result(self._state, m.id):
                    self._inbox.append(m.id)
            return self._in_turn == 0 and self._at_boundary() and self._join()

    def _at_boundary(self) -> bool:
        """Whether the saved transcript stands between Turns: no Turn has
        begun or the last one begun has ended, and no tool call waits for
        its result. A run resumed in the middle of a Turn is not at a
        boundary until that Turn, run again, ends. self._mu is held."""
        s = self._state
        return not s.pending_tools and (s.turn == 0 or _item(s, _turn_end_id(s.turn)) is not None)

    def _join(self) -> bool:
        """Adds the waiting mailbox messages to the transcript and reports
        whether there were any. Its callers are the Turn boundaries; it
        joins nothing while a dispatched tool has not settled, so every
        tool_call item stays next to its tool_result, as LLM APIs require.
        self._mu is held."""
        if self._state.pending_tools:
            return False
        for mid in self._inbox:
            self._state.transcript.append(TranscriptItem(id=mid, kind=ITEM_MAILBOX, turn=self._state.turn, at=_now()))
        joined = bool(self._inbox)
        self._inbox = []
        return joined

    def messages(self) -> list[MailItem]:
        """The mailbox messages in the transcript, in order, with their
        content."""
        with self._mu:
            return [self._items[i.id] for i in self._state.transcript if i.kind == ITEM_MAILBOX and i.id in self._items]

    def transcript(self) -> list[TranscriptItem]:
        """A copy of the transcript."""
        return self.state.transcript

    # -- phase, contexts, steps --

    def progress(self, text: str) -> None:
        """Sends text (model tokens, a status line) to the task's run streams
        as an ephemeral progress line: nothing is saved and the task's log
        does not change, so a line can be lost; progress is best effort and
        a caller may ignore its errors. Raises PayloadTooLarge (over
        MAX_PROGRESS_BYTES), ProgressRate (over 20 lines a second, bursts
        of 40), TokenMismatch or Terminal once the run no longer holds the
        task."""
        self._client.progress(self.task.id, self.delivery_id, text)

    def set_phase(self, phase: str) -> None:
        """Sets the run's phase (free text) and saves it."""
        self._update(lambda s: setattr(s, "phase", phase))

    def context(self, name: str) -> RunContext | None:
        """The named context snapshot, or None."""
        with self._mu:
            c = self._state.contexts.get(name)
            return copy.deepcopy(c)

    def save_context(self, name: str, value: Any) -> RunContext:
        """Saves value (JSON) as the named context snapshot: version 1 for
        the first save, the next version for each replacement."""
        json.dumps(value)  # refuse what cannot be saved before changing anything

        def put(s: RunState) -> RunContext:
            old = s.contexts.get(name)
            c = RunContext(version=(old.version if old else 0) + 1, value=value, saved_at=_now())
            s.contexts[name] = c
            return copy.deepcopy(c)

        return self._update(put)

    def step(self, name: str, fn: Callable[[], None]) -> None:
        """Runs fn as the named step unless the saved Run has it done (a
        resumed run skips it). Checks stop first."""
        with self._mu:
            if name in self._state.steps:
                return
        self.check()
        try:
            fn()
        except Stopped:
            raise
        except Exception as e:
            raise self._interrupted(e)
        self._update(lambda s: s.steps.append(name))

    # -- Turns --

    def turn(self, fn: Callable[[Turn], None]) -> None:
        """Runs fn as the run's next Turn (see the module doc): skipped when
        the saved Run has its end. A Turn begins at a boundary: it checks
        stop first (Stopped), mailbox messages received so far join the
        transcript, and the Run is saved with this Turn as the current
        one; messages arriving during the Turn join at its end. A Turn cut
        off by a crash and run again joins none at its start: the rest of
        its tool results follow its saved tool calls first, so a recovered
        transcript keeps every tool call next to its result. The Turn
        ends when fn returns with every dispatched tool settled: its end
        (transcript item "t<k>.end") is saved. An exception from fn
        propagates (as Stopped when a stop cut it short) and the Turn stays
        open, to be run again by a resumed handler."""
        with self._mu:
            self._turns += 1
            k = self._turns
            if self._state.turn > k or _item(self._state, _turn_end_id(k)) is not None:
                return
        self.check()

        def begin(s: RunState) -> None:
            if s.turn < k:  # a new Turn; one cut off mid-way joins mail at its end
                self._join()
            s.turn = k
            self._in_turn += 1

        try:
            self._update(begin)
        except BaseException:
            self._leave_turn()
            raise
        try:
            fn(Turn(self, k))
            self._raise_if_stopped()
        except Stopped:
            self._leave_turn()
            raise
        except BaseException as e:
            self._leave_turn()
            raise self._interrupted(e) if isinstance(e, Exception) else e

        def end(s: RunState) -> list[str]:
            self._in_turn -= 1  # with the end and the join, so no check joins a message before the end
            pending = [c.id for c in s.pending_tools if c.turn == k]
            if not pending:
                s.transcript.append(TranscriptItem(id=_turn_end_id(k), kind=ITEM_NOTE, turn=k, at=_now(),
                                                   content=[ContentPart("text", f"turn {k} ended")]))
            self._join()
            return pending

        pending = self._update(end)
        if pending:
            raise RuntimeError(f"turn {k}: fn returned with tools {pending} not settled")

    def _leave_turn(self) -> None:
        with self._mu:
            self._in_turn -= 1

    # -- effects and children --

    def effect(self, key: str, do: Callable[[], Effect], lookup: Callable[[], Effect | None] | None = None) -> Effect:
        """Performs an external write (a pull request, a comment) at most
        once per key. The intent is saved before do runs; the outcome is
        reported to the scheduler (POST /v1/tasks/{id}/effects) as soon as
        it is known, then saved. A resumed run that finds an intent without
        an outcome does not repeat do blindly: lookup (e.g. find the pull
        request by its branch) returns the effect if it happened (None: do
        runs); without a lookup the effect settles as uncertain. The
        task's result carries every outcome too."""
        with self._mu:
            rec = self._state.effects.get(key)
        if rec is not None and rec.outcome is not None:
            return copy.deepcopy(rec.outcome)
        if rec is not None:  # intent without outcome: the last attempt was cut off
            if lookup is None:
                return self._settle_effect(key, Effect(kind="unknown", ref=key, uncertain=True))
            try:
                found = lookup()
            except Exception as e:
                raise self._interrupted(e)
            if found is not None:
                return self._settle_effect(key, found)
        self.check()
        self._update(lambda s: s.effects.__setitem__(key, EffectRecord()))
        try:
            outcome = do()
        except Stopped:
            raise
        except Exception as err:
            raise self._interrupted(err)
        return self._settle_effect(key, outcome)

    def _settle_effect(self, key: str, e: Effect) -> Effect:
        try:
            self._client.report_effects(self.task.id, self.delivery_id, [e])
        except (TaskledgerError, OSError) as err:
            log.warning("effect %s of %s not reported; the result will carry it: %s", key, self.task.id, err)
        self._update(lambda s: s.effects.__setitem__(key, EffectRecord(outcome=copy.deepcopy(e), uncertain=e.uncertain)))
        return e

    def _effects(self) -> list[Effect]:
        """The outcomes recorded so far, by key, for the result."""
        out = []
        with self._mu:
            for key in sorted(self._state.effects):
                rec = self._state.effects[key]
                if rec.outcome is not None:
                    e = copy.deepcopy(rec.outcome)
                    e.uncertain = e.uncertain or rec.uncertain
                    out.append(e)
        return out

    def delegate(self, key: str, req: ScheduleRequest) -> Task:
        """Schedules a child task under this one. Its request id is derived
        from (this task, key), so a retried delegation, in this run or a
        resumed one, finds the same child instead of creating another."""
        self.check()
        req = copy.copy(req)
        req.parent_id, req.customer_id = self.task.id, self.task.customer_id
        req.request_id = derive_id("d", self.task.id, key)
        child, _ = self._client.schedule(req)
        self._update(lambda s: s.children.__setitem__(key, child.id))
        return child

    def await_child(self, child_id: str, timeout: float | None = None) -> ChildResult:
        """Waits until the child's terminal result reaches this task's
        mailbox and returns it, checking stop while it waits (Stopped).
        Raises TimeoutError after timeout seconds (None: no limit)."""
        item_id = child_result_id(child_id)
        wait, waited = 0.02, 0.0
        while True:
            with self._mu:
                m = self._items.get(item_id)
            if m is not None and m.content:
                return ChildResult.from_json(json.loads(m.content[0].text))
            self.check()
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"taskledger: child {child_id} did not end within {timeout}s")
            if self.wait(wait):
                self._raise_if_stopped()
            waited += wait
            wait = min(2 * wait, self._w.check_interval)


class Turn:
    """One model iteration and its tool cycle, inside Run.turn: the model
    input, the model's response, the tools it dispatches and their
    results. Safe for use from several threads (give parallel tool calls
    their own ids)."""

    def __init__(self, run: Run, number: int) -> None:
        self.run = run
        self.number = number  # the Turn's index in the run, from 1
        self._mu = threading.Lock()
        self._records = 0
        self._calls = 0

    def record(self, kind: str, content: str | list[ContentPart], *, id: str = "") -> TranscriptItem:
        """Adds a model input or output, or a note, to the transcript, saves
        it, and returns the item as saved. Its id is ``id``, or "t<k>.i<j>"
        for the j-th record of Turn k. In a Turn run again after a crash, an
        id already in the transcript answers with the saved item and
        records nothing: go on with what was recorded the first time (the
        model's earlier answer, which the tools already dispatched came
        from). Raises Stopped once the run is stopped."""
        with self._mu:
            self._records += 1
            j = self._records
        item = TranscriptItem(id=id or f"t{self.number}.i{j}", kind=kind or ITEM_NOTE, turn=self.number,
                              content=_content(content))
        if item.kind not in (ITEM_MODEL_INPUT, ITEM_MODEL_OUTPUT, ITEM_NOTE):
            raise ValueError(f"record {item.id}: kind {item.kind!r} is not a model input, output or note")
        r = self.run
        with r._mu:
            saved = _item(r._state, item.id)
            if saved is not None:
                return copy.deepcopy(saved)
        r._raise_if_stopped()
        item.at = _now()
        r._update(lambda s: s.transcript.append(copy.deepcopy(item)))
        return item

    def dispatch(self, call: ToolCall, do: Callable[[], Any],
                 lookup: Callable[[], tuple[Any, bool]] | None = None) -> ToolCall:
        """Calls a tool at most once and returns the settled call (status
        ok with its output, error, timeout, or uncertain). Its id is
        ``call.id``, or "t<k>.c<j>" for the j-th dispatch of Turn k.

        Before do runs, dispatch checks stop and saves the call as pending
        (in pendingTools and as a tool_call item); after do returns it
        saves the settled call (a tool_result item "<id>.result") and drops
        it from pendingTools. do returns the output (JSON); an exception
        settles the call as error, TimeoutError as timeout. In a Turn run
        again after a crash a settled call answers with its saved result
        (do is not called); a call still pending was cut off: lookup, if
        given, returns (output, found) (found: settled ok; not found: do
        runs); without a lookup do runs again only if call.idempotent,
        else the call settles as uncertain and the handler decides.

        Raises Stopped (the call stays pending when a stop cut do short)
        or the error of a failed save; the tool's own error is in the
        returned call."""
        return self._dispatch(self._named(call), do, lookup)

    def _named(self, call: ToolCall) -> ToolCall:
        """A copy of call with the id of the Turn's next dispatch if it has
        none: "t<k>.c<j>" for the j-th."""
        with self._mu:
            self._calls += 1
            j = self._calls
        call = copy.deepcopy(call)
        call.id = call.id or f"t{self.number}.c{j}"
        return call

    def delegate(self, call: ToolCall, req: ScheduleRequest, timeout: float | None = None) -> ToolCall:
        """Runs the tool call by delegating it to a child task and settles
        the call with the child's result, so the transcript pairs the call
        with that result (as LLM APIs require) instead of holding it as a
        separate mailbox message. As the Go SDK's Turn.Delegate: dispatched
        as dispatch does (idempotent), the child scheduled as Run.delegate
        does under the key "tool:<call id>" and awaited as await_child does
        (timeout: seconds, None for no limit); the call settles ok with the
        child's ChildResult (JSON) as its output, whatever the child's
        status, or as timeout, after which the child's result joins the
        transcript as a mailbox message when it comes. A Turn run again
        after a crash finds the same child."""
        call = self._named(call)
        call.idempotent = True
        r = self.run
        awaited: list[str] = []

        def do() -> Any:
            child = r.delegate(_TOOL_DELEGATION + call.id, req)
            res = r.await_child(child.id, timeout)
            awaited.append(child.id)
            return res.to_json()

        settled = self._dispatch(call, do)
        if settled.status == TOOL_OK and awaited:
            # Received during the Turn, the report waits to join at its
            # end: the tool result holds it now.
            mid = child_result_id(awaited[0])
            with r._mu:
                r._inbox = [m for m in r._inbox if m != mid]
        return settled

    def _dispatch(self, call: ToolCall, do: Callable[[], Any],
                  lookup: Callable[[], tuple[Any, bool]] | None = None) -> ToolCall:
        """dispatch of a call named already."""
        call.turn, call.status, call.output, call.error = self.number, TOOL_PENDING, None, ""
        r = self.run
        with r._mu:
            settled = _item(r._state, _tool_result_id(call.id))
            pending = any(c.id == call.id for c in r._state.pending_tools)
        if settled is not None and settled.tool is not None:
            return copy.deepcopy(settled.tool)
        if pending:  # cut off by a crash
            if lookup is not None:
                try:
                    out, found = lookup()
                except Exception as e:
                    raise r._interrupted(e)
                if found:
                    call.status, call.output = TOOL_OK, out
                    return self._settle(call)
            elif not call.idempotent:
                call.status, call.error = TOOL_UNCERTAIN, "cut off by a crash; not repeated"
                return self._settle(call)
        r.check()
        if not pending:
            def dispatched(s: RunState) -> None:
                s.pending_tools.append(copy.deepcopy(call))
                s.transcript.append(TranscriptItem(id=call.id, kind=ITEM_TOOL_CALL, turn=self.number, at=_now(),
                                                   tool=copy.deepcopy(call)))

            r._update(dispatched)
        try:
            call.output = do()
            call.status = TOOL_OK
        except Stopped:
            raise
        except TimeoutError as e:
            if r.stopped:
                raise r._interrupted(e)
            call.status, call.error = TOOL_TIMEOUT, str(e) or "timeout"
        except Exception as e:
            if r.stopped:
                raise r._interrupted(e)
            call.status, call.error = TOOL_ERROR, _truncate(str(e) or type(e).__name__, MAX_ERROR_BYTES)
        return self._settle(call)

    def _settle(self, call: ToolCall) -> ToolCall:
        def settle(s: RunState) -> None:
            s.pending_tools = [c for c in s.pending_tools if c.id != call.id]
            s.transcript.append(TranscriptItem(id=_tool_result_id(call.id), kind=ITEM_TOOL_RESULT, turn=self.number,
                                               at=_now(), tool=copy.deepcopy(call)))

        self.run._update(settle)
        return call


def _item(state: RunState, item_id: str) -> TranscriptItem | None:
    for it in state.transcript:
        if it.id == item_id:
            return it
    return None


_TOOL_DELEGATION = "tool:"  # prefixes the delegation key of a child a tool call delegated


def _delegated_result(state: RunState, msg_id: str) -> bool:
    """Whether mailbox message msg_id is the report of a child a tool call
    delegated (Turn.delegate) whose call settled ok with it: the tool
    result holds it, so it does not join the transcript again."""
    for key, child in state.children.items():
        if key.startswith(_TOOL_DELEGATION) and child_result_id(child) == msg_id:
            it = _item(state, _tool_result_id(key[len(_TOOL_DELEGATION):]))
            return it is not None and it.tool is not None and it.tool.status == TOOL_OK
    return False


def _turn_end_id(k: int) -> str:
    return f"t{k}.end"


def _tool_result_id(call_id: str) -> str:
    return call_id + ".result"


def _empty_run(s: RunState) -> bool:
    """Whether s holds nothing but its executor id."""
    return not (s.phase or s.turn or s.transcript or s.contexts or s.pending_tools or s.steps or s.effects
                or s.children or s.extra)
