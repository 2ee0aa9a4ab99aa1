"""The Python of one effect call, no I/O: this checkout alone, or against another revision.

The store's replies are canned (its sync and async lanes hand out fixed replies and send
nothing), so what is measured is effectq's own Python per call: a replay (a claim that
finds the record completed) and a first time (a claim granted, the function, its
completion pipelined), each from sync and from async code.

    python bench/python_per_call.py                      # this checkout: µs per call
    python bench/python_per_call.py --against c7fe8d0    # and another revision, side by side
    python bench/python_per_call.py --against c7fe8d0 --instructions   # counted by callgrind
    python bench/python_per_call.py --only celery        # the cases whose name says "celery"

With ``--against REV`` the revision is checked out in a temporary git worktree and both
trees are measured in child processes taking turns (A, B, A, B, ...), so a noisy
neighbour slows both alike; the table gives the best figure of each and their ratio.
``--instructions`` counts instructions under valgrind's callgrind instead of timing
(slow, but the same on a busy machine): each child runs the calls twice as often once
more, and the difference is what the calls cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CASES = (
    "replay, sync",
    "first time, sync",
    "replay, async",
    "first time, async",
    "one-effect run, first time, sync",
    "one-effect run, replay, sync",
    "one-effect run, first time, async",
    "one-effect run, replay, async",
    "celery task, no layer",
    "celery task, effectq installed, no effect",
    "celery task, one effect, run bound in the body",
    "celery task, one effect, effectq installed",
)
"""The first four: effects one after another in one run. The "one-effect run" cases: what a task
with one effect pays, a run of its own per call (entered, the one effect, exited), its key never
seen before (a new run id each call), first time or replayed (a redelivery to a fresh worker).
The "celery task" cases: a task through Celery's own tracer, as a worker runs it (the request a
worker builds, no result stored): doing nothing, without and with effectq installed (the
difference is what the integration adds to every task), and one first-time effect, its run
bound by a ``with effectq.run(task id)`` in the task's body or by the installation."""

_REPLAY = b"c1\n1\n1\n\n1\nbench.piece\npieces\n:0123456789abcdef\n\n\n5"
_CLAIMED = [1, 1, 1, b"d", b""]


class Canned:
    """Stands for a store's lane: hands out fixed replies, sends nothing (bench/pieces.py uses it too)."""

    def __init__(self, replies: list[Any]) -> None:
        self._replies = itertools.cycle(replies)

    def evalsha(self, sha: str, source: Any, keys: Any, args: Any, *, retry: bool) -> Any:
        return next(self._replies)

    def send_pipelined(self, sha: str, source: Any, keys: Any, args: Any, on_reply: Any) -> bool:
        on_reply(next(self._replies))  # as the next call would, having read the reply
        return True

    post = send_pipelined  # the same, as older revisions name it

    def close(self) -> None:
        pass


class _AsyncCanned(Canned):
    async def evalsha(self, sha: str, source: Any, keys: Any, args: Any, *, retry: bool) -> Any:  # type: ignore[override]
        return next(self._replies)


def _calls() -> dict[str, Callable[[int], float]]:
    """Each case: run it ``n`` times, return the seconds it took."""
    import redis

    import effectq

    store = effectq.RedisStore(redis.Redis(), namespace="pieces")  # never connects: lanes canned

    @effectq.effect(name="bench.piece")
    def piece(i: int) -> int:
        return i

    @effectq.effect(name="bench.piece")
    async def apiece(i: int) -> int:
        return i

    counter = itertools.count()

    def sync_case(replies: list[Any]) -> Callable[[int], float]:
        def run(n: int) -> float:
            store._lane = Canned(replies)  # type: ignore[assignment]
            with effectq.run("pieces", store=store) as bound:
                bound.prefetch_tried = True  # every replay a claim
                started = time.perf_counter()
                for _ in range(n):
                    piece(next(counter))
                return time.perf_counter() - started

        return run

    def async_case(replies: list[Any]) -> Callable[[int], float]:
        async def calls(n: int) -> float:
            store._async_lane = _AsyncCanned(replies)  # type: ignore[assignment]
            async with effectq.run("pieces", store=store) as bound:
                bound.prefetch_tried = True
                started = time.perf_counter()
                for _ in range(n):
                    await apiece(next(counter))
                return time.perf_counter() - started

        def run(n: int) -> float:
            return asyncio.run(calls(n))

        return run

    def one_effect_sync(replies: list[Any]) -> Callable[[int], float]:
        def run(n: int) -> float:
            store._lane = Canned(replies)  # type: ignore[assignment]
            started = time.perf_counter()
            for _ in range(n):
                i = next(counter)
                with effectq.run(f"task-{i}", store=store):
                    piece(i)
            return time.perf_counter() - started

        return run

    def one_effect_async(replies: list[Any]) -> Callable[[int], float]:
        async def calls(n: int) -> float:
            store._async_lane = _AsyncCanned(replies)  # type: ignore[assignment]
            started = time.perf_counter()
            for _ in range(n):
                i = next(counter)
                async with effectq.run(f"task-{i}", store=store):
                    await apiece(i)
            return time.perf_counter() - started

        def run(n: int) -> float:
            return asyncio.run(calls(n))

        return run

    return {
        **_celery_calls(store, piece),
        "one-effect run, first time, sync": one_effect_sync([_CLAIMED, 1]),
        "one-effect run, replay, sync": one_effect_sync([_REPLAY]),
        "one-effect run, first time, async": one_effect_async([_CLAIMED, 1]),
        "one-effect run, replay, async": one_effect_async([_REPLAY]),
        "replay, sync": sync_case([_REPLAY]),
        "first time, sync": sync_case([_CLAIMED, 1]),
        "replay, async": async_case([_REPLAY]),
        "first time, async": async_case([_CLAIMED, 1]),
    }


