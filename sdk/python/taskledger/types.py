"""The wire types of taskledger's HTTP API (docs/API.md; api/types.go,
api/requests.go and api/run.go in Go).

Each is a dataclass with snake_case attributes; the JSON names are their
camelCase forms (``customer_id`` is ``customerId``). ``from_json`` builds
one from a decoded JSON value, ignoring fields it does not know (the API
may add some); ``to_json`` gives the JSON value, leaving out ``None``,
``False`` and empty strings, lists and dicts, which the server reads as
left out (a JSON value field, a payload or an output, is left out only
when it is ``None``).
Times stay RFC 3339 strings, as the server sent them (nanoseconds
included). Free JSON (a tool's input and output, a context's value, an
event's data) is whatever ``json.loads`` made of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

T = TypeVar("T", bound="Wire")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _json_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("json", _camel(f.name)))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = _HINTS[cls] = typing.get_type_hints(cls)
    return h


def _decode(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):  # Optional[X]
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(inner, value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_decode(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(tp)
        return {k: _decode(item, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, Wire):
        return tp.from_json(value)
    return value


def _encode(value: Any) -> Any:
    if isinstance(value, Wire):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _value() -> Any:
    """A field holding any JSON value (a payload, an output): None is none,
    and every other value, 0, false and "" included, is sent."""
    return field(default=None, metadata={"value": True})


def _empty(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (str, list, dict)) and not value)


class Wire:
    """Base of the wire dataclasses: JSON decoding and encoding."""

    @classmethod
    def from_json(cls: type[T], data: Any) -> T:
        """Builds the type from a decoded JSON object (``None`` is ``{}``);
        unknown fields are ignored, or kept in ``extra`` where the type has
        one. Raises TypeError when data is not an object."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: want a JSON object, got {type(data).__name__}")
        hints = _hints(cls)
        kwargs: dict[str, Any] = {}
        known = set()
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            name = _json_name(f)
            known.add(name)
            if name in data and data[name] is not None:
                kwargs[f.name] = _decode(hints[f.name], data[name])
        if "extra" in hints:
            kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs)

    def to_json(self) -> dict[str, Any]:
        """Returns the JSON object, leaving out empty values."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "extra":
                continue
            if not _empty(v) or f.metadata.get("always") or (f.metadata.get("value") and v is not None):
                out[_json_name(f)] = _encode(v)
        extra = getattr(self, "extra", None)
        if extra:
            for k, v in extra.items():
                out.setdefault(k, v)
        return out


# Task statuses.
STATUS_SCHEDULED = "scheduled"
STATUS_QUEUED = "queued"
STATUS_RUNNING = "running"
STATUS_SUCCEEDED = "succeeded"
STATUS_FAILED = "failed"
STATUS_CANCELED = "canceled"
STATUS_TIMED_OUT = "timed_out"
TERMINAL_STATUSES = frozenset({STATUS_SUCCEEDED, STATUS_FAILED, STATUS_CANCELED, STATUS_TIMED_OUT})

# Reasons a stop check gives (Check.reason).
REASON_ACTIVE = "active"
REASON_TERMINAL = "terminal"
REASON_ANCESTOR_TERMINAL = "ancestor_terminal"
REASON_MISSING = "missing"
REASON_CHECK_FAILED = "check_failed"

# Transcript item kinds (TranscriptItem.kind).
ITEM_MAILBOX = "mailbox"
ITEM_MODEL_INPUT = "model_input"
ITEM_MODEL_OUTPUT = "model_output"
ITEM_TOOL_CALL = "tool_call"
ITEM_TOOL_RESULT = "tool_result"
ITEM_NOTE = "note"
# A claim took the Run over from an earlier one (a lost or released claim,
# or a retry), under id "handover-<deliveryId>" of the new claim.
ITEM_HANDOVER = "handover"

# Tool call statuses (ToolCall.status).
TOOL_PENDING = "pending"
TOOL_OK = "ok"
TOOL_ERROR = "error"
TOOL_TIMEOUT = "timeout"
TOOL_UNCERTAIN = "uncertain"

# Server limits (docs/API.md, "Limits and defaults").
MAX_BODY_BYTES = 1 << 20
MAX_BATCH_ITEMS = 1000
MAX_BATCH_BODY_BYTES = 8 << 20
MAX_WAIT_SECONDS = 60
MAX_SUMMARY_BYTES = 16384
MAX_ERROR_BYTES = 16384
MAX_EFFECTS = 32
# A claim's heartbeat interval (heartbeatSeconds; 0 is none) and the
# executors' default.
MIN_HEARTBEAT_SECONDS = 1
MAX_HEARTBEAT_SECONDS = 3600
DEFAULT_HEARTBEAT_SECONDS = 30
MAX_ATTEMPTS = 100
MAX_BACKOFF_SECONDS = 86400
MAX_MAX_BACKOFF_SECONDS = 604800
MAX_KIND_BYTES = 64  # a task's kind: [a-z0-9][a-z0-9._-]{0,63}
MAX_PAYLOAD_BYTES = 256 << 10  # a task's payload, as compact JSON
MAX_OUTPUT_BYTES = 256 << 10  # a result's output, as compact JSON
MAX_PROGRESS_BYTES = 4096  # a progress line's text (Run.progress)
PROGRESS_RATE = 20  # progress lines a second per task and server
PROGRESS_BURST = 40

# What a retry policy retries (RetryRequest.on) and what ended a retried
# attempt (Attempt.outcome).
RETRY_ON_FAILED = "failed"
RETRY_ON_TIMED_OUT = "timed_out"
DEFAULT_QUEUE = "default"
CHILD_RESULT_TYPE = "child_result"


def child_result_id(child_id: str) -> str:
    """The mailbox message id under which a child's terminal result reaches
    its parent."""
    return "child-" + child_id


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def derive_id(prefix: str, *parts: str) -> str:
    """The id fixed by parts, exactly as the Go ``events.DeriveID``: prefix
    and 26 characters of Crockford base32 of the SHA-256 of the parts, each
    followed by a NUL byte."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    n = int.from_bytes(h.digest(), "big") >> (256 - 130)
    return prefix + "".join(_CROCKFORD[(n >> (5 * i)) & 31] for i in range(25, -1, -1))


