"""The tests' real server: ``taskledger`` built once from this checkout
(or $TASKLEDGER_BIN), ``taskledger serve`` with an embedded NATS server in
a temporary data directory, a free loopback port and an auth file."""

from __future__ import annotations

import atexit
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

SDK = Path(__file__).resolve().parents[1]  # sdk/python
REPO = SDK.parents[1]
sys.path.insert(0, str(SDK))

import taskledger  # noqa: E402

T = TypeVar("T")

# Tokens of the auth file: serve refuses one shorter than 32 characters.
OPERATOR = "op-token-0123456789abcdef01234567"
ACME = "acme-token-0123456789abcdef012345"
OTHER = "other-token-0123456789abcdef01234"
LIMITED = "limited-token-0123456789abcdef012"  # customer "limited": at most one active root task
MAX_DEPTH = 3  # --max-lineage-depth

_bin: str | None = None
_tmp = tempfile.mkdtemp(prefix="taskledger-pysdk-")
atexit.register(shutil.rmtree, _tmp, True)


def binary() -> str:
    """The taskledger binary: $TASKLEDGER_BIN, or built once per test run."""
    global _bin
    if _bin is None:
        _bin = os.environ.get("TASKLEDGER_BIN") or os.path.join(_tmp, "taskledger")
        if not os.environ.get("TASKLEDGER_BIN"):
            subprocess.run(["go", "build", "-o", _bin, "./cmd/taskledger"], cwd=REPO, check=True)
    return _bin


def free_port() -> int:
    """A loopback port no listener holds now, below the kernel's ephemeral
    range (32768 and up on Linux), which every port-0 listener draws from,
    the server's own embedded NATS listener included: a port taken from
    that range and closed again could be handed to it before the server
    binds its HTTP port there."""
    for _ in range(100):
        port = random.randrange(10000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below 32000 in 100 tries")


_names = itertools.count(1)


def unique(prefix: str) -> str:
    """A fresh id (queue, request id) for one test."""
    return f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:8]}"


def eventually(fn: Callable[[], T | None], timeout: float = 30.0, what: str = "condition") -> T:
    """Calls fn until it returns a truthy value and returns it (with a
    growing pause between tries), or fails after timeout seconds, like
    internal/testnode.Eventually."""
    deadline, pause = time.monotonic() + timeout, 0.01
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        time.sleep(pause)
        pause = min(2 * pause, 0.25)


class Server:
    """A running ``taskledger serve``; stop() ends it."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="serve-", dir=_tmp)
        auth = os.path.join(self.dir, "auth")
        # serve refuses an auth file its group or others may read.
        with open(os.open(auth, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(f"{OPERATOR} *\n{ACME} acme\n{OTHER} other\n{LIMITED} limited\n")
        quota = os.path.join(self.dir, "quota.json")
        with open(quota, "w") as f:
            f.write('{"customers": {"limited": {"maxActiveRoots": 1}}}')
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(self.dir, "serve.log"), "w+b")
        self.proc = subprocess.Popen(
            [binary(), "serve", "--data", os.path.join(self.dir, "data"), "--http", self.url[len("http://"):],
             "--auth-file", auth, "--quota-file", quota, "--max-lineage-depth", str(MAX_DEPTH),
             "--log-format", "json", "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        probe = taskledger.Client(self.url, timeout=5)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"taskledger serve exited {self.proc.returncode}:\n{self.output()}")
            try:
                probe.readyz()
                return True
            except (OSError, taskledger.TaskledgerError):
                return False

        eventually(ready, 60, "taskledger serve ready")
        probe.close()

    def client(self, token: str = OPERATOR, timeout: float = 30.0) -> taskledger.Client:
        return taskledger.Client(self.url, token, timeout)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(70)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
