"""Typed errors of taskledger's HTTP API, one class per sentinel of the Go
client (api/errors.go, api/run.go).

Every non-2xx answer raises a subclass of TaskledgerError chosen by the
answer's ``error`` code and ``reason`` (never by the status number or the
message): ``except NotFound`` catches any 404 ``not_found``,
``except Conflict`` any 409. An answer whose code or reason this SDK does
not know raises the class of its code (Conflict for an unknown 409
reason), else TaskledgerError itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import Task


class TaskledgerError(Exception):
    """A non-2xx answer: its HTTP ``status``, ``code`` (the body's
    ``error``), ``reason`` (409 and 429 only), ``message`` (for people) and,
    for 429 ``admission_rejected``, the recorded ``task``."""

    code = ""
    reason = ""

    def __init__(self, status: int, code: str, reason: str = "", message: str = "", task: Task | None = None) -> None:
        self.status = status
        self.code = code
        self.reason = reason
        self.message = message
        self.task = task
        super().__init__(f"{code} ({reason}): {message}" if reason else f"{code}: {message}")


class InvalidArgument(TaskledgerError):
    """400: the request is malformed or breaks a limit."""

    code = "invalid_argument"


class Unauthenticated(TaskledgerError):
    """401: the server needs a known bearer token."""

    code = "unauthenticated"


class Forbidden(TaskledgerError):
    """403: a cross-origin browser request, or a Host that is not loopback
    on a server without an auth file."""

    code = "forbidden"


class OperatorOnly(Forbidden):
    """403 ``forbidden``/``operator_only``: a customer's token asked for an
    operator's action (a result without the claim's delivery id)."""

    reason = "operator_only"


class NotFound(TaskledgerError):
    """404: no such task for this caller (another customer's task is not
    found either), no Run saved yet, or no such route."""

    code = "not_found"


class RequestTimeout(TaskledgerError):
    """408: the body did not arrive within the server's body timeout."""

    code = "request_timeout"


class Conflict(TaskledgerError):
    """409: the task's state refuses the request; ``reason`` says why."""

    code = "conflict"


class Terminal(Conflict):
    """409 ``terminal``: the task has ended; nothing may change it."""

    reason = "terminal"


class TokenMismatch(Conflict):
    """409 ``token_mismatch``: the delivery token is not the current claim's;
    another executor holds the task, or the notification was stale."""

    reason = "token_mismatch"


class ClaimLost(Conflict):
    """409 ``claim_lost``: the claim under this delivery token ended without
    a result (a missed heartbeat, or a release); another executor may hold
    the task now. Stop working on it."""

    reason = "claim_lost"


class NotClaimable(Conflict):
    """409 ``not_claimable``: the task is not queued for a claim."""

    reason = "not_claimable"


class ParentTerminal(Conflict):
    """409 ``parent_terminal``: a child was scheduled under an ended parent."""

    reason = "parent_terminal"


class AncestorTerminal(Conflict):
    """409 ``ancestor_terminal``: a child was scheduled under a parent one
    of whose ancestors has ended, or a claim found an ancestor of its task
    ended and recorded the task canceled instead of starting it."""

    reason = "ancestor_terminal"


class RequestIDConflict(Conflict):
    """409 ``request_id_conflict``: the request id names a task under
    another parent (or a root where the request has a parent, or a child
    where it has none)."""

    reason = "request_id_conflict"


class LineageLimit(Conflict):
    """409 ``lineage_limit``: the lineage would be deeper or larger than the
    server allows."""

    reason = "lineage_limit"


class StaleRevision(Conflict):
    """409 ``stale_revision``: a Run save named a revision that is not the
    stored one; read the Run again."""

    reason = "stale_revision"


class ScheduleLimit(Conflict):
    """409 ``schedule_limit``: the customer has as many live schedules as
    the server allows (--max-schedules)."""

    reason = "schedule_limit"


class NotTerminal(Conflict):
    """409 ``not_terminal``: a retry of a task that has not ended."""

    reason = "not_terminal"


class PayloadTooLarge(TaskledgerError):
    """413: the body is over its limit, or the event it makes is larger
    than the log takes. The same request cannot succeed."""

    code = "payload_too_large"


class AdmissionRejected(TaskledgerError):
    """429 ``admission_rejected``: a quota refused a new root task; ``task``
    is the task as recorded (canceled)."""

    code = "admission_rejected"


class TooManyPolls(TaskledgerError):
    """429 ``too_many_requests``/``too_many_polls``: the customer holds as
    many long polls as the server allows at once."""

    code = "too_many_requests"
    reason = "too_many_polls"


class ProgressRate(TaskledgerError):
    """429 ``too_many_requests``/``progress_rate``: the task sent more
    progress lines than the server allows (20 a second, bursts of 40);
    the line was not sent: drop or merge lines and send a later one."""

    code = "too_many_requests"
    reason = "progress_rate"


class HeaderTooLarge(TaskledgerError):
    """431: the request's header block is over the server's limit."""

    code = "header_too_large"


class Unavailable(TaskledgerError):
    """503: the server could not answer in time; retry after a moment. A
    write may still have happened: retry with the same request id, or read
    the task."""

    code = "unavailable"


class Internal(TaskledgerError):
    """500: a bug on the server's side."""

    code = "internal"


class CorruptEvent(TaskledgerError):
    """500 ``corrupt_event``: the task has a message on the log that does
    not decode (the message names its sequence). It is quarantined and
    there is no repair: it stays on the log and retrying never helps;
    schedule the work again as a new task."""

    code = "corrupt_event"


_BY_CODE: dict[str, type[TaskledgerError]] = {
    c.code: c
    for c in (InvalidArgument, Unauthenticated, Forbidden, NotFound, RequestTimeout, Conflict,
              PayloadTooLarge, AdmissionRejected, HeaderTooLarge, Unavailable, Internal, CorruptEvent)
}
_BY_REASON: dict[tuple[str, str], type[TaskledgerError]] = {
    (c.code, c.reason): c
    for c in (Terminal, TokenMismatch, ClaimLost, NotClaimable, ParentTerminal, LineageLimit, StaleRevision, ScheduleLimit, NotTerminal,
              TooManyPolls, OperatorOnly, AncestorTerminal, RequestIDConflict, ProgressRate)
}


def error_for(status: int, code: str, reason: str = "", message: str = "", task: Task | None = None) -> TaskledgerError:
    """The exception for an error answer, chosen by its code and reason."""
    cls = _BY_REASON.get((code, reason)) or _BY_CODE.get(code) or TaskledgerError
    return cls(status, code, reason, message, task)
