"""taskledger: the Python client and executor SDK of the taskledger
scheduler (standard library only).

- ``Client``: one method per route of the HTTP API (docs/API.md).
- ``Worker``, ``Run``, ``Turn``: the executor SDK, with durable Run state
  in the scheduler's run routes, as the Go SDK (package executor).
- ``taskledger.errors``: one exception class per error the API answers.
- ``taskledger.types``: the wire types as dataclasses.
"""

from .client import Client
from .errors import (
    AdmissionRejected,
    AncestorTerminal,
    ClaimLost,
    Conflict,
    CorruptEvent,
    Forbidden,
    HeaderTooLarge,
    Internal,
    InvalidArgument,
    LineageLimit,
    NotClaimable,
    NotFound,
    NotTerminal,
    ParentTerminal,
    PayloadTooLarge,
    ProgressRate,
    RequestIDConflict,
    RequestTimeout,
    ScheduleLimit,
    StaleRevision,
    TaskledgerError,
    Terminal,
    TokenMismatch,
    TooManyPolls,
    Unauthenticated,
    Unavailable,
)
from .types import (
    Concurrency,
    ContentPart,
    Effect,
    Message,
    ResultItem,
    ResultRequest,
    RetryRequest,
    RunState,
    Schedule,
    ScheduleCreateRequest,
    ScheduleRequest,
    ScheduleRun,
    ScheduleTask,
    Signal,
    Task,
    ToolCall,
    TranscriptItem,
)
from .worker import REASON_CLAIM_LOST, REASON_SUPERSEDED, NoHandler, PayloadError, Run, Stopped, Turn, Worker

__all__ = [
    "AdmissionRejected", "AncestorTerminal", "ClaimLost", "Client", "Concurrency", "Conflict", "ContentPart", "CorruptEvent", "Effect", "Forbidden", "HeaderTooLarge",
    "Internal", "InvalidArgument", "LineageLimit", "Message", "NoHandler", "NotClaimable", "NotFound", "NotTerminal", "ParentTerminal",
    "PayloadError", "PayloadTooLarge", "ProgressRate", "REASON_CLAIM_LOST", "REASON_SUPERSEDED", "RequestIDConflict", "RequestTimeout", "ResultItem", "ResultRequest", "RetryRequest", "Run", "RunState",
    "Schedule", "ScheduleCreateRequest", "ScheduleLimit", "ScheduleRequest", "ScheduleRun", "ScheduleTask", "Signal", "StaleRevision", "Stopped", "Task", "TaskledgerError", "Terminal",
    "TokenMismatch", "ToolCall", "TooManyPolls", "TranscriptItem", "Turn", "Unauthenticated", "Unavailable",
    "Worker",
]