@dataclass
class ContentPart(Wire):
    type: str = ""
    text: str = ""


@dataclass
class Message(Wire):
    """A task's objective or a mailbox message."""

    id: str = ""
    created_at: str = ""
    content: list[ContentPart] = field(default_factory=list)

    def text(self) -> str:
        """The texts of the parts, joined."""
        return "".join(p.text for p in self.content)


@dataclass
class Signal(Wire):
    id: str = ""
    uri: str = ""
    request_id: str = ""
    event_type: str = ""
    event_action: str = ""


@dataclass
class Effect(Wire):
    """An external change a run made (a pull request, a comment)."""

    kind: str = ""
    ref: str = ""
    url: str = ""
    uncertain: bool = False
    at: str = ""


@dataclass
class Result(Wire):
    success: bool = False
    summary: str = ""
    error: str = ""
    effects: list[Effect] = field(default_factory=list)
    retryable: bool | None = None  # as the result said; None when it did not
    output: Any = _value()  # the structured output (decoded JSON); None for none


@dataclass
class RetryPolicy(Wire):
    """A task's retry policy as the server stored it, every field set."""

    max_attempts: int = 0
    backoff_seconds: int = 0
    max_backoff_seconds: int = 0
    on: list[str] = field(default_factory=list)


@dataclass
class RetryRequest(Wire):
    """A retry policy on schedule (docs/API.md, "Retries"); ``None`` and
    an empty ``on`` take the server's defaults: max_attempts 1 (no retry),
    backoff_seconds 10, max_backoff_seconds 3600, on ["failed"]. Retrying
    on "timed_out" repeats work whose effects are unknown: list it only
    for work that is safe to repeat."""

    max_attempts: int | None = None
    backoff_seconds: int | None = None
    max_backoff_seconds: int | None = None
    on: list[str] = field(default_factory=list)


@dataclass
class Attempt(Wire):
    """One attempt of a task: outcome is "failed" or "timed_out" for a
    retried one, the task's status for the current or last one."""

    attempt: int = 0
    executor_id: str = ""
    started_at: str = ""
    ended_at: str = ""
    outcome: str = ""
    error: str = ""


@dataclass
class Delivery(Wire):
    id: str = ""
    attempt: int = 0


@dataclass
class Claim(Wire):
    delivery_id: str = ""
    executor_id: str = ""
    heartbeat_seconds: int = 0  # 0: a claim without heartbeats


@dataclass
class Renewal(Wire):
    """The answer of POST /v1/tasks/{id}/heartbeat: the claim is held until
    expires_at unless renewed again, never after deadline."""

    expires_at: str = ""
    deadline: str = ""


@dataclass
class Mailbox(Wire):
    count: int = 0
    cursor: int = 0


@dataclass
class Concurrency(Wire):
    """A concurrency limit: at most ``limit`` (1 to 1000) tasks of the
    customer with ``key`` (1 to 256 bytes) hold a delivery token or run at
    once."""

    key: str = ""
    limit: int = 0


# Task.waiting_for of a due task whose concurrency key has no free slot.
WAITING_FOR_CONCURRENCY = "concurrency"


