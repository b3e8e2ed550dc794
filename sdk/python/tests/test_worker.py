"""The Worker, Run and Turn in this process against a real taskledger
serve: Turns, tools, effects, children, the mailbox, stops, supersession
and resuming a saved Run."""

from __future__ import annotations

import queue as queuelib
import threading
import unittest
from collections.abc import Callable
from typing import Any

from tests.harness import ACME, Server, eventually, unique

import taskledger
from taskledger import Effect, Run, ScheduleRequest, Stopped, ToolCall, Turn, Worker
from taskledger.types import (
    ITEM_MODEL_INPUT,
    ITEM_MODEL_OUTPUT,
    EffectRecord,
    Message,
    RunState,
    Task,
    TranscriptItem,
)

srv: Server


def setUpModule() -> None:
    global srv
    srv = Server()


def tearDownModule() -> None:
    srv.stop()


class WorkerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = srv.client(ACME)
        self.addCleanup(self.api.close)
        self.queue = unique("q")

    def start(self, handler: Any, queue: str = "", executor_id: str = "py-w", check_interval: float = 0.1) -> Worker:
        """Runs a worker in a thread until the test ends."""
        w = Worker(self.api, handler, queue=queue or self.queue, executor_id=executor_id, concurrency=2,
                   check_interval=check_interval, poll_wait=1)
        th = threading.Thread(target=w.run, daemon=True)
        th.start()

        def stop() -> None:
            w.stop()
            th.join(30)
            self.assertFalse(th.is_alive(), "worker did not stop")

        self.addCleanup(stop)
        return w

    def schedule(self, **fields: Any) -> Task:
        fields.setdefault("queue", self.queue)
        return self.api.schedule(**fields)[0]

    def ended(self, task_id: str) -> Task:
        return eventually(lambda: (lambda t: t if t.terminal else None)(self.api.get(task_id)), what=f"{task_id} ends")

    def test_run_end_to_end(self) -> None:
        calls: list[str] = []
        seen_pending: list[list[str]] = []

        def search() -> Any:
            # The call is saved as pending before the tool runs.
            seen_pending.append([c.id for c in self.api.get_run(run_ids[0]).run.pending_tools])
            calls.append("search")
            return {"hits": 3}

        def broken() -> Any:
            raise ValueError("no such file")

        def slow() -> Any:
            raise TimeoutError("tool took too long")

        run_ids: list[str] = []

        def handler(run: Run) -> str:
            run_ids.append(run.task.id)
            run.set_phase("planning")
            run.save_context("issue", {"title": "flaky"})
            self.assertEqual(run.save_context("issue", {"title": "flaky test"}).version, 2)
            run.step("plan", lambda: calls.append("plan"))

            def turn(t: Turn) -> None:
                self.assertEqual(t.record(ITEM_MODEL_INPUT, "what next?").id, "t1.i1")
                t.record(ITEM_MODEL_OUTPUT, "search, read, build")
                self.assertEqual(t.dispatch(ToolCall(name="search", input={"q": "flaky"}), search).output, {"hits": 3})
                failed = t.dispatch(ToolCall(name="read"), broken)
                self.assertEqual((failed.status, failed.error), ("error", "no such file"))
                self.assertEqual(t.dispatch(ToolCall(id="build-1", name="build"), slow).status, "timeout")

            run.turn(turn)
            pr = run.effect("open-pr", lambda: Effect(kind="pull_request", ref="#7", url="https://example.test/pr/7"))
            child = run.delegate("review", ScheduleRequest(queue=self.queue + "-review"))
            self.assertEqual(run.delegate("review", ScheduleRequest(queue=self.queue + "-review")).id, child.id)
            verdict = run.await_child(child.id, timeout=30)
            return f"opened {pr.ref}, review {verdict.status}: {verdict.result.summary if verdict.result else ''}"

        self.start(handler)
        self.start(lambda run: "looks good", queue=self.queue + "-review", executor_id="py-reviewer")
        t = self.ended(self.schedule(message=Message(content=[taskledger.ContentPart("text", "fix it")])).id)
        assert t.result is not None
        self.assertEqual((t.status, t.result.summary), ("succeeded", "opened #7, review succeeded: looks good"))
        self.assertEqual([(e.kind, e.ref) for e in t.result.effects], [("pull_request", "#7")])
        self.assertEqual([(e.kind, e.ref) for e in t.effects], [("pull_request", "#7")])  # reported mid-run too
        self.assertEqual((calls, seen_pending), (["plan", "search"], [["t1.c1"]]))

        run = self.api.get_run(t.id).run
        self.assertEqual((run.executor_id, run.phase, run.turn, run.steps), ("py-w", "planning", 1, ["plan"]))
        self.assertEqual((run.contexts["issue"].version, run.contexts["issue"].value), (2, {"title": "flaky test"}))
        self.assertEqual(run.pending_tools, [])
        ids = [i.id for i in run.transcript if i.kind != "mailbox"]
        self.assertEqual(ids, ["t1.i1", "t1.i2", "t1.c1", "t1.c1.result", "t1.c2", "t1.c2.result", "build-1",
                               "build-1.result", "t1.end"])
        statuses = {i.id: i.tool.status for i in run.transcript if i.tool}
        self.assertEqual(statuses, {"t1.c1": "pending", "t1.c1.result": "ok", "t1.c2": "pending", "t1.c2.result": "error",
                                    "build-1": "pending", "build-1.result": "timeout"})
        self.assertEqual(run.effects["open-pr"].outcome, t.result.effects[0])
        review = self.api.get(run.children["review"])
        self.assertEqual((review.parent_id, review.status), (t.id, "succeeded"))
        # The child's report joined the transcript under its message id.
        self.assertIn(taskledger.types.child_result_id(review.id), [i.id for i in run.transcript if i.kind == "mailbox"])

    def test_turn_delegate(self) -> None:
        """A tool call delegated to a child settles with the child's result
        as its tool result, next to the call; the child's report does not
        join the transcript again. One that times out settles as timeout."""
        settled: list[ToolCall] = []

        def handler(run: Run) -> str:
            def turn(t: Turn) -> None:
                settled.append(t.delegate(ToolCall(name="review"), ScheduleRequest(queue=self.queue + "-review")))
                settled.append(t.delegate(ToolCall(id="stuck", name="ask"), ScheduleRequest(queue=unique("nobody")),
                                          timeout=0.3))

            run.turn(turn)
            run.check()
            run.turn(lambda t: None)  # a later boundary: the report stays out
            return "delegated"

        self.start(handler)
        self.start(lambda run: "looks good", queue=self.queue + "-review", executor_id="py-reviewer")
        t = self.ended(self.schedule(message=Message(content=[taskledger.ContentPart("text", "delegate")])).id)
        self.assertEqual(t.status, "succeeded")
        review, stuck = settled
        self.assertEqual((review.id, review.status), ("t1.c1", "ok"))
        self.assertEqual((review.output["status"], review.output["result"]["summary"]), ("succeeded", "looks good"))
        self.assertEqual(stuck.status, "timeout")
        run = self.api.get_run(t.id).run
        ids = [i.id for i in run.transcript]
        self.assertEqual(ids[-6:], ["t1.c1", "t1.c1.result", "stuck", "stuck.result", "t1.end", "t2.end"])
        self.assertNotIn(taskledger.types.child_result_id(review.output["taskId"]), ids)

    def test_parallel_dispatch(self) -> None:
        """Tools of one Turn dispatched from several threads: each is saved
        pending and settled, and the Turn ends once all have settled."""
        release = threading.Barrier(3, timeout=30)

        def tool(n: int) -> Callable[[], Any]:
            def do() -> Any:
                release.wait()  # all three are in flight at once
                return n

            return do

        def handler(run: Run) -> str:
            def turn(t: Turn) -> None:
                out: dict[int, Any] = {}

                def call(n: int) -> None:
                    out[n] = t.dispatch(ToolCall(id=f"tool-{n}", name="tool"), tool(n))
                    self.api.close_thread()

                threads = [threading.Thread(target=call, args=(n,)) for n in range(3)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                self.assertEqual(sorted((c.id, c.status, c.output) for c in out.values()),
                                 [("tool-0", "ok", 0), ("tool-1", "ok", 1), ("tool-2", "ok", 2)])

            run.turn(turn)
            return "parallel"

        self.start(handler)
        t = self.ended(self.schedule().id)
        self.assertEqual((t.status, t.result.error if t.result else ""), ("succeeded", ""))
        run = self.api.get_run(t.id).run
        self.assertEqual(run.pending_tools, [])
        self.assertEqual(sorted(i.id for i in run.transcript),
                         sorted(["tool-0", "tool-1", "tool-2", "tool-0.result", "tool-1.result", "tool-2.result", "t1.end"]))

    def test_mailbox_joins_at_turn_boundaries(self) -> None:
        seen: queuelib.Queue[Any] = queuelib.Queue()

        def handler(run: Run) -> str:
            def turn(t: Turn) -> None:
                self.api.append_mail(run.task.id, Message(id="m1", content=[taskledger.ContentPart("text", "also")]))
                run.check()
                seen.put([i.id for i in run.transcript()])  # not in the middle of a Turn

            run.turn(turn)
            seen.put([(i.id, i.turn) for i in run.transcript() if i.kind == "mailbox"])
            self.api.append_mail(run.task.id, Message(id="m1", content=[taskledger.ContentPart("text", "again")]))
            self.api.append_mail(run.task.id, Message(id="m2", content=[taskledger.ContentPart("text", "more")]))
            run.check()
            run.check()
            seen.put([(i.id, i.turn) for i in run.transcript() if i.kind == "mailbox"])
            return ",".join(m.content[0].text for m in run.messages())

        self.start(handler)
        t = self.ended(self.schedule().id)
        self.assertEqual(seen.get(timeout=5), [])
        self.assertEqual(seen.get(timeout=5), [("m1", 1)])  # joined at the Turn's end
        self.assertEqual(seen.get(timeout=5), [("m1", 1), ("m2", 1)])  # once each, by id
        self.assertEqual(t.result.summary if t.result else "", "also,more")

    def test_follow_ups_keep_tool_pairs(self) -> None:
        """An LLM-shaped Turn cut off while its second tool call was in
        flight: a follow-up its holder consumed before the crash (m0) and
        one a monitor's token-less checks only peeked at (m1) reach the
        resumed run, and join the transcript only once Turn 1, run again,
        has every tool result, so each tool call stays next to its result."""
        self.schedule()
        t = self.api.claim_next("py-pairs", self.queue, wait_seconds=10)
        assert t is not None and t.claim is not None
        read = ToolCall(id="read_log", name="read_log", turn=1, status="pending")
        done_read = ToolCall(id="read_log", name="read_log", turn=1, status="ok", output="ok")
        tests = ToolCall(id="run_tests", name="run_tests", turn=1, status="pending", idempotent=True)
        saved = RunState(executor_id="py-pairs", turn=1, pending_tools=[tests], transcript=[
            TranscriptItem(id="t1.i1", kind=ITEM_MODEL_INPUT, turn=1, content=[taskledger.ContentPart("text", "user: fix it")]),
            TranscriptItem(id="t1.i2", kind=ITEM_MODEL_OUTPUT, turn=1,
                           content=[taskledger.ContentPart("text", "assistant: tool_use read_log, tool_use run_tests")]),
            TranscriptItem(id="read_log", kind="tool_call", turn=1, tool=read),
            TranscriptItem(id="read_log.result", kind="tool_result", turn=1, tool=done_read),
            TranscriptItem(id="run_tests", kind="tool_call", turn=1, tool=tests)])
        self.api.save_run(t.id, t.claim.delivery_id, 0, saved)
        self.api.append_mail(t.id, Message(id="m0", content=[taskledger.ContentPart("text", "also the retry path")]))
        self.assertEqual(self.api.check(t.id, t.claim.delivery_id).cursor, 1)  # the holder took m0, then died
        self.api.append_mail(t.id, Message(id="m1", content=[taskledger.ContentPart("text", "keep the old API")]))
        for _ in range(2):  # a monitor's checks peek: m1 stays for the holder
            chk = self.api.check(t.id)
            self.assertEqual(([m.id for m in chk.messages], chk.cursor), (["m1"], 1))

        def handler(run: Run) -> str:
            def turn1(turn: Turn) -> None:
                turn.record(ITEM_MODEL_INPUT, "user: fix it")
                turn.record(ITEM_MODEL_OUTPUT, "assistant: tool_use read_log, tool_use run_tests")
                turn.dispatch(ToolCall(id="read_log", name="read_log"), lambda: "ok")
                turn.dispatch(ToolCall(id="run_tests", name="run_tests", idempotent=True), lambda: "passed")

            run.turn(turn1)
            run.turn(lambda turn: turn.record(ITEM_MODEL_OUTPUT, "assistant: done"))
            return "resumed"

        self.start(handler, executor_id="py-pairs")
        done = self.ended(t.id)
        self.assertEqual((done.status, done.mailbox.cursor), ("succeeded", 2))
        transcript = self.api.get_run(t.id).run.transcript
        self.assertEqual([i.id for i in transcript],
                         ["t1.i1", "t1.i2", "read_log", "read_log.result", "run_tests", "run_tests.result", "t1.end",
                          "m0", "m1", "t2.i1", "t2.end"])
        open_calls: list[str] = []
        for i in transcript:  # the pairing an LLM API requires
            if i.kind == "tool_call":
                open_calls.append(i.id)
            elif i.kind == "tool_result":
                open_calls.remove(i.id.removesuffix(".result"))
            else:
                self.assertEqual(open_calls, [], f"{i.kind} {i.id} between tool calls and their results")
        self.assertEqual(open_calls, [])

    def test_check_failed_surfaced(self) -> None:
        """A stop check the scheduler answers check_failed keeps the run
        going, and says so: a typed outcome (run.last_check), a log line
        and a counter (worker.check_failures)."""
        left = [3]

        class FailingChecks(taskledger.Client):
            def check(self, task_id: str, delivery_id: str = "") -> taskledger.types.Check:
                if left[0] > 0:
                    left[0] -= 1
                    return taskledger.types.Check(should_stop=False, reason="check_failed")
                return super().check(task_id, delivery_id)

        api = FailingChecks(srv.url, ACME, 30)
        self.addCleanup(api.close)
        outcomes: list[Any] = []

        def handler(run: Run) -> str:
            for _ in range(4):
                run.check()
                outcomes.append(run.last_check)
            return "kept working"

        w = Worker(api, handler, queue=self.queue, executor_id="py-cf", check_interval=600, poll_wait=1)
        th = threading.Thread(target=w.run, daemon=True)
        th.start()
        self.addCleanup(lambda: (w.stop(), th.join(30)))
        with self.assertLogs("taskledger", "WARNING") as logs:
            t = self.ended(self.schedule().id)
        self.assertEqual((t.status, t.result.summary if t.result else ""), ("succeeded", "kept working"))
        self.assertEqual([(o.reason, o.failed) for o in outcomes],
                         [("check_failed", True)] * 3 + [("active", False)])
        self.assertTrue(all(o.at for o in outcomes))
        self.assertEqual(w.check_failures, 3)
        self.assertEqual(sum("stop check" in line and "check_failed" in line for line in logs.output), 3)

    def test_stop_when_canceled(self) -> None:
        in_turn, outcome = threading.Event(), queuelib.Queue[Any]()

        def handler(run: Run) -> str:
            run.turn(lambda t: None)
            in_turn.set()
            run.wait(30)  # until the background check sees the cancel
            try:
                run.turn(lambda t: None)
            except Stopped as e:
                outcome.put(e.reason)
                raise
            outcome.put("not stopped")
            return "done"

        self.start(handler)
        task = self.schedule()
        self.assertTrue(in_turn.wait(30))
        self.api.cancel(task.id, "changed my mind")
        self.assertEqual(outcome.get(timeout=30), "terminal")
        t = self.api.get(task.id)
        self.assertEqual((t.status, t.result), ("canceled", None))
        self.assertEqual(self.api.get_run(task.id).run.turn, 1)  # the second Turn never began

    def test_child_stopped_when_ancestor_ends(self) -> None:
        running = threading.Event()

        def handler(run: Run) -> str:
            running.set()
            run.wait(30)
            run.check()
            return "not reached"

        self.start(handler)
        parent = self.schedule(queue=self.queue + "-parent")
        child = self.schedule(parent_id=parent.id)
        self.assertTrue(running.wait(30))
        self.api.cancel(parent.id)
        t = self.ended(child.id)
        self.assertEqual((t.status, t.reason), ("canceled", "an ancestor task is terminal"))

    def test_superseded_run_stops(self) -> None:
        outcome: queuelib.Queue[Any] = queuelib.Queue()

        def handler(run: Run) -> str:
            run.set_phase("working")
            op = srv.client()  # an operator ends it (a token-less result is an operator's)
            try:
                op.record_result(run.task.id, success=False, summary="ended elsewhere")
            finally:
                op.close()
            try:
                run.set_phase("still working")
            except Stopped as e:
                outcome.put((e.reason, run.stop_reason))
                raise
            return "not reached"

        self.start(handler, check_interval=600)  # no background check sees the end first
        task = self.schedule()
        self.assertEqual(outcome.get(timeout=30), ("superseded", "superseded"))
        t = self.api.get(task.id)
        self.assertEqual(t.result.summary if t.result else "", "ended elsewhere")  # no second result
        self.assertEqual(self.api.get_run(task.id).run.phase, "working")  # the refused save changed nothing

    def test_handler_failure_fails_the_task(self) -> None:
        def handler(run: Run) -> str:
            raise RuntimeError("model unavailable")

        self.start(handler)
        t = self.ended(self.schedule().id)
        self.assertEqual((t.status, t.result.error if t.result else ""), ("failed", "model unavailable"))

    def test_retry_continues_run(self) -> None:
        """A task with two attempts fails its first after a step; the second
        starts from the first's Run (the step is not run again) and succeeds."""
        ran: list[str] = []

        def handler(run: Run) -> str:
            run.step("prepare", lambda: ran.append("prepare"))
            ran.append(f"attempt {run.task.attempt}")
            if run.task.attempt == 1:
                raise RuntimeError("flaky")
            return "done"

        self.start(handler)
        t = self.ended(self.schedule(retry=taskledger.RetryRequest(max_attempts=2, backoff_seconds=0)).id)
        self.assertEqual((t.status, t.attempt), ("succeeded", 2))
        self.assertEqual([(a.outcome, a.error) for a in t.attempts], [("failed", "flaky"), ("succeeded", "")])
        self.assertEqual(ran, ["prepare", "attempt 1", "attempt 2"])

    def test_resume_saved_run(self) -> None:
        """A worker resumes a Run an earlier process of its executor id left
        cut off: a completed Turn is skipped, pending tools are looked up,
        repeated only when idempotent, or settled uncertain, and effects
        with an intent but no outcome are looked up or settled uncertain."""
        self.schedule()
        t = self.api.claim_next("py-resume", self.queue, wait_seconds=10)
        assert t is not None and t.claim is not None

        def pending(call_id: str, idempotent: bool = False) -> ToolCall:
            return ToolCall(id=call_id, name="tool", turn=2, status="pending", idempotent=idempotent)

        calls = [pending("t2.c1"), pending("t2.c2", idempotent=True), pending("t2.c3")]
        saved = RunState(executor_id="py-resume", turn=2, pending_tools=calls,
                         transcript=[TranscriptItem(id="t1.end", kind="note", turn=1),
                                     TranscriptItem(id="t2.i1", kind=ITEM_MODEL_OUTPUT, turn=2,
                                                    content=[taskledger.ContentPart("text", "call three tools")])]
                         + [TranscriptItem(id=c.id, kind="tool_call", turn=2, tool=c) for c in calls],
                         effects={"pr": EffectRecord(), "comment": EffectRecord()})
        self.api.save_run(t.id, t.claim.delivery_id, 0, saved)
        ran: list[str] = []
        got: dict[str, Any] = {}

        def called(name: str, answer: Any = None) -> Callable[[], Any]:
            def do() -> Any:
                ran.append(name)
                return answer

            return do

        def handler(run: Run) -> str:
            run.turn(lambda turn: ran.append("turn 1"))  # its end is saved: skipped

            def turn2(turn: Turn) -> None:
                got["model"] = turn.record(ITEM_MODEL_OUTPUT, "a different answer").content[0].text
                got["c1"] = turn.dispatch(ToolCall(name="tool"), called("c1"), lambda: ({"found": 1}, True))
                got["c2"] = turn.dispatch(ToolCall(name="tool", idempotent=True), called("c2", "again"))
                got["c3"] = turn.dispatch(ToolCall(name="tool"), called("c3"))

            run.turn(turn2)
            got["pr"] = run.effect("pr", called("pr", Effect(kind="pull_request", ref="#1")),
                                   lambda: Effect(kind="pull_request", ref="#9"))
            got["comment"] = run.effect("comment", called("comment", Effect(kind="comment")))
            return "resumed"

        self.start(handler, executor_id="py-resume")
        done = self.ended(t.id)
        self.assertEqual((done.status, ran), ("succeeded", ["c2"]))
        self.assertEqual(got["model"], "call three tools")  # the saved answer, not a new one
        self.assertEqual([(got[c].status, got[c].output) for c in ("c1", "c2", "c3")],
                         [("ok", {"found": 1}), ("ok", "again"), ("uncertain", None)])
        self.assertEqual((got["pr"].ref, got["comment"]), ("#9", Effect(kind="unknown", ref="comment", uncertain=True)))
        self.assertEqual({(e.kind, e.ref, e.uncertain) for e in done.effects},
                         {("pull_request", "#9", False), ("unknown", "comment", True)})
        run = self.api.get_run(t.id).run
        self.assertEqual((run.turn, run.pending_tools), (2, []))
        self.assertEqual([i.id for i in run.transcript][-4:], ["t2.c1.result", "t2.c2.result", "t2.c3.result", "t2.end"])
        self.assertEqual([e.type for e in self.api.history(t.id)].count("Claimed"), 1)  # resumed, not claimed again

    def test_progress_and_run_history(self) -> None:
        """run.progress() lines and each save reach a client following the
        run stream as they happen; every saved revision stays readable."""
        followed = threading.Event()
        got: queue_t = queuelib.Queue()

        def handler(run: Run) -> str:
            run.set_phase("thinking")
            self.assertTrue(followed.wait(30), "the follower never saw the first save")
            for text in ("tok", "en", "s"):
                run.progress(text)
            with self.assertRaises(taskledger.PayloadTooLarge):
                run.progress("x" * (taskledger.types.MAX_PROGRESS_BYTES + 1))
            run.set_phase("answering")
            return "done"

        self.start(handler)
        t = self.schedule()

        def follow() -> None:
            for event, data in self.api.stream_run(t.id):
                got.put((event, data))
                if event == "saved":
                    followed.set()

        th = threading.Thread(target=follow, daemon=True)
        th.start()
        seen: list[str] = []
        while not seen or seen[-1] != "end":
            event, data = got.get(timeout=30)
            if event == "saved":
                seen.append(f"saved {data['revision']} {data.get('set', {}).get('phase', '')}")
            elif event == "progress":
                seen.append(data["text"])
            else:
                seen.append(event)
        th.join(30)
        self.assertEqual([s.split(" ")[-1] if s.startswith("saved") else s for s in seen],
                         ["thinking", "tok", "en", "s", "answering", "end"])
        latest = self.api.get_run(t.id)
        self.assertEqual(latest.revision, 2)
        first = self.api.get_run(t.id, revision=1)
        self.assertEqual((first.revision, first.run.phase, latest.run.phase), (1, "thinking", "answering"))
        self.assertEqual(len(first.digest), 64)
        with self.assertRaises(taskledger.NotFound):
            self.api.get_run(t.id, revision=3)
        with self.assertRaises(taskledger.Terminal):
            self.api.progress(t.id, "01STALEDELIVERY", "late")


queue_t = queuelib.Queue

if __name__ == "__main__":
    unittest.main()
