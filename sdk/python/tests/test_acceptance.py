"""Issue 14's acceptance flow with real processes: a Python agent claims a
task, runs two Turns with a tool each, reports an effect mid-run, is
killed with SIGKILL, restarts with the same executor id, resumes at the
right Turn without repeating what settled, and completes."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import unittest

from tests.harness import ACME, Server, eventually, unique

import taskledger

srv: Server
AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")


def setUpModule() -> None:
    global srv
    srv = Server()


def tearDownModule() -> None:
    srv.stop()


class AcceptanceTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = srv.client(ACME)
        self.addCleanup(self.api.close)
        self.fresh()

    def fresh(self) -> None:
        """A new queue, executor id and call log."""
        self.queue = unique("q")
        self.executor = unique("py-agent")
        fd, self.call_log = tempfile.mkstemp(prefix="calls-")
        os.close(fd)
        self.addCleanup(os.remove, self.call_log)

    def agent(self, kill_at: str = "") -> subprocess.Popen[str]:
        args = [sys.executable, AGENT, srv.url, ACME, self.queue, self.executor, self.call_log]
        p = subprocess.Popen(args + ([kill_at] if kill_at else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)

        def end() -> None:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout):
                if f:
                    f.close()

        self.addCleanup(end)
        return p

    def kill_at(self, point: str) -> None:
        """Runs the agent until it reaches point, then SIGKILLs it."""
        p = self.agent(point)
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            assert p.stdout is not None
            for line in p.stdout:
                lines.put(line.strip())
            lines.put(None)  # the agent exited

        threading.Thread(target=read, daemon=True).start()
        reached: list[str] = []
        while not reached or reached[-1] != point:
            try:
                line = lines.get(timeout=60)
            except queue.Empty:
                self.fail(f"the agent did not reach {point} within 60s (it reached {reached})")
            if line is None:
                self.fail(f"the agent exited {p.wait()} before {point} (it reached {reached})")
            reached.append(line)
        p.kill()
        self.assertEqual(p.wait(), -9)

    def calls(self) -> list[str]:
        with open(self.call_log) as f:
            return f.read().splitlines()

    def finish(self, task_id: str) -> taskledger.Task:
        """Restarts the agent and waits until the task ended."""
        self.agent()
        return eventually(lambda: (lambda t: t if t.terminal else None)(self.api.get(task_id)), 60,
                          f"task {task_id} ends")

    def test_killed_after_effect_resumes_at_turn_two(self) -> None:
        task, _ = self.api.schedule(queue=self.queue)
        self.kill_at("after-effect")
        # Killed: Turn 1 settled and saved, the effect reported, Turn 2 not begun.
        self.assertEqual(self.calls(), ["search 1", "comment"])
        mid = self.api.get(task.id)
        self.assertEqual((mid.status, [(e.kind, e.ref) for e in mid.effects]), ("running", [("comment", "c-1")]))
        self.assertEqual(self.api.get_run(task.id).run.turn, 1)

        done = self.finish(task.id)
        self.assertEqual(self.calls(), ["search 1", "comment", "search 2"])  # nothing repeated
        assert done.result is not None
        self.assertEqual((done.status, done.result.summary), ("succeeded", "two turns done"))
        self.assertEqual([(e.kind, e.ref) for e in done.result.effects], [("comment", "c-1")])
        self.assertEqual([(e.kind, e.ref, e.url) for e in done.effects], [("comment", "c-1", "https://example.test/c-1")])

        types = [e.type for e in self.api.history(task.id)]
        self.assertEqual(types.count("Claimed"), 1)  # the restarted agent resumed its claim
        self.assertEqual(types.count("EffectsReported"), 1)
        self.assertLess(types.index("EffectsReported"), types.index("ResultRecorded"))
        self.assertEqual(types[-1], "ResultRecorded")

        doc = self.api.get_run(task.id)
        run = doc.run
        self.assertEqual((run.executor_id, run.turn, run.pending_tools), (self.executor, 2, []))
        self.assertEqual([i.id for i in run.transcript],
                         ["t1.i1", "t1.i2", "t1.c1", "t1.c1.result", "t1.end",
                          "t2.i1", "t2.i2", "t2.c1", "t2.c1.result", "t2.end"])
        results = [(i.tool.id, i.tool.status, i.tool.output) for i in run.transcript if i.kind == "tool_result" and i.tool]
        self.assertEqual(results, [("t1.c1", "ok", {"hits": 1}), ("t2.c1", "ok", {"hits": 2})])
        outcome = run.effects["comment"].outcome
        self.assertEqual((outcome.kind, outcome.ref) if outcome else None, ("comment", "c-1"))
        self.assertEqual(doc.delivery_id, done.claim.delivery_id if done.claim else None)

    def test_killed_mid_tool_records_it_uncertain(self) -> None:
        task, _ = self.api.schedule(queue=self.queue)
        self.kill_at("in-search-2")
        # Killed inside the second tool: dispatched (saved pending), not settled.
        self.assertEqual(self.calls(), ["search 1", "comment", "search 2"])
        run = self.api.get_run(task.id).run
        self.assertEqual(([c.id for c in run.pending_tools], run.pending_tools[0].status), (["t2.c1"], "pending"))

        done = self.finish(task.id)
        self.assertEqual(self.calls(), ["search 1", "comment", "search 2"])  # the cut-off tool is not repeated
        self.assertEqual(done.status, "succeeded")
        run = self.api.get_run(task.id).run
        self.assertEqual(run.pending_tools, [])
        settled = {i.tool.id: (i.tool.status, i.tool.error) for i in run.transcript if i.kind == "tool_result" and i.tool}
        self.assertEqual(settled, {"t1.c1": ("ok", ""), "t2.c1": ("uncertain", "cut off by a crash; not repeated")})
        self.assertEqual([i.id for i in run.transcript][-2:], ["t2.c1.result", "t2.end"])
        self.assertEqual([e.type for e in self.api.history(task.id)].count("EffectsReported"), 1)  # the effect was not redone

    def test_other_kill_points(self) -> None:
        """Killed right after the claim (no Run saved yet), between Turn 1's
        end and the next check, or inside the effect (its intent saved, no
        outcome): the restarted agent resumes under the same claim and
        repeats nothing it saved; the cut-off effect settles uncertain."""
        cases = {
            "claimed": [("comment", "c-1", False)],
            "turn-1-ended": [("comment", "c-1", False)],
            "in-comment": [("unknown", "comment", True)],
        }
        for point, effects in cases.items():
            with self.subTest(point=point):
                self.fresh()
                task, _ = self.api.schedule(queue=self.queue)
                self.kill_at(point)
                done = self.finish(task.id)
                self.assertEqual(done.status, "succeeded")
                self.assertEqual(self.calls(), ["search 1", "comment", "search 2"])
                self.assertEqual([(e.kind, e.ref, e.uncertain) for e in done.effects], effects)
                self.assertEqual([e.type for e in self.api.history(task.id)].count("Claimed"), 1)
                run = self.api.get_run(task.id).run
                self.assertEqual((run.turn, run.pending_tools, [i.id for i in run.transcript][-1]), (2, [], "t2.end"))


if __name__ == "__main__":
    unittest.main()