@dataclass
class Task(Wire):
    """The task resource (docs/API.md, "Task resource")."""

    id: str = ""
    root_id: str = ""
    parent_id: str = ""
    related_task_id: str = ""
    customer_id: str = ""
    request_id: str = ""
    queue: str = ""
    signal: Signal | None = None
    repo: str = ""
    message: Message = field(default_factory=Message)
    labels: dict[str, str] = field(default_factory=dict)
    retry_of: str = ""
    kind: str = ""  # what sort of job; "" for none
    payload: Any = _value()  # its arguments (decoded JSON); None for none, and in lists
    status: str = ""
    created_at: str = ""
    run_at: str = ""
    started_at: str = ""
    completed_at: str = ""
    timeout_seconds: int = 0
    deadline: str = ""
    delivery: Delivery | None = None
    claim: Claim | None = None
    mailbox: Mailbox = field(default_factory=Mailbox)
    result: Result | None = None
    effects: list[Effect] = field(default_factory=list)
    reason: str = ""
    retry: RetryPolicy | None = None
    attempt: int = 0
    max_attempts: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    version: int = 0
    concurrency: Concurrency | None = None
    waiting_for: str = ""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass
class TaskList(Wire):
    tasks: list[Task] = field(default_factory=list)
    next: str = ""


@dataclass
class MailItem(Wire):
    id: str = ""
    index: int = 0
    created_at: str = ""
    content: list[ContentPart] = field(default_factory=list)


@dataclass
class Mail(Wire):
    messages: list[MailItem] = field(default_factory=list)
    cursor: int = 0


@dataclass
class Check(Wire):
    should_stop: bool = False
    reason: str = ""
    messages: list[MailItem] = field(default_factory=list)
    cursor: int = 0


@dataclass
class MailAccepted(Wire):
    message_id: str = ""
    index: int = 0


@dataclass
class Event(Wire):
    """One entry of a task's history. ``seq`` is the event's log position;
    0 (left out by the server) for a customer token, whose answers carry
    no log sequences: the order of a history is the log's."""

    seq: int = 0
    id: str = ""
    task_id: str = ""
    type: str = ""
    at: str = ""
    actor: str = ""
    status: str = ""
    detail: str = ""
    data: Any = None


@dataclass
class Tree(Wire):
    task: Task = field(default_factory=Task)
    children: list[Tree] = field(default_factory=list)


@dataclass
class ChildResult(Wire):
    """The JSON text of the mailbox message reporting a child's end."""

    task_id: str = ""
    status: str = ""
    reason: str = ""
    result: Result | None = None
    truncated: bool = False


@dataclass
class ScheduleRequest(Wire):
    """The body of POST /v1/tasks. ``None`` and empty fields take the
    server's defaults."""

    customer_id: str = ""
    parent_id: str = ""
    request_id: str = ""
    related_task_id: str = ""
    signal: Signal | None = None
    repo: str = ""
    queue: str = ""
    message: Message | None = None
    run_at: str = ""
    delay_seconds: float | None = None
    timeout_seconds: int | None = None
    concurrency: Concurrency | None = None
    retry: RetryRequest | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # kind: 1 to MAX_KIND_BYTES of [a-z0-9._-]; payload: any JSON value, at
    # most MAX_PAYLOAD_BYTES once compact (past it PayloadTooLarge).
    kind: str = ""
    payload: Any = _value()


@dataclass
class ResultRequest(Wire):
    """The body of POST /v1/tasks/{id}/result."""

    success: bool = False
    summary: str = ""
    error: str = ""
    effects: list[Effect] = field(default_factory=list)
    delivery_id: str = ""
    # False makes a failure final even with attempts left in the task's
    # retry policy; None (left out) lets the policy decide.
    retryable: bool | None = None
    # The structured output: any JSON value, at most MAX_OUTPUT_BYTES once
    # compact; None for none.
    output: Any = _value()

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.retryable is False:  # False is "empty" to Wire, but not left out here
            out["retryable"] = False
        return out


@dataclass
class ResultItem(ResultRequest):
    """One item of POST /v1/results."""

    task_id: str = ""


@dataclass
class BatchItem(Wire):
    """One item's outcome in a batch answer, in request order: ``status``
    is what the single route would have answered."""

    status: int = 0
    task: Task | None = None
    code: str = field(default="", metadata={"json": "error"})
    reason: str = ""
    message: str = ""

    def err(self) -> Exception | None:
        """The item's error as the single route's exception, or None."""
        if not self.code:
            return None
        from .errors import error_for

        return error_for(self.status, self.code, self.reason, self.message, self.task)


@dataclass
class ToolCall(Wire):
    """One tool dispatch of a Turn."""

    id: str = ""
    name: str = ""
    input: Any = None
    idempotent: bool = False
    turn: int = field(default=0, metadata={"always": True})
    status: str = ""
    output: Any = None
    error: str = ""


