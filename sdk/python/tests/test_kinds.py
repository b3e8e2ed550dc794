"""Typed payloads against a real taskledger serve: a task's kind and
payload, a result's output, the kind filter, and the Worker's typed
handlers (``@worker.handler("resize")``)."""

from __future__ import annotations

import subprocess
import threading
import unittest
from dataclasses import dataclass
from typing import Any

from tests.harness import ACME, Server, binary, eventually, unique

import taskledger
from taskledger import ResultRequest, Run, ScheduleRequest, ScheduleTask, Worker
from taskledger.types import MAX_OUTPUT_BYTES, MAX_PAYLOAD_BYTES, Task

srv: Server


def setUpModule() -> None:
    global srv
    srv = Server()


def tearDownModule() -> None:
    srv.stop()


@dataclass
class Resize:
    src: str
    width: int


class KindsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = srv.client(ACME)
        self.addCleanup(self.api.close)
        self.queue = unique("img")

    def start(self, w: Worker) -> None:
        th = threading.Thread(target=w.run, daemon=True)
        th.start()

        def stop() -> None:
            w.stop()
            th.join(30)
            self.assertFalse(th.is_alive(), "worker did not stop")

        self.addCleanup(stop)

    def ended(self, task_id: str) -> Task:
        return eventually(lambda: (lambda t: t if t.terminal else None)(self.api.get(task_id)), what=f"{task_id} ends")

    def test_kind_payload_and_output(self) -> None:
        t, _ = self.api.schedule(ScheduleRequest(queue=self.queue, kind="resize", payload={"src": "a.png", "width": 0}))
        self.assertEqual((t.kind, t.payload), ("resize", {"src": "a.png", "width": 0}))
        falsy, _ = self.api.schedule(ScheduleRequest(queue=self.queue, kind="resize", payload=False))
        self.assertIs(self.api.get(falsy.id).payload, False)  # false is a payload, not none
        claimed = eventually(lambda: self.api.claim_next("py-k", self.queue, 1), what="a claim")
        done = self.api.record_result(claimed.id, ResultRequest(success=True, delivery_id=claimed.claim.delivery_id,
                                                                output={"thumb": "a-small.png"}))
        self.assertEqual(done.result.output, {"thumb": "a-small.png"})
        listed = self.api.list(kind="resize", queue=self.queue).tasks
        self.assertEqual(sorted(x.id for x in listed), sorted([t.id, falsy.id]))
        self.assertTrue(all(x.kind == "resize" and x.payload is None for x in listed))
        with self.assertRaises(taskledger.InvalidArgument):
            self.api.schedule(ScheduleRequest(queue=self.queue, kind="Not A Kind"))
        with self.assertRaises(taskledger.PayloadTooLarge):
            self.api.schedule(ScheduleRequest(queue=self.queue, payload="x" * MAX_PAYLOAD_BYTES))
        with self.assertRaises(taskledger.InvalidArgument):
            self.api.list(kind="Bad")
        s, _ = self.api.create_schedule(id=unique("nightly"), every="1h",
                                        task=ScheduleTask(queue=self.queue, kind="resize", payload=[1, 2]))
        self.assertEqual((s.task.kind, s.task.payload), ("resize", [1, 2]))

    def test_typed_handlers(self) -> None:
        got: list[Resize] = []
        w = Worker(self.api, lambda run: "default " + run.task.kind, queue=self.queue, executor_id="py-typed",
                   concurrency=2, check_interval=0.1, poll_wait=1)

        @w.handler("resize", decode=lambda p: Resize(**p))
        def resize(run: Run, args: Resize) -> str:
            got.append(args)
            run.set_output({"thumb": args.src.removesuffix(".png") + f"-{args.width}.png"})
            return "resized"

        refused: list[str] = []

        @w.handler("echo")
        def echo(run: Run, payload: Any) -> None:
            run.set_output(payload)
            # "ü" is sent as \u00fc, 6 bytes: the server counts what is sent.
            for bad in ({"x": float("nan")}, {"x": object()}, "ü" * (MAX_OUTPUT_BYTES // 6 + 1)):
                try:
                    run.set_output(bad)
                except ValueError as e:
                    refused.append(str(e))

        self.assertRaises(ValueError, w.handler, "Resize")
        self.start(w)
        ok = self.api.schedule(queue=self.queue, kind="resize", payload={"src": "cat.png", "width": 64})[0]
        bad = self.api.schedule(queue=self.queue, kind="resize", payload={"source": "cat.png"})[0]
        echoed = self.api.schedule(queue=self.queue, kind="echo", payload=[1, "two", None])[0]
        other = self.api.schedule(queue=self.queue, kind="thumb")[0]
        r = self.ended(ok.id)
        self.assertEqual((r.status, r.result.summary, r.result.output), ("succeeded", "resized", {"thumb": "cat-64.png"}))
        r = self.ended(bad.id)
        self.assertEqual((r.status, r.result.retryable), ("failed", False))
        self.assertIn("the payload of kind 'resize' does not decode", r.result.error)
        self.assertEqual(self.ended(echoed.id).result.output, [1, "two", None])  # the refused outputs changed nothing
        self.assertEqual(len(refused), 3, refused)
        self.assertEqual(self.ended(other.id).result.summary, "default thumb")
        self.assertEqual(got, [Resize("cat.png", 64)])
        self.assertEqual(sorted(t.id for t in self.api.list_all(kind="resize", queue=self.queue)), sorted([ok.id, bad.id]))
        # The command line finds them too: taskledger list --kind resize.
        out = subprocess.run([binary(), "list", "--kind", "resize", "--queue", self.queue, "--server", srv.url, "--token", ACME],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        rows = out.strip().splitlines()[1:]
        self.assertEqual(sorted(r.split()[0] for r in rows), sorted([ok.id, bad.id]), out)
        self.assertTrue(all(r.split()[3] == "resize" for r in rows), out)

    def test_no_default_handler(self) -> None:
        w = Worker(self.api, queue=self.queue, executor_id="py-typed-only", check_interval=0.1, poll_wait=1)
        w.handler("resize")(lambda run, p: "ok")
        self.start(w)
        t = self.api.schedule(queue=self.queue, kind="unknown")[0]
        r = self.ended(t.id)
        self.assertEqual(r.status, "failed")
        self.assertIn("no handler for the task's kind 'unknown'", r.result.error)


if __name__ == "__main__":
    unittest.main()
