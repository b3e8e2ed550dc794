"""Liveness and hand-over against a real taskledger serve: heartbeats keep
a claim, a missed one loses it (ClaimLost) and the late executor's writes
raise ClaimLost, a worker heartbeats in the background, stops a run whose
claim was lost, and releases its claims on stop() for another executor
(another id) to resume the saved Run, the hand-over in its transcript."""

from __future__ import annotations

import queue as queuelib
import threading
import time
import unittest
from typing import Any

from tests.harness import ACME, Server, eventually, unique

import taskledger
from taskledger import REASON_CLAIM_LOST, ClaimLost, Run, Stopped, Turn, Worker
from taskledger.types import ITEM_HANDOVER, ITEM_MODEL_OUTPUT, Task

srv: Server


def setUpModule() -> None:
    global srv
    srv = Server()


def tearDownModule() -> None:
    srv.stop()


class LivenessTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = srv.client(ACME)
        self.addCleanup(self.api.close)
        self.queue = unique("live")

    def start(self, handler: Any, executor_id: str, **opts: Any) -> tuple[Worker, threading.Thread]:
        """Runs a worker in a thread; stopped when the test ends if still running."""
        w = Worker(self.api, handler, queue=self.queue, executor_id=executor_id, concurrency=1,
                   check_interval=0.1, poll_wait=1, **opts)
        th = threading.Thread(target=w.run, daemon=True)
        th.start()

        def stop() -> None:
            w.stop()
            th.join(30)

        self.addCleanup(stop)
        return w, th

    def schedule(self, attempts: int = 1) -> Task:
        return self.api.schedule(queue=self.queue, message=taskledger.Message(content=[taskledger.ContentPart("text", "x")]),
                                 retry=taskledger.RetryRequest(max_attempts=attempts))[0]

    def history(self, task_id: str) -> list[str]:
        return [e.type for e in self.api.history(task_id)]

    def test_heartbeat_then_missed(self) -> None:
        task = self.schedule(attempts=2)
        t = self.api.claim_next("py-a", self.queue, wait_seconds=10, heartbeat_seconds=1)
        assert t is not None and t.claim is not None
        self.assertEqual(t.claim.heartbeat_seconds, 1)
        token = t.claim.delivery_id
        for _ in range(6):  # 1.5 s of renewals, each for one more second
            r = self.api.heartbeat(task.id, token)
            self.assertTrue(r.expires_at and r.deadline)
            time.sleep(0.25)  # the executor's heartbeat period
        self.assertEqual(self.api.get(task.id).status, "running")
        again = eventually(lambda: (lambda x: x if x.status == "queued" else None)(self.api.get(task.id)),
                           what="claim lost and the task queued again")
        self.assertEqual((again.attempt, again.attempts[0].outcome), (2, "claim_lost"))
        self.assertIn("ClaimLost", self.history(task.id))
        with self.assertRaises(ClaimLost):
            self.api.heartbeat(task.id, token)
        with self.assertRaises(ClaimLost):
            self.api.record_result(task.id, success=True, delivery_id=token)

    def test_worker_heartbeats_past_the_interval(self) -> None:
        def handler(run: Run) -> str:
            run.wait(3)  # three intervals: only the background heartbeats keep the claim
            return "kept"

        self.start(handler, "py-beat", heartbeat_seconds=1)
        task = self.schedule()
        done = eventually(lambda: (lambda x: x if x.terminal else None)(self.api.get(task.id)), what="task ends")
        self.assertEqual((done.status, done.result.summary if done.result else ""), ("succeeded", "kept"))
        self.assertNotIn("ClaimLost", self.history(task.id))

    def test_claim_lost_stops_the_run(self) -> None:
        stopped: queuelib.Queue[str] = queuelib.Queue()

        def handler(run: Run) -> str:
            started.put(run.delivery_id)
            try:
                while True:
                    run.check()
                    run.wait(0.1)
            except Stopped as e:
                stopped.put(e.reason)
                raise

        started: queuelib.Queue[str] = queuelib.Queue()
        self.start(handler, "py-lost", heartbeat_seconds=1)
        task = self.schedule()
        token = started.get(timeout=30)
        self.api.release(task.id, token, "taken away")  # as a missed heartbeat would end it
        self.assertEqual(stopped.get(timeout=30), REASON_CLAIM_LOST)
        self.assertEqual(self.history(task.id).count("ResultRecorded"), 0)

    def test_release_on_stop_and_hand_over(self) -> None:
        turns: list[str] = []
        blocked = threading.Event()

        def handler(run: Run) -> str:
            def first(t: Turn) -> None:
                turns.append(f"turn 1 by {run.task.claim.executor_id if run.task.claim else ''}")
                t.record(ITEM_MODEL_OUTPUT, "planned")

            def second(t: Turn) -> None:
                turns.append(f"turn 2 by {run.task.claim.executor_id if run.task.claim else ''}")
                if run.task.claim and run.task.claim.executor_id == "py-first":
                    blocked.set()
                    while not run.wait(0.1):
                        pass
                    raise Stopped("worker shutting down")
                t.record(ITEM_MODEL_OUTPUT, "done")

            run.turn(first)
            run.turn(second)
            return "handed over"

        w, th = self.start(handler, "py-first")
        task = self.schedule()
        self.assertTrue(blocked.wait(30))
        w.stop()
        th.join(30)
        self.assertFalse(th.is_alive())
        released = self.api.get(task.id)
        self.assertIn(released.status, ("scheduled", "queued"))
        self.assertEqual((released.attempts[0].outcome, released.attempts[0].executor_id), ("released", "py-first"))

        self.start(handler, "py-second")
        done = eventually(lambda: (lambda x: x if x.terminal else None)(self.api.get(task.id)), what="task ends")
        self.assertEqual((done.status, done.claim.executor_id if done.claim else ""), ("succeeded", "py-second"))
        self.assertEqual(turns, ["turn 1 by py-first", "turn 2 by py-first", "turn 2 by py-second"])
        run = self.api.get_run(task.id).run
        self.assertEqual(run.executor_id, "py-second")
        handover = [i for i in run.transcript if i.kind == ITEM_HANDOVER]
        self.assertEqual(len(handover), 1)
        self.assertEqual(handover[0].id, "handover-" + (done.claim.delivery_id if done.claim else ""))
        self.assertIn("py-first", handover[0].content[0].text)
        # A poll in flight at stop() may claim the task once more: it hands
        # it back unstarted, so every loss is a release.
        lost = [e.detail for e in self.api.history(task.id) if e.type == "ClaimLost"]
        self.assertTrue(lost and all("released" in d for d in lost), lost)


if __name__ == "__main__":
    unittest.main()