@dataclass
class TranscriptItem(Wire):
    """One item of a Run's transcript, under a deterministic id."""

    id: str = ""
    kind: str = ""
    turn: int = field(default=0, metadata={"always": True})
    at: str = ""
    content: list[ContentPart] = field(default_factory=list)
    tool: ToolCall | None = None


@dataclass
class RunContext(Wire):
    """One named context snapshot; each save is a new version."""

    version: int = 0
    value: Any = field(default=None, metadata={"always": True})
    saved_at: str = ""


@dataclass
class EffectRecord(Wire):
    """An external effect's intent and, once known, its outcome."""

    outcome: Effect | None = None
    uncertain: bool = False


@dataclass
class RunState(Wire):
    """An executor's durable Run of one task, as the scheduler stores it
    (docs/API.md, "Run state"). Fields this SDK does not know are kept in
    ``extra`` and saved back unchanged."""

    executor_id: str = ""
    phase: str = ""
    turn: int = field(default=0, metadata={"always": True})
    transcript: list[TranscriptItem] = field(default_factory=list)
    contexts: dict[str, RunContext] = field(default_factory=dict)
    pending_tools: list[ToolCall] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    effects: dict[str, EffectRecord] = field(default_factory=dict)
    children: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunDocument(Wire):
    """The answer of GET and PUT /v1/tasks/{id}/run: one revision of the
    task's Run (1 for the first save, +1 for each after it); ``digest`` is
    the SHA-256 of its canonical JSON, as the task's log records it."""

    task_id: str = ""
    revision: int = 0
    updated_at: str = ""
    delivery_id: str = ""
    digest: str = ""
    run: RunState = field(default_factory=RunState)


@dataclass
class KeySlotter(Wire):
    """A task holding or waiting for a slot of a concurrency key; a holder
    that left the projections has only ``task_id``."""

    task_id: str = ""
    status: str = ""
    limit: int = 0
    run_at: str = ""


@dataclass
class ConcurrencyKey(Wire):
    """The answer of GET /v1/concurrency: the holders in the order they
    took their slot, the waiters first due first."""

    customer_id: str = ""
    key: str = ""
    holders: list[KeySlotter] = field(default_factory=list)
    waiters: list[KeySlotter] = field(default_factory=list)
# Schedules (docs/API.md, "Schedules").
OVERLAP_SKIP = "skip"
OVERLAP_ALLOW = "allow"
CATCHUP_ONE = "one"
CATCHUP_NONE = "none"
CATCHUP_ALL = "all"


def schedule_request_id(schedule_id: str, at: str) -> str:
    """The request id of the run of schedule_id for the instant at, as the
    server sent it (RFC 3339 in UTC, as ``ScheduleRun.at``): the run's task
    is the one ``POST /v1/tasks`` with this request id makes."""
    return derive_id("f", schedule_id, at)


@dataclass
class ScheduleTask(Wire):
    """The task each run of a schedule schedules; every run's task gets its
    labels, retry policy and concurrency. In a Schedule, retry has every
    field set (the server's defaults filled in)."""

    queue: str = ""
    message: Message | None = None
    repo: str = ""
    signal: Signal | None = None
    timeout_seconds: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    retry: RetryRequest | None = None
    concurrency: Concurrency | None = None
    kind: str = ""
    payload: Any = _value()


@dataclass
class ScheduleCreateRequest(Wire):
    """The body of POST /v1/schedules: exactly one of cron and every."""

    id: str = ""
    customer_id: str = ""
    cron: str = ""
    every: str = ""
    timezone: str = ""
    task: ScheduleTask | None = None
    overlap: str = ""
    catchup: str = ""
    paused: bool = False


@dataclass
class ScheduleRun(Wire):
    """One fire of a schedule: a run (task_id) or a skip (skipped)."""

    at: str = ""
    task_id: str = ""
    request_id: str = ""
    status: str = ""
    skipped: str = ""
    missed: int = 0
    manual: bool = False


@dataclass
class Schedule(Wire):
    """The schedule resource."""

    id: str = ""
    customer_id: str = ""
    cron: str = ""
    every: str = ""
    timezone: str = ""
    task: ScheduleTask = field(default_factory=ScheduleTask)
    overlap: str = ""
    catchup: str = ""
    paused: bool = False
    deleted: bool = False
    created_at: str = ""
    updated_at: str = ""
    next: list[str] = field(default_factory=list)
    runs: list[ScheduleRun] = field(default_factory=list)
    run_count: int = 0
    version: int = 0


@dataclass
class ScheduleList(Wire):
    schedules: list[Schedule] = field(default_factory=list)
    next: str = ""
