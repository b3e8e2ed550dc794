"""Client of taskledger's HTTP API (docs/API.md): one method per route."""

from __future__ import annotations

import builtins
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import TaskledgerError, Unavailable, error_for
from .types import (
    BatchItem,
    Check,
    ConcurrencyKey,
    Effect,
    Event,
    Mail,
    MailAccepted,
    Message,
    ResultItem,
    ResultRequest,
    RunDocument,
    Renewal,
    RunState,
    Schedule,
    ScheduleCreateRequest,
    ScheduleList,
    ScheduleRequest,
    Task,
    TaskList,
    Tree,
)

# A pooled connection idle this long is replaced before it is used, so a
# request never meets a connection the server (--idle-timeout, 120 s) is
# closing.
_MAX_IDLE_SECONDS = 60.0

# Seconds a long poll's request may take beyond its waitSeconds.
_POLL_SLACK_SECONDS = 10.0


class Client:
    """Client of one taskledger server.

    ``base_url`` is the server's address (``http://127.0.0.1:8080``; a path
    prefix is kept), ``token`` the bearer token (empty: none), ``timeout``
    the seconds a request may take (long polls add their wait). It keeps
    one keep-alive connection per thread and is safe for concurrent use
    from several threads. Every method raises a TaskledgerError subclass
    for an error answer (see taskledger.errors) and OSError (including
    TimeoutError) when the server cannot be reached; a GET that meets a
    connection the server had closed is retried once on a new one, other
    methods are not retried.
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8080", token: str = "", timeout: float = 30.0) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"taskledger: base_url must be http(s)://host[:port], got {base_url!r}")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self._token = token
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()  # every thread's pooled connection

    # -- transport --

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _conn(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """The thread's pooled connection and whether it was used before."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn not in self._open:  # close() closed it
            conn = self._local.conn = None
        if conn is not None and time.monotonic() - self._local.used > _MAX_IDLE_SECONDS:
            self._drop()
            conn = None
        reused = conn is not None
        if conn is None:
            conn = self._connect(timeout)
            self._local.conn = conn
            with self._lock:
                self._open.add(conn)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, reused

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                self._open.discard(conn)

    def close_thread(self) -> None:
        """Closes the calling thread's pooled connection (a thread that is
        done with the client calls it)."""
        self._drop()

    def close(self) -> None:
        """Closes every pooled connection, of every thread; call it when no
        request is in flight. The client stays usable: a later request
        opens a new connection."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()

    def _headers(self, has_body: bool) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if has_body:
            h["Content-Type"] = "application/json"
        if self._token:
            h["Authorization"] = "Bearer " + self._token
        return h

    def _url(self, path: str, query: dict[str, Any] | None = None) -> str:
        url = self._prefix + path
        if query:
            # A list is a repeated parameter (label=a=1&label=b=2).
            q = {k: v if isinstance(v, builtins.list) else str(v) for k, v in query.items() if v not in (None, "", [])}
            if q:
                url += "?" + urllib.parse.urlencode(q, doseq=True)
        return url

    def _request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                 timeout: float | None = None) -> tuple[int, bytes]:
        """Sends one request and returns (status, body) of a 2xx answer;
        raises the typed error of any other."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        url = self._url(path, query)
        timeout = self.timeout if timeout is None else timeout
        for attempt in (1, 2):
            conn, reused = self._conn(timeout)
            try:
                conn.request(method, url, body=data, headers=self._headers(data is not None))
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop()
                if reused and attempt == 1 and method in ("GET", "HEAD"):
                    continue  # the server closed the idle connection first
                raise
            except BaseException:
                self._drop()
                raise
            self._local.used = time.monotonic()
            if resp.will_close:
                self._drop()
            break
        if 200 <= resp.status < 300:
            return resp.status, raw
        raise _error(resp.status, raw)

    def _json(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
              timeout: float | None = None) -> tuple[int, Any]:
        status, raw = self._request(method, path, body, query, timeout)
        return status, json.loads(raw) if raw else None

    # -- tasks --

    def schedule(self, req: ScheduleRequest | None = None, **fields: Any) -> tuple[Task, bool]:
        """POST /v1/tasks: schedules a task from req, or from keyword fields
        of ScheduleRequest. Returns the task and whether it was created
        (False when its request_id repeated). Raises AdmissionRejected (with
        the recorded task), NotFound (parent or related task),
        ParentTerminal, AncestorTerminal, LineageLimit, RequestIDConflict
        (the request id names a task under another parent), InvalidArgument,
        PayloadTooLarge."""
        req = req or ScheduleRequest(**fields)
        status, data = self._json("POST", "/v1/tasks", req.to_json())
        return Task.from_json(data), status == 201

    def schedule_batch(self, reqs: Sequence[ScheduleRequest]) -> list[BatchItem]:
        """POST /v1/tasks/batch: schedules 1 to 1,000 tasks; one item per
        request, in order (``item.err()`` is the item's typed error)."""
        _, data = self._json("POST", "/v1/tasks/batch", {"tasks": [r.to_json() for r in reqs]})
        return [BatchItem.from_json(i) for i in data["results"]]

    def get(self, task_id: str) -> Task:
        """GET /v1/tasks/{id}. Raises NotFound."""
        return Task.from_json(self._json("GET", _task(task_id))[1])

    def list(self, *, status: str = "", queue: str = "", customer_id: str = "", root_id: str = "",
             labels: dict[str, str] | None = None, request_id: str = "", created_after: str = "",
             created_before: str = "", limit: int | None = None, after: str = "", kind: str = "") -> TaskList:
        """GET /v1/tasks: one page (``next`` is the cursor of the next, empty
        on the last). ``labels`` selects tasks carrying every pair (at most
        4), ``kind`` the tasks of that kind (listed without their payload:
        get() has it), ``request_id`` the task the caller's customer scheduled with it,
        ``created_after``/``created_before`` (RFC 3339, exclusive) bound the
        creation time. Raises InvalidArgument for a bad filter."""
        q = {"status": status, "queue": queue, "customerId": customer_id, "rootId": root_id,
             "label": [f"{k}={v}" for k, v in sorted((labels or {}).items())], "requestId": request_id,
             "createdAfter": created_after, "createdBefore": created_before, "limit": limit, "after": after,
             "kind": kind}
        return TaskList.from_json(self._json("GET", "/v1/tasks", query=q)[1])

    def list_all(self, **filters: Any) -> Iterator[Task]:
        """Every task list() finds with these filters, page after page."""
        after = ""
        while True:
            page = self.list(after=after, **filters)
            yield from page.tasks
            if not page.next:
                return
            after = page.next

    def claim(self, task_id: str, delivery_id: str, executor_id: str, *, heartbeat_seconds: int = 0) -> Task:
        """POST /v1/tasks/{id}/claim: claims with a ready notification's
        token, with heartbeats every heartbeat_seconds (1 to 3600; 0: none,
        the claim is held until its deadline). Raises NotClaimable,
        TokenMismatch, NotFound, AncestorTerminal (the task was canceled
        instead: an ancestor has ended)."""
        body = {"deliveryId": delivery_id, "executorId": executor_id}
        if heartbeat_seconds:
            body["heartbeatSeconds"] = heartbeat_seconds
        return Task.from_json(self._json("POST", _task(task_id, "/claim"), body)[1])

    def claim_next(self, executor_id: str, queue: str = "", wait_seconds: float = 0, *,
                   heartbeat_seconds: int = 0) -> Task | None:
        """POST /v1/claims/next: long-polls the queue up to wait_seconds and
        returns the claimed (running) task, or None when nothing was claimed
        in time; heartbeat_seconds as for claim. Raises TooManyPolls."""
        body: dict[str, Any] = {"queue": queue, "executorId": executor_id, "waitSeconds": wait_seconds}
        if heartbeat_seconds:
            body["heartbeatSeconds"] = heartbeat_seconds
        status, data = self._json("POST", "/v1/claims/next", body, timeout=self.timeout + wait_seconds + _POLL_SLACK_SECONDS)
        return None if status == 204 else Task.from_json(data)

    def heartbeat(self, task_id: str, delivery_id: str) -> Renewal:
        """POST /v1/tasks/{id}/heartbeat: renews the claim under delivery_id
        (made with heartbeat_seconds) for one more interval. Raises
        ClaimLost once the claim was lost or released: stop working on the
        task."""
        return Renewal.from_json(self._json("POST", _task(task_id, "/heartbeat"), {"deliveryId": delivery_id})[1])

    def release(self, task_id: str, delivery_id: str, reason: str = "") -> Task:
        """POST /v1/tasks/{id}/release: hands the claim back at once (a
        graceful shutdown); the task is claimable again by any executor,
        and the attempt is not charged against its retry policy. Raises
        ClaimLost, TokenMismatch, Terminal."""
        body = {"deliveryId": delivery_id, "reason": reason}
        return Task.from_json(self._json("POST", _task(task_id, "/release"), body)[1])

    def claim_batch(self, executor_id: str, queue: str = "", max: int = 1, wait_seconds: float = 0, *,
                    heartbeat_seconds: int = 0) -> builtins.list[Task]:
        """POST /v1/claims: long-polls like claim_next and claims up to max
        tasks; [] when nothing was claimed in time."""
        body: dict[str, Any] = {"queue": queue, "executorId": executor_id, "max": max, "waitSeconds": wait_seconds}
        if heartbeat_seconds:
            body["heartbeatSeconds"] = heartbeat_seconds
        status, data = self._json("POST", "/v1/claims", body, timeout=self.timeout + wait_seconds + _POLL_SLACK_SECONDS)
        return [] if status == 204 else [Task.from_json(t) for t in data["tasks"]]

    def check(self, task_id: str, delivery_id: str = "") -> Check:
        """POST /v1/tasks/{id}/check: whether to stop, and the mailbox
        messages after the scheduler's cursor. With delivery_id, the
        running claim's token, the claim holder consumes them (the cursor
        moves past them); without it (a monitor) or with another token the
        check only peeks."""
        body = {"deliveryId": delivery_id} if delivery_id else None
        return Check.from_json(self._json("POST", _task(task_id, "/check"), body)[1])

    def record_result(self, task_id: str, result: ResultRequest | None = None, **fields: Any) -> Task:
        """POST /v1/tasks/{id}/result: ends the task (result, or keyword
        fields of ResultRequest). Raises Terminal, TokenMismatch, NotFound."""
        result = result or ResultRequest(**fields)
        return Task.from_json(self._json("POST", _task(task_id, "/result"), result.to_json())[1])

    def record_results(self, results: Sequence[ResultItem]) -> builtins.list[BatchItem]:
        """POST /v1/results: 1 to 1,000 results, one item each in order."""
        _, data = self._json("POST", "/v1/results", {"results": [r.to_json() for r in results]})
        return [BatchItem.from_json(i) for i in data["results"]]

    def cancel(self, task_id: str, reason: str = "") -> Task:
        """POST /v1/tasks/{id}/cancel. Raises Terminal, NotFound."""
        return Task.from_json(self._json("POST", _task(task_id, "/cancel"), {"reason": reason})[1])

    def retry_task(self, task_id: str, *, request_id: str = "", message: Message | None = None,
                   run_at: str = "") -> tuple[Task, bool]:
        """POST /v1/tasks/{id}/retry: schedules a new task with the terminal
        task's spec (message replaced when given; run_at RFC 3339, default
        now), related to it. Returns the new task and whether it was created
        (False when request_id repeated). Raises NotTerminal, NotFound,
        AdmissionRejected, InvalidArgument."""
        body: dict[str, Any] = {"requestId": request_id, "runAt": run_at}
        if message is not None:
            body["message"] = message.to_json()
        status, data = self._json("POST", _task(task_id, "/retry"), {k: v for k, v in body.items() if v})
        return Task.from_json(data), status == 201

    def append_mail(self, task_id: str, message: Message) -> MailAccepted:
        """POST /v1/tasks/{id}/mailbox: appends a follow-up message (a
        repeated message id answers the original). Raises Terminal."""
        body = {"message": message.to_json()}
        return MailAccepted.from_json(self._json("POST", _task(task_id, "/mailbox"), body)[1])

    def mailbox(self, task_id: str, after: int = 0) -> Mail:
        """GET /v1/tasks/{id}/mailbox: the messages with index > after; does
        not move the cursor."""
        return Mail.from_json(self._json("GET", _task(task_id, "/mailbox"), query={"after": after})[1])

    def history(self, task_id: str) -> builtins.list[Event]:
        """GET /v1/tasks/{id}/history: every event of the task, in log order."""
        return [Event.from_json(e) for e in self._json("GET", _task(task_id, "/history"))[1]["events"]]

    def lineage_history(self, task_id: str) -> builtins.list[Event]:
        """GET /v1/tasks/{id}/history?tree=1: the events of the whole lineage."""
        data = self._json("GET", _task(task_id, "/history"), query={"tree": 1})[1]
        return [Event.from_json(e) for e in data["events"]]

    def tree(self, task_id: str) -> Tree:
        """GET /v1/tasks/{id}/tree: the lineage from its root."""
        return Tree.from_json(self._json("GET", _task(task_id, "/tree"))[1])

    def customer_events(self, customer_id: str = "", since: str = "") -> Iterator[Event]:
        """GET /v1/events: streams the customer's history entries stored at
        or after since (RFC 3339), up to the end of the log when asked. It
        reads the NDJSON line by line on a connection of its own, closed
        when the iterator ends or is closed."""
        conn = self._connect(self.timeout)
        try:
            conn.request("GET", self._url("/v1/events", {"customerId": customer_id, "since": since}),
                         headers=self._headers(False))
            resp = conn.getresponse()
            if resp.status != 200:
                raise _error(resp.status, resp.read())
            for line in resp:
                if line.strip():
                    yield Event.from_json(json.loads(line))
        finally:
            conn.close()

    def concurrency(self, key: str, customer_id: str = "") -> ConcurrencyKey:
        """GET /v1/concurrency: a concurrency key's holders and waiters, of
        customer_id ("" for the caller's own; only the operator may name
        another customer)."""
        return ConcurrencyKey.from_json(self._json("GET", "/v1/concurrency", query={"key": key, "customerId": customer_id})[1])

    # -- Run state and effects --

    def get_run(self, task_id: str, revision: int = 0) -> RunDocument:
        """GET /v1/tasks/{id}/run: the task's latest Run revision, or the one
        revision names (from 1). Raises NotFound before the first save and
        for a revision the task does not have."""
        query = {"revision": revision} if revision else None
        return RunDocument.from_json(self._json("GET", _task(task_id, "/run"), query=query)[1])

    def progress(self, task_id: str, delivery_id: str, text: str) -> None:
        """POST /v1/tasks/{id}/progress: sends an ephemeral progress line to
        the task's run streams; nothing is stored. Raises PayloadTooLarge
        (text over MAX_PROGRESS_BYTES), ProgressRate (over 20 lines a
        second, bursts of 40), TokenMismatch (not the current claim),
        Terminal, NotFound."""
        self._json("POST", _task(task_id, "/progress"), {"deliveryId": delivery_id, "text": text})

    def stream_run(self, task_id: str, after: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
        """GET /v1/tasks/{id}/run/stream: yields (event, data) for every Run
        revision after ``after`` ("saved", a RunChange as a dict), then live
        for each new revision and each progress line ("progress", {"text",
        "at"}), and ("end", {"status"}) once the task is terminal, after
        which the iterator ends. An overflow reconnects after the last
        revision yielded; an error the server sends is raised. The
        connection is closed when the iterator ends or is closed."""
        while True:
            conn = self._connect(self.timeout)
            try:
                conn.request("GET", self._url(_task(task_id, "/run/stream"), {"after": after}), headers=self._headers(False))
                resp = conn.getresponse()
                if resp.status != 200:
                    raise _error(resp.status, resp.read())
                event, data = "", ""
                for raw in resp:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line.startswith("event: "):
                        event = line[len("event: "):]
                    elif line.startswith("data: "):
                        data = line[len("data: "):]
                    elif line == "" and data:
                        msg, event, data = (event, json.loads(data)), "", ""
                        if msg[0] == "overflow":
                            after = max(after, int(msg[1].get("after", 0)))
                            break
                        if msg[0] == "error":
                            raise error_for(0, msg[1].get("error", ""), msg[1].get("reason", ""), msg[1].get("message", ""))
                        yield msg
                        if msg[0] == "saved":
                            after = int(msg[1]["revision"])
                        elif msg[0] == "end":
                            return
                else:
                    raise Unavailable(503, "unavailable", "", f"the run stream ended after revision {after}")
            finally:
                conn.close()

    def save_run(self, task_id: str, delivery_id: str, revision: int, run: RunState) -> RunDocument:
        """PUT /v1/tasks/{id}/run: saves run as the task's next Run revision
        when revision is its latest (0 for the first save) and delivery_id
        the current claim's; every revision stays readable (get_run with
        revision=N), and the same save repeated answers the revision it
        stored. Raises StaleRevision, TokenMismatch, Terminal,
        PayloadTooLarge (over 1 MiB); nothing changes then."""
        body = {"deliveryId": delivery_id, "revision": revision, "run": run.to_json()}
        return RunDocument.from_json(self._json("PUT", _task(task_id, "/run"), body)[1])

    def report_effects(self, task_id: str, delivery_id: str, effects: Sequence[Effect]) -> Task:
        """POST /v1/tasks/{id}/effects: records effects of the running task
        as they happen (1 to 32 a call); returns the task with every effect
        reported so far. Raises TokenMismatch, Terminal, InvalidArgument."""
        body = {"deliveryId": delivery_id, "effects": [e.to_json() for e in effects]}
        return Task.from_json(self._json("POST", _task(task_id, "/effects"), body)[1])

    # -- schedules --

    def create_schedule(self, req: ScheduleCreateRequest | None = None, **fields: Any) -> tuple[Schedule, bool]:
        """POST /v1/schedules: creates a schedule from req, or from keyword
        fields of ScheduleCreateRequest. Returns it and whether it was
        created (False: a live schedule with that id, changed if the spec
        differed). Raises InvalidArgument, ScheduleLimit, PayloadTooLarge."""
        req = req or ScheduleCreateRequest(**fields)
        status, data = self._json("POST", "/v1/schedules", req.to_json())
        return Schedule.from_json(data), status == 201

    def list_schedules(self, *, customer_id: str = "", after: str = "", limit: int | None = None) -> ScheduleList:
        """GET /v1/schedules: one page of live schedules."""
        q = {"customerId": customer_id, "after": after, "limit": limit}
        return ScheduleList.from_json(self._json("GET", "/v1/schedules", query=q)[1])

    def get_schedule(self, schedule_id: str, customer_id: str = "") -> Schedule:
        """GET /v1/schedules/{id}: the schedule (a deleted one too), its next
        instants and last runs. customer_id is for an operator. Raises
        NotFound."""
        return Schedule.from_json(self._json("GET", _schedule(schedule_id), query={"customerId": customer_id})[1])

    def pause_schedule(self, schedule_id: str, customer_id: str = "") -> Schedule:
        """POST /v1/schedules/{id}/pause. Raises NotFound."""
        return Schedule.from_json(self._json("POST", _schedule(schedule_id, "/pause"), query={"customerId": customer_id})[1])

    def resume_schedule(self, schedule_id: str, customer_id: str = "") -> Schedule:
        """POST /v1/schedules/{id}/resume. Raises NotFound."""
        return Schedule.from_json(self._json("POST", _schedule(schedule_id, "/resume"), query={"customerId": customer_id})[1])

    def trigger_schedule(self, schedule_id: str, customer_id: str = "") -> Task:
        """POST /v1/schedules/{id}/trigger: a run now; returns its task.
        Raises NotFound, AdmissionRejected."""
        return Task.from_json(self._json("POST", _schedule(schedule_id, "/trigger"), query={"customerId": customer_id})[1])

    def delete_schedule(self, schedule_id: str, customer_id: str = "") -> Schedule:
        """DELETE /v1/schedules/{id}: stops it for good (history kept).
        Raises NotFound."""
        return Schedule.from_json(self._json("DELETE", _schedule(schedule_id), query={"customerId": customer_id})[1])

    def schedule_history(self, schedule_id: str, customer_id: str = "") -> builtins.list[Event]:
        """GET /v1/schedules/{id}/history: every event of the schedule."""
        data = self._json("GET", _schedule(schedule_id, "/history"), query={"customerId": customer_id})[1]
        return [Event.from_json(e) for e in data["events"]]

    # -- operations --

    def healthz(self) -> dict[str, Any]:
        """GET /healthz: ``{"status": "ok"}`` while the process serves."""
        return dict(self._json("GET", "/healthz")[1])

    def readyz(self, digest: bool = False) -> dict[str, Any]:
        """GET /readyz: ``{"applied", "caughtUp", …}``; raises Unavailable
        (503) while the projections catch up or the log takes no writes."""
        return dict(self._json("GET", "/readyz", query={"digest": 1 if digest else None})[1])

    def openapi(self) -> dict[str, Any]:
        """GET /v1/openapi.json: the OpenAPI document of the API."""
        return dict(self._json("GET", "/v1/openapi.json")[1])

    def metrics(self) -> str:
        """GET /metrics: the Prometheus text."""
        return self._request("GET", "/metrics")[1].decode()

    def rebuild_projections(self) -> dict[str, Any]:
        """POST /v1/admin/projections/rebuild (operator only; NotFound for a
        customer token): ``{"applied", "digest", "seconds"}``."""
        return dict(self._json("POST", "/v1/admin/projections/rebuild")[1])


def _task(task_id: str, suffix: str = "") -> str:
    # Quoted whole, so no id can reach another route: the server answers a
    # malformed id 400.
    if not task_id:
        raise ValueError("taskledger: a task id is required")
    return "/v1/tasks/" + urllib.parse.quote(task_id, safe="") + suffix


def _schedule(schedule_id: str, suffix: str = "") -> str:
    if not schedule_id:
        raise ValueError("taskledger: a schedule id is required")
    return "/v1/schedules/" + urllib.parse.quote(schedule_id, safe="") + suffix


def _error(status: int, raw: bytes) -> TaskledgerError:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return error_for(status, "", "", raw[:200].decode(errors="replace") or f"HTTP {status}")
    task = Task.from_json(body["task"]) if isinstance(body.get("task"), dict) else None
    return error_for(status, str(body.get("error", "")), str(body.get("reason", "")), str(body.get("message", "")), task)
