"""The Client against a real taskledger serve: every route, and the typed
errors of its refusals."""

from __future__ import annotations

import unittest
from collections.abc import Callable

from tests.harness import ACME, LIMITED, MAX_DEPTH, OPERATOR, OTHER, Server, eventually, unique

import taskledger
from taskledger import errors
from taskledger.types import (
    WAITING_FOR_CONCURRENCY,
    Effect,
    Message,
    ResultItem,
    ResultRequest,
    RetryRequest,
    RunState,
    ScheduleRequest,
    Signal,
    ToolCall,
    TranscriptItem,
)

srv: Server


def setUpModule() -> None:
    global srv
    srv = Server()


def tearDownModule() -> None:
    srv.stop()


def text(s: str) -> Message:
    return Message(content=[taskledger.ContentPart("text", s)])


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.op = self.client(OPERATOR)
        self.acme = self.client(ACME)
        self.queue = unique("q")

    def client(self, token: str) -> taskledger.Client:
        c = srv.client(token)
        self.addCleanup(c.close)
        return c

    def schedule(self, **fields: object) -> taskledger.Task:
        fields.setdefault("queue", self.queue)
        task, created = self.acme.schedule(**fields)  # type: ignore[arg-type]
        self.assertTrue(created)
        return task

    def queued(self, task_id: str) -> taskledger.Task:
        """The task once its ready notification is out (claimable)."""
        def queued() -> taskledger.Task | None:
            t = self.acme.get(task_id)
            return t if t.status == "queued" else None

        return eventually(queued, what=f"task {task_id} queued")

    def running(self, **fields: object) -> taskledger.Task:
        t = self.schedule(**fields)
        claimed = self.acme.claim_next("py-w", self.queue, wait_seconds=10)
        assert claimed is not None
        self.assertEqual(claimed.id, t.id)
        return claimed

    def test_probes_and_documents(self) -> None:
        self.assertEqual(self.op.healthz(), {"status": "ok"})
        ready = self.op.readyz(digest=True)
        self.assertTrue(ready["caughtUp"])
        self.assertIn("digest", ready)
        self.assertIn("/v1/tasks", self.op.openapi()["paths"])
        self.assertIn("taskledger_", self.op.metrics())
        rebuilt = self.op.rebuild_projections()
        self.assertIn("digest", rebuilt)
        with self.assertRaises(errors.NotFound):
            self.acme.rebuild_projections()  # operators only

    def test_schedule_get_list(self) -> None:
        req = ScheduleRequest(queue=self.queue, request_id=unique("req"), repo="example/storefront",
                              signal=Signal(id="evt-1", event_type="pull_request"), message=text("fix it"),
                              timeout_seconds=120)
        t, created = self.acme.schedule(req)
        self.assertTrue(created)
        self.assertEqual((t.customer_id, t.queue, t.repo, t.timeout_seconds), ("acme", self.queue, req.repo, 120))
        self.assertEqual(t.message.text(), "fix it")
        again, created = self.acme.schedule(req)
        self.assertFalse(created)  # the request id repeated
        self.assertEqual(again.id, t.id)
        got = self.acme.get(t.id)
        self.assertEqual((got.id, got.signal.id if got.signal else ""), (t.id, "evt-1"))
        second = self.schedule()
        page = self.acme.list(queue=self.queue, limit=1)
        self.assertEqual(len(page.tasks), 1)
        self.assertTrue(page.next)
        self.assertEqual(sorted(x.id for x in self.acme.list_all(queue=self.queue, limit=1)), sorted([t.id, second.id]))
        self.assertEqual(self.client(OTHER).list(queue=self.queue).tasks, [])  # another customer sees none

    def test_claim_check_result(self) -> None:
        t = self.queued(self.schedule(message=text("work")).id)
        assert t.delivery is not None
        with self.assertRaises(errors.TokenMismatch) as cm:
            self.acme.claim(t.id, "not-the-token", "py-w")
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.reason), (409, "conflict", "token_mismatch"))
        self.assertIsInstance(cm.exception, errors.Conflict)
        running = self.acme.claim(t.id, t.delivery.id, "py-w")
        self.assertEqual(running.status, "running")
        assert running.claim is not None
        self.assertEqual((running.claim.delivery_id, running.claim.executor_id), (t.delivery.id, "py-w"))
        with self.assertRaises(errors.NotClaimable):
            self.acme.claim(t.id, t.delivery.id, "py-w")  # a token is claimed at most once
        self.assertEqual(self.acme.claim_next("py-w", self.queue, wait_seconds=0.05), None)  # 204: nothing left

        acc = self.acme.append_mail(t.id, Message(id="m1", content=[taskledger.ContentPart("text", "also this")]))
        self.assertEqual((acc.message_id, acc.index), ("m1", 1))
        self.assertEqual(self.acme.append_mail(t.id, Message(id="m1", content=text("again").content)).index, 1)
        chk = self.acme.check(t.id)  # a monitor's check peeks
        self.assertEqual((chk.should_stop, chk.reason, [m.id for m in chk.messages], chk.cursor), (False, "active", ["m1"], 0))
        chk = self.acme.check(t.id, t.delivery.id)  # the claim holder's consumes
        self.assertEqual((chk.should_stop, chk.reason, [m.id for m in chk.messages], chk.cursor), (False, "active", ["m1"], 1))
        mail = self.acme.mailbox(t.id)
        self.assertEqual(([m.id for m in mail.messages], mail.cursor), (["m1"], 1))
        self.assertEqual(self.acme.mailbox(t.id, after=1).messages, [])

        with self.assertRaises(errors.TokenMismatch):
            self.acme.record_result(t.id, success=True, delivery_id="someone-else")
        done = self.acme.record_result(t.id, ResultRequest(success=True, summary="did it", delivery_id=t.delivery.id,
                                                           effects=[Effect(kind="pull_request", ref="#1")]))
        self.assertEqual(done.status, "succeeded")
        assert done.result is not None
        self.assertEqual((done.result.summary, done.result.effects[0].ref), ("did it", "#1"))
        with self.assertRaises(errors.OperatorOnly):  # without the claim's token: an operator's action
            self.acme.record_result(t.id, success=False)
        with self.assertRaises(errors.Terminal):
            self.acme.append_mail(t.id, text("too late"))
        chk = self.acme.check(t.id)
        self.assertEqual((chk.should_stop, chk.reason), (True, "terminal"))
        types = [e.type for e in self.acme.history(t.id)]
        self.assertEqual(types[0], "TaskScheduled")
        self.assertIn("Claimed", types)
        self.assertEqual(types[-1], "ResultRecorded")

    def test_retry(self) -> None:
        t = self.schedule(retry=RetryRequest(max_attempts=2, backoff_seconds=0))
        assert t.retry is not None
        self.assertEqual((t.attempt, t.max_attempts, t.attempts), (1, 2, []))
        self.assertEqual((t.retry.max_attempts, t.retry.backoff_seconds, t.retry.max_backoff_seconds, t.retry.on),
                         (2, 0, 3600, ["failed"]))
        first = self.acme.claim_next("py-w", self.queue, wait_seconds=10)
        assert first is not None and first.claim is not None
        again = self.acme.record_result(t.id, error="flaky", delivery_id=first.claim.delivery_id)
        self.assertIn(again.status, ("scheduled", "queued"))  # retried: the failure is an attempt, not the end
        self.assertEqual((again.attempt, again.result), (2, None))
        second = self.acme.claim_next("py-w2", self.queue, wait_seconds=10)
        assert second is not None and second.claim is not None
        self.assertEqual((second.id, second.attempt), (t.id, 2))
        with self.assertRaises(errors.TokenMismatch):  # the first attempt's claim is gone
            self.acme.record_result(t.id, success=True, delivery_id=first.claim.delivery_id)
        done = self.acme.record_result(t.id, error="still flaky", delivery_id=second.claim.delivery_id)
        self.assertEqual(done.status, "failed")  # the last attempt's failure is final
        self.assertEqual([(a.attempt, a.outcome, a.executor_id, a.error) for a in done.attempts],
                         [(1, "failed", "py-w", "flaky"), (2, "failed", "py-w2", "still flaky")])
        self.assertTrue(all(a.started_at and a.ended_at for a in done.attempts))
        self.assertEqual([e.type for e in self.acme.history(t.id)].count("RetryScheduled"), 1)

    def test_not_retryable(self) -> None:
        self.assertEqual(ResultRequest(retryable=False).to_json(), {"retryable": False})
        self.assertEqual(ResultRequest(retryable=None).to_json(), {})
        t = self.running(retry=RetryRequest(max_attempts=3))
        assert t.claim is not None
        done = self.acme.record_result(t.id, ResultRequest(error="bad input", retryable=False, delivery_id=t.claim.delivery_id))
        assert done.result is not None
        self.assertEqual((done.status, done.attempt, done.result.retryable), ("failed", 1, False))
        for bad in (RetryRequest(max_attempts=0), RetryRequest(max_attempts=101), RetryRequest(max_attempts=2, on=["canceled"]),
                    RetryRequest(max_attempts=2, backoff_seconds=-1)):
            with self.assertRaises(errors.InvalidArgument):
                self.acme.schedule(queue=self.queue, retry=bad)

    def test_cancel(self) -> None:
        t = self.schedule()
        c = self.acme.cancel(t.id, "no longer needed")
        self.assertEqual((c.status, c.reason), ("canceled", "no longer needed"))
        with self.assertRaises(errors.Terminal):
            self.acme.cancel(t.id)

    def test_concurrency(self) -> None:
        key = unique("repo:example/")
        conc = taskledger.Concurrency(key=key, limit=1)
        first = self.running(concurrency=conc)
        self.assertEqual(first.concurrency, conc)
        second = self.schedule(concurrency=conc)

        def waiting() -> taskledger.Task | None:
            t = self.acme.get(second.id)
            return t if t.waiting_for == WAITING_FOR_CONCURRENCY else None

        self.assertEqual(eventually(waiting, what="second task waiting").status, "scheduled")
        k = self.acme.concurrency(key)
        self.assertEqual((k.customer_id, k.key), ("acme", key))
        self.assertEqual([h.task_id for h in k.holders], [first.id])
        self.assertEqual([w.task_id for w in k.waiters], [second.id])
        # The operator names the customer; another customer sees nothing of it.
        self.assertEqual([h.task_id for h in self.op.concurrency(key, "acme").holders], [first.id])
        with self.assertRaises(errors.NotFound):
            self.client(OTHER).concurrency(key, "acme")
        self.assertEqual(self.client(OTHER).concurrency(key).holders, [])
        with self.assertRaises(errors.InvalidArgument):
            self.acme.concurrency("")
        with self.assertRaises(errors.InvalidArgument):
            self.acme.schedule(queue=self.queue, concurrency=taskledger.Concurrency(key=key, limit=1001))

        assert first.claim is not None
        self.acme.record_result(first.id, delivery_id=first.claim.delivery_id, success=True)
        self.assertEqual(self.queued(second.id).waiting_for, "")
        types = [e.type for e in self.acme.history(second.id)]
        self.assertEqual(types[:3], ["TaskScheduled", "SlotAcquired", "DeliveryPending"])
    def test_labels_and_search(self) -> None:
        labels = {"repo": "example/storefront", "team": unique("team")}
        t = self.schedule(labels=labels, request_id=unique("req"))
        plain = self.schedule()
        self.assertEqual(t.labels, labels)
        self.assertEqual(self.acme.get(plain.id).labels, {})
        self.assertEqual([x.id for x in self.acme.list(labels=labels).tasks], [t.id])
        self.assertEqual([x.id for x in self.acme.list(labels={"team": labels["team"]}, queue=self.queue).tasks], [t.id])
        self.assertEqual([x.id for x in self.acme.list(request_id=t.request_id).tasks], [t.id])
        self.assertEqual([x.id for x in self.acme.list(queue=self.queue, created_after=t.created_at).tasks], [plain.id])
        self.assertEqual([x.id for x in self.acme.list(queue=self.queue, created_before=plain.created_at).tasks], [t.id])
        self.assertEqual(self.client(OTHER).list(labels=labels).tasks, [])  # another customer's labels
        with self.assertRaises(errors.InvalidArgument):
            self.acme.list(labels={"Bad": "key"})
        with self.assertRaises(errors.InvalidArgument):
            self.acme.schedule(queue=self.queue, labels={f"k{i}": "v" for i in range(17)})

    def test_retry_task(self) -> None:
        old = self.schedule(labels={"repo": "example/storefront"}, message=text("flaky"), timeout_seconds=90,
                            retry=RetryRequest(max_attempts=2), concurrency=taskledger.Concurrency(key=unique("k"), limit=1000))
        with self.assertRaises(errors.NotTerminal) as cm:
            self.acme.retry_task(old.id)
        self.assertEqual((cm.exception.status, cm.exception.reason), (409, "not_terminal"))
        self.acme.cancel(old.id, "retry it")
        new, created = self.acme.retry_task(old.id)
        self.assertTrue(created)
        self.assertNotEqual(new.id, old.id)
        self.assertEqual((new.related_task_id, new.retry_of, new.queue, new.timeout_seconds, new.labels, new.message.text()),
                         (old.id, old.id, self.queue, 90, old.labels, "flaky"))
        self.assertEqual((new.retry, new.concurrency, new.attempt), (old.retry, old.concurrency, 1))  # the policy and the key too
        key = unique("retry")
        first, created = self.acme.retry_task(old.id, request_id=key, message=text("again"))
        self.assertTrue(created)
        self.assertEqual(first.message.text(), "again")
        again, created = self.acme.retry_task(old.id, request_id=key)
        self.assertFalse(created)  # the request id repeated
        self.assertEqual(again.id, first.id)
        with self.assertRaises(errors.NotFound):
            self.client(OTHER).retry_task(old.id)

    def test_batches(self) -> None:
        items = self.acme.schedule_batch([ScheduleRequest(queue=self.queue), ScheduleRequest(queue=self.queue),
                                          ScheduleRequest(queue="bad queue!")])
        self.assertEqual([i.status for i in items], [201, 201, 400])
        self.assertIsNone(items[0].err())
        self.assertIsInstance(items[2].err(), errors.InvalidArgument)
        ids = {i.task.id for i in items[:2] if i.task}
        claimed = eventually(lambda: self.acme.claim_batch("py-w", self.queue, max=2, wait_seconds=5), what="claims")
        while len(claimed) < 2:  # the second may come in a later poll
            claimed += self.acme.claim_batch("py-w", self.queue, max=2, wait_seconds=5)
        self.assertEqual({t.id for t in claimed}, ids)
        self.assertEqual(self.acme.claim_batch("py-w", self.queue, max=2, wait_seconds=0.05), [])
        first = claimed[0]
        assert first.claim is not None
        res = self.acme.record_results([ResultItem(task_id=first.id, success=True, delivery_id=first.claim.delivery_id),
                                        ResultItem(task_id=unique("missing"), success=True, delivery_id="no-such-claim")])
        self.assertEqual([r.status for r in res], [200, 404])
        self.assertIsInstance(res[1].err(), errors.NotFound)
        with self.assertRaises(errors.InvalidArgument):
            self.acme.schedule_batch([])

    def test_lineage(self) -> None:
        root = self.schedule()
        child = self.schedule(parent_id=root.id)
        self.assertEqual((child.root_id, child.parent_id), (root.id, root.id))
        tree = self.acme.tree(child.id)
        self.assertEqual((tree.task.id, [c.task.id for c in tree.children]), (root.id, [child.id]))
        self.assertEqual({e.task_id for e in self.acme.lineage_history(root.id)}, {root.id, child.id})
        deepest = child
        for _ in range(MAX_DEPTH - 1):
            deepest = self.schedule(parent_id=deepest.id)
        with self.assertRaises(errors.LineageLimit) as cm:
            self.schedule(parent_id=deepest.id)
        self.assertEqual((cm.exception.status, cm.exception.reason), (409, "lineage_limit"))
        self.acme.cancel(root.id)
        with self.assertRaises(errors.ParentTerminal):
            self.schedule(parent_id=root.id)
        with self.assertRaises(errors.AncestorTerminal):  # further down the canceled lineage
            self.schedule(parent_id=child.id)
        with self.assertRaises(errors.NotFound):
            self.schedule(parent_id=unique("nosuch"))

    def test_request_id_under_another_parent(self) -> None:
        a, b = self.schedule(), self.schedule()
        req = unique("req")
        child = self.schedule(parent_id=a.id, request_id=req)
        again, created = self.acme.schedule(parent_id=a.id, request_id=req)
        self.assertEqual((again.id, again.parent_id, created), (child.id, a.id, False))
        for parent in (b.id, ""):
            with self.assertRaises(errors.RequestIDConflict) as cm:
                self.schedule(parent_id=parent, request_id=req)
            self.assertEqual((cm.exception.status, cm.exception.reason), (409, "request_id_conflict"))

    def test_customer_events(self) -> None:
        t = self.schedule()
        own = [e for e in self.acme.customer_events() if e.task_id == t.id]
        self.assertEqual(own[0].type, "TaskScheduled")
        self.assertTrue(any(e.task_id == t.id for e in self.op.customer_events("acme")))
        with self.assertRaises(errors.InvalidArgument):
            list(self.op.customer_events())  # an operator must name the customer
        with self.assertRaises(errors.NotFound):
            list(self.acme.customer_events("other"))

    def test_errors(self) -> None:
        t = self.schedule()
        with self.assertRaises(errors.NotFound) as cm:
            self.client(OTHER).get(t.id)  # another customer's task is not found
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        other = self.client(OTHER)
        calls: list[Callable[[], object]] = [lambda: other.cancel(t.id), lambda: other.history(t.id),
                                             lambda: other.get_run(t.id), lambda: other.append_mail(t.id, text("x"))]
        for call in calls:
            with self.assertRaises(errors.NotFound):
                call()
        with self.assertRaises(errors.InvalidArgument) as bad:
            self.acme.get("not an id!")
        self.assertEqual(bad.exception.status, 400)
        for hostile in ("../../v1/admin/projections/rebuild", "a/b", "x" * 65, "a?b=1", "%2e%2e", "é"):
            with self.subTest(id=hostile), self.assertRaises(errors.InvalidArgument):
                self.acme.cancel(hostile)  # quoted whole: never another route
        for bad_list in ({"limit": 0}, {"status": "nope"}, {"queue": "no queue"}):
            with self.subTest(list=bad_list), self.assertRaises(errors.InvalidArgument):
                self.acme.list(**bad_list)  # type: ignore[arg-type]
        with self.assertRaises(errors.InvalidArgument):
            self.acme.claim_next("py-w", self.queue, wait_seconds=-1)
        with self.assertRaises(errors.InvalidArgument):
            self.acme.claim_batch("py-w", self.queue, max=1001)
        with self.assertRaises(errors.InvalidArgument):
            self.schedule(timeout_seconds=0)
        with self.assertRaises(errors.InvalidArgument):
            self.acme.schedule(queue=self.queue, customer_id="other")  # a customer names only itself
        with self.assertRaises(errors.PayloadTooLarge) as big:
            self.acme.schedule(queue=self.queue, repo="x" * (1 << 20))
        self.assertEqual(big.exception.status, 413)
        with self.assertRaises(errors.Unauthenticated):
            self.client("").get(t.id)
        with self.assertRaises(errors.Unauthenticated):
            self.client("wrong-token").get(t.id)
        with self.assertRaises(ValueError):
            self.acme.get("")

    def test_admission_rejected(self) -> None:
        limited = self.client(LIMITED)
        limited.schedule(queue=self.queue)
        with self.assertRaises(errors.AdmissionRejected) as cm:
            limited.schedule(queue=self.queue)
        e = cm.exception
        self.assertEqual((e.status, e.code), (429, "admission_rejected"))
        assert e.task is not None
        self.assertEqual(e.task.status, "canceled")
        self.assertTrue(e.task.reason.startswith("quota"))