def _celery_calls(store: Any, piece: Callable[[int], int]) -> dict[str, Callable[[int], float]]:
    """The "celery task" cases (see :data:`CASES`), each app installed only while it runs: the
    installation's receivers would otherwise see every other case's tasks too."""
    from celery import Celery
    from celery.app.trace import build_tracer

    import effectq
    import effectq.celery

    counter = itertools.count()

    def case(installed: bool, body: Callable[[Any, int], Any]) -> Callable[[int], float]:
        def run(n: int) -> float:
            store._lane = Canned([_CLAIMED, 1])
            app = Celery("bench", broker="memory://", set_as_current=False)
            app.task(name="bench.task", bind=True, ignore_result=True, shared=False)(body)
            app.finalize()
            task = app.tasks["bench.task"]  # the task itself, as a worker has it, not its proxy
            installation = effectq.celery.install(app, store) if installed else None
            trace = build_tracer(task.name, task, app=app, hostname="bench")
            try:
                started = time.perf_counter()
                for _ in range(n):
                    i = next(counter)
                    task_id = f"task-{i}"
                    request = {"id": task_id, "delivery_info": {"redelivered": False}, "hostname": "bench"}
                    trace(task_id, (i,), {}, request)
                return time.perf_counter() - started
            finally:
                if installation is not None:
                    installation.uninstall()

        return run

    def nothing(self: Any, i: int) -> int:
        return i

    def bound_in_the_body(self: Any, i: int) -> int:
        with effectq.run(self.request.id, store=store):
            return piece(i)

    def one_effect(self: Any, i: int) -> int:
        return piece(i)

    return {
        "celery task, no layer": case(False, nothing),
        "celery task, effectq installed, no effect": case(True, nothing),
        "celery task, one effect, run bound in the body": case(False, bound_in_the_body),
        "celery task, one effect, effectq installed": case(True, one_effect),
    }


def child(number: int, repeat: int, calls_only: bool) -> None:
    """In a child process: each case's best µs per call as JSON (or only run the calls)."""
    cases = _calls()
    out: dict[str, float] = {}
    for name in CASES:
        run = cases[name]
        run(200)  # warm: codecs built, caches filled
        if calls_only:
            run(number)
            continue
        out[name] = min(run(number) for _ in range(repeat)) / number * 1e6
    print(json.dumps(out))


def _spawn(tree: Path, args: list[str], wrap: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    cmd = [*wrap, sys.executable, str(Path(__file__).resolve()), "--child", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())


def timed(tree: Path, number: int, repeat: int) -> dict[str, float]:
    done = _spawn(tree, ["-n", str(number), "--repeat", str(repeat)], [])
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def counted(tree: Path, number: int, case: str) -> int:
    """Instructions of ``case`` run ``number`` times more, counted by callgrind."""
    totals = []
    for n in (number, 2 * number):
        with tempfile.NamedTemporaryFile(suffix=".callgrind") as out:
            wrap = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}"]
            done = _spawn(tree, ["-n", str(n), "--calls-only", "--case", case], wrap)
            found = re.search(r"Collected : (\d+)", done.stderr)
            assert found is not None, done.stderr[-2000:]
            totals.append(int(found.group(1)))
    return totals[1] - totals[0]


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """``rev`` in a temporary git worktree of this repository."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="effectq-against-") as scratch:
        tree = Path(scratch) / "tree"
        add = ["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), rev]
        subprocess.run(add, check=True, stdout=subprocess.DEVNULL)  # stdout: the report's alone
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False)


def compare(trees: dict[str, Path], rounds: int, number: int, repeat: int, instructions: bool) -> str:
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    for _ in range(1 if instructions else rounds):
        for name, tree in trees.items():
            if instructions:
                found = {case: counted(tree, number, case) / number for case in CASES}
            else:
                found = timed(tree, number, repeat)
            for case, value in found.items():
                best[name][case] = min(value, best[name].get(case, value))
    names = list(trees)
    unit = "instructions" if instructions else "µs"
    lines = [
        f"| Python per call, no I/O ({unit}) | " + " | ".join(names) + f" | {names[-1]} / {names[0]} |",
        "|---" * (len(names) + 2) + "|",
    ]
    for case in CASES:
        values = [best[name][case] for name in names]
        shown = " | ".join(f"{v:,.0f}" if instructions else f"{v:.1f}" for v in values)
        lines.append(f"| {case} | {shown} | {values[-1] / values[0]:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", metavar="REV", help="also measure this revision (or checkout)")
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind")
    parser.add_argument("-n", type=int, default=0, help="calls per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="measurements per child (best is kept)")
    parser.add_argument("--rounds", type=int, default=5, help="children per tree, taking turns")
    parser.add_argument("--only", metavar="TEXT", help="only the cases whose name contains TEXT")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global CASES
    if args.only:
        CASES = tuple(case for case in CASES if args.only in case)
    if args.child:
        if args.case:
            CASES = (args.case,)
        child(args.n, args.repeat, args.calls_only)
        return
    number = args.n or (500 if args.instructions else 5000)
    here = Path(__file__).resolve().parent.parent
    if args.against is None:
        print(compare({"this checkout": here}, args.rounds, number, args.repeat, args.instructions))
        return
    if Path(args.against).is_dir():  # a checkout already made
        trees = {args.against: Path(args.against).resolve(), "this checkout": here}
        print(compare(trees, args.rounds, number, args.repeat, args.instructions))
        return
    with checkout(args.against) as other:
        trees = {args.against: other, "this checkout": here}
        print(compare(trees, args.rounds, number, args.repeat, args.instructions))


if __name__ == "__main__":
    main()
