"""The acceptance flow's agent, run as a child process by test_acceptance:
two Turns with a tool each and an effect between them.

    python3 agent.py SERVER TOKEN QUEUE EXECUTOR_ID CALL_LOG [KILL_AT]

Every tool and effect call appends a line to CALL_LOG, so the test counts
them across processes. The agent prints each point it reaches; at KILL_AT
it stops there (reading stdin) until the test kills it with SIGKILL.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taskledger import Client, Effect, Run, ToolCall, Turn, Worker  # noqa: E402
from taskledger.types import ITEM_MODEL_INPUT, ITEM_MODEL_OUTPUT  # noqa: E402

server, token, queue, executor_id, call_log = sys.argv[1:6]
kill_at = sys.argv[6] if len(sys.argv) > 6 else ""


def reached(point: str) -> None:
    print(point, flush=True)
    if point == kill_at:
        sys.stdin.read()  # held here until SIGKILL


def search(n: int) -> dict[str, int]:
    with open(call_log, "a") as f:
        f.write(f"search {n}\n")
    reached(f"in-search-{n}")
    return {"hits": n}


def post_comment() -> Effect:
    with open(call_log, "a") as f:
        f.write("comment\n")
    reached("in-comment")
    return Effect(kind="comment", ref="c-1", url="https://example.test/c-1")


# The agent loop of docs/executors.md, with the test's kill points.
def agent(run: Run) -> str:
    reached("claimed")
    for n in (1, 2):
        def turn(t: Turn) -> None:  # one model iteration and its tool
            t.record(ITEM_MODEL_INPUT, f"turn {n}: what next?")
            answer = t.record(ITEM_MODEL_OUTPUT, f"search for {n}")  # a model call in a real agent
            t.dispatch(ToolCall(name="search", input={"q": answer.content[0].text}), lambda: search(n))
        run.turn(turn)
        reached(f"turn-{n}-ended")
        if n == 1:
            run.effect("comment", post_comment)
            reached("after-effect")
    return "two turns done"


Worker(Client(server, token), agent, queue=queue, executor_id=executor_id, concurrency=1,
       check_interval=0.2, poll_wait=1).run()