class RunRoutesTest(unittest.TestCase):
    """PUT/GET /v1/tasks/{id}/run and POST /v1/tasks/{id}/effects."""

    def setUp(self) -> None:
        self.acme = srv.client(ACME)
        self.addCleanup(self.acme.close)
        self.queue = unique("q")
        self.acme.schedule(queue=self.queue)
        t = self.acme.claim_next("py-w", self.queue, wait_seconds=10)
        assert t is not None and t.claim is not None
        self.task, self.token = t, t.claim.delivery_id

    def test_save_and_read(self) -> None:
        with self.assertRaises(errors.NotFound):
            self.acme.get_run(self.task.id)  # before the first save
        call = ToolCall(id="t1.c1", name="search", input={"q": "flaky"}, turn=1, status="pending")
        state = RunState(executor_id="py-w", phase="planning", turn=1, pending_tools=[call],
                         transcript=[TranscriptItem(id="t1.c1", kind="tool_call", turn=1, tool=call)],
                         extra={"mine": {"kept": True}})
        doc = self.acme.save_run(self.task.id, self.token, 0, state)
        self.assertEqual((doc.task_id, doc.delivery_id), (self.task.id, self.token))
        self.assertGreater(doc.revision, 0)
        rev = doc.revision
        got = self.acme.get_run(self.task.id)
        self.assertEqual(got.run, state)
        self.assertEqual(got.run.extra, {"mine": {"kept": True}})  # fields the SDK does not know survive
        state.phase = "acting"
        with self.assertRaises(errors.StaleRevision):
            self.acme.save_run(self.task.id, self.token, 0, state)
        with self.assertRaises(errors.TokenMismatch):
            self.acme.save_run(self.task.id, "superseded", rev, state)
        self.assertEqual(self.acme.get_run(self.task.id).run.phase, "planning")  # nothing changed
        rev2 = self.acme.save_run(self.task.id, self.token, rev, state).revision
        self.assertGreater(rev2, rev)
        # The same save again (its answer lost) answers the revision it stored.
        self.assertEqual(self.acme.save_run(self.task.id, self.token, rev, state).revision, rev2)
        self.assertEqual(self.acme.get_run(self.task.id, revision=rev).run.phase, "planning")  # every revision stays
        state.phase = "other"
        with self.assertRaises(errors.StaleRevision):
            self.acme.save_run(self.task.id, self.token, rev, state)  # the revision moved on
        state.phase = "acting"
        with self.assertRaises(errors.PayloadTooLarge):
            self.acme.save_run(self.task.id, self.token, rev2, RunState(phase="x" * (1 << 20)))
        self.acme.record_result(self.task.id, success=True, delivery_id=self.token)
        with self.assertRaises(errors.Terminal):
            self.acme.save_run(self.task.id, self.token, rev2, state)
        self.assertEqual(self.acme.get_run(self.task.id).run.phase, "acting")  # readable after the end

    def test_report_effects(self) -> None:
        t = self.acme.report_effects(self.task.id, self.token, [Effect(kind="comment", ref="c1", url="https://x/c1")])
        self.assertEqual([(e.kind, e.ref) for e in t.effects], [("comment", "c1")])
        self.assertTrue(t.effects[0].at)  # the scheduler stamps the time
        with self.assertRaises(errors.TokenMismatch):
            self.acme.report_effects(self.task.id, "superseded", [Effect(kind="comment", ref="c2")])
        with self.assertRaises(errors.InvalidArgument):
            self.acme.report_effects(self.task.id, self.token, [Effect(kind="x", ref=str(i)) for i in range(33)])
        with self.assertRaises(errors.InvalidArgument):
            self.acme.report_effects(self.task.id, self.token, [Effect(ref="no kind")])
        self.assertEqual(len(self.acme.get(self.task.id).effects), 1)
        self.acme.cancel(self.task.id)
        with self.assertRaises(errors.Terminal):
            self.acme.report_effects(self.task.id, self.token, [Effect(kind="comment", ref="c3")])
        self.assertEqual([e.ref for e in self.acme.get(self.task.id).effects], ["c1"])  # kept after the end


if __name__ == "__main__":
    unittest.main()
