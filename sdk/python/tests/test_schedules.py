"""Schedules through the Client against a real taskledger serve: create,
fires that make tasks with derived request ids, pause, trigger, resume,
delete with history kept, tenancy and refusals."""

from __future__ import annotations

import unittest

from tests.harness import ACME, OPERATOR, OTHER, Server, eventually, unique

import taskledger
from taskledger import errors
from taskledger.types import (
    Concurrency,
    ContentPart,
    Message,
    RetryRequest,
    Schedule,
    ScheduleCreateRequest,
    ScheduleTask,
    derive_id,
    schedule_request_id,
)

srv: Server


def setUpModule() -> None:
    global srv
    srv = Server()


def tearDownModule() -> None:
    srv.stop()


class SchedulesTest(unittest.TestCase):
    def setUp(self) -> None:
        self.acme = srv.client(ACME)
        self.addCleanup(self.acme.close)
        self.queue = unique("sq")

    def request(self, schedule_id: str, **fields: object) -> ScheduleCreateRequest:
        task = ScheduleTask(queue=self.queue, message=Message(content=[ContentPart("text", "nightly triage")]), timeout_seconds=120)
        return ScheduleCreateRequest(id=schedule_id, every="1s", overlap=taskledger.types.OVERLAP_ALLOW, task=task, **fields)  # type: ignore[arg-type]

    def test_lifecycle(self) -> None:
        sid = unique("s")
        s, created = self.acme.create_schedule(self.request(sid))
        self.assertTrue(created)
        self.assertEqual((s.id, s.customer_id, s.every, s.timezone, s.catchup, s.task.queue, s.task.timeout_seconds),
                         (sid, "acme", "1s", "UTC", "one", self.queue, 120))
        self.assertEqual(len(s.next), 5)
        again, created = self.acme.create_schedule(self.request(sid))
        self.assertFalse(created)
        self.assertEqual(again.updated_at, "")  # unchanged (a run may have fired in between)

        def two_runs() -> Schedule | None:
            got = self.acme.get_schedule(sid)
            return got if got.run_count >= 2 and all(r.status for r in got.runs) else None

        s = eventually(two_runs, what="two runs")
        for run in s.runs:
            self.assertEqual(run.request_id, schedule_request_id(sid, run.at))
            task = self.acme.get(run.task_id)
            self.assertEqual((task.id, task.request_id, task.queue), (derive_id("r", "acme", run.request_id), run.request_id, self.queue))
            self.assertEqual(task.message.text(), "nightly triage")

        paused = self.acme.pause_schedule(sid)
        self.assertTrue(paused.paused)
        self.assertEqual(paused.next, [])
        task = self.acme.trigger_schedule(sid)
        self.assertEqual(task.queue, self.queue)
        s = self.acme.get_schedule(sid)
        self.assertTrue(s.runs[0].manual)
        self.assertEqual(s.runs[0].task_id, task.id)
        self.assertFalse(self.acme.resume_schedule(sid).paused)
        self.assertIn(sid, [x.id for x in self.acme.list_schedules().schedules])

        deleted = self.acme.delete_schedule(sid)
        self.assertTrue(deleted.deleted)
        self.assertNotIn(sid, [x.id for x in self.acme.list_schedules().schedules])
        types = [e.type for e in self.acme.schedule_history(sid)]
        for t in ("ScheduleCreated", "ScheduleFired", "SchedulePaused", "ScheduleResumed", "ScheduleDeleted"):
            self.assertIn(t, types)
        self.assertTrue(self.acme.get_schedule(sid).deleted)  # history kept
        with self.assertRaises(errors.NotFound):
            self.acme.pause_schedule(sid)

    def test_task_spec(self) -> None:
        sid = unique("s")
        req = self.request(sid, paused=True)
        req.every = "1h"  # runs only when triggered
        assert req.task is not None
        req.task.labels = {"kind": "nightly", "repo": "example/storefront"}
        req.task.retry = RetryRequest(max_attempts=3, on=["failed", "timed_out"])
        req.task.concurrency = Concurrency(key=unique("repo:"), limit=2)
        s, created = self.acme.create_schedule(req)
        self.assertTrue(created)
        self.assertEqual((s.task.labels, s.task.concurrency), (req.task.labels, req.task.concurrency))
        self.assertEqual(s.task.retry, RetryRequest(max_attempts=3, backoff_seconds=10, max_backoff_seconds=3600, on=["failed", "timed_out"]))
        task = self.acme.trigger_schedule(sid)
        assert task.retry is not None
        self.assertEqual((task.labels, task.concurrency, task.max_attempts, task.retry.on),
                         (req.task.labels, req.task.concurrency, 3, ["failed", "timed_out"]))
        self.assertEqual([t.id for t in self.acme.list(labels={"kind": "nightly"}, queue=self.queue).tasks], [task.id])
        for bad in (ScheduleTask(labels={"Bad": "key"}), ScheduleTask(retry=RetryRequest(max_attempts=101)),
                    ScheduleTask(concurrency=Concurrency(key="k", limit=0))):
            with self.assertRaises(errors.InvalidArgument, msg=str(bad)):
                self.acme.create_schedule(ScheduleCreateRequest(id=unique("bad"), every="1h", task=bad))

    def test_refusals_and_tenancy(self) -> None:
        sid = unique("s")
        for bad in (dict(cron="61 * * * *", every=""), dict(every="10ms"), dict(cron="0 3 * * *", every="", timezone="Mars/Base"),
                    dict(catchup="some"), dict(overlap="maybe")):
            with self.assertRaises(errors.InvalidArgument, msg=str(bad)):
                req = self.request(sid)
                for k, v in bad.items():
                    setattr(req, k, v)
                self.acme.create_schedule(req)
        self.acme.create_schedule(self.request(sid, paused=True))
        other = srv.client(OTHER)
        self.addCleanup(other.close)
        for call in (other.get_schedule, other.pause_schedule, other.trigger_schedule, other.delete_schedule, other.schedule_history):
            with self.assertRaises(errors.NotFound):
                call(sid)
        op = srv.client(OPERATOR)
        self.addCleanup(op.close)
        self.assertEqual(op.get_schedule(sid, customer_id="acme").customer_id, "acme")
        self.assertTrue(issubclass(errors.ScheduleLimit, errors.Conflict))
        self.assertIs(type(errors.error_for(409, "conflict", "schedule_limit")), errors.ScheduleLimit)


if __name__ == "__main__":
    unittest.main()
