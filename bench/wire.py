"""The Redis wire on a real Redis: this checkout alone, or against another revision, side by side.

bench/python_per_call.py measures effectq's Python with canned replies; this one sends the
scripts to a real Redis, so what the wire costs (writing, reading replies, checks on the
connection) is in the figures too. Only the public API is used (``effectq.effect``,
``effectq.run``, ``effectq.RedisStore``), so any revision can be measured:

* first time, the next call reads the reply: effects one after another in one run, each
  completion written pipelined, its reply read by the next claim (one round trip waited for);
* first time, alone in its run: ``with effectq.run(id): f(x)``, the run's end reads the reply;
* replay: the claim finds the record completed (the run's prefetch off);

each from sync code and from async code (``async with effectq.run``).

    python bench/wire.py                                  # this checkout: p50 µs per call
    python bench/wire.py --against c7fe8d0                # and another revision, side by side
    python bench/wire.py --against c7fe8d0 --instructions # counted by callgrind (client only)

With ``--against REV`` the revision is checked out in a temporary git worktree (or REV is a
checkout already made) and both trees are measured in child processes taking turns
(A, B, A, B, ...), so a noisy neighbour slows both alike; the table gives the best p50 of
each and their ratio. ``--instructions`` counts the instructions of the Python process under
valgrind's callgrind (Redis runs outside it), in its main thread: each child runs the calls
twice as often once more, and the difference is what the calls cost. Keys live under a
namespace of their own per child and are deleted after it.
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
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:
    from python_per_call import checkout
except ImportError:  # imported as bench.wire
    from .python_per_call import checkout

NEXT, ALONE, REPLAY = "first time, the next call reads the reply", "first time, alone in its run", "replay"
CASES = tuple(f"{path}, {side}" for side in ("sync", "async") for path in (NEXT, ALONE, REPLAY))
WARM = 100
"""Calls of each case before any is measured: connections made, scripts loaded, caches filled."""


def _cases(url: str, namespace: str, prepared: int) -> dict[str, Callable[[int], list[float]]]:
    """Each case: run it ``n`` times, return each call's seconds. ``prepared``: records a replay
    finds, made before (so that a count of ``n`` and of ``2 n`` calls make the same)."""
    import redis

    import effectq

    store = effectq.RedisStore(redis.Redis.from_url(url), namespace=namespace)
    loop = asyncio.new_event_loop()

    @effectq.effect(name="bench.wire")
    def piece(i: int) -> int:
        return i

    @effectq.effect(name="bench.wire")
    async def apiece(i: int) -> int:
        return i

    fresh = itertools.count()
    replays = {"sync": itertools.count(), "async": itertools.count()}

    def in_run(run_id: str, indexes: Iterable[int]) -> list[float]:
        samples = []
        with effectq.run(run_id, store=store) as bound:
            bound.prefetch_tried = True  # a replay's own claim, not a run's prefetch
            for i in indexes:
                began = time.perf_counter()
                piece(i)
                samples.append(time.perf_counter() - began)
        return samples

    def alone(n: int) -> list[float]:
        samples = []
        for i in itertools.islice(fresh, n):
            began = time.perf_counter()
            with effectq.run(f"alone-{namespace}-{i}", store=store):
                piece(i)
            samples.append(time.perf_counter() - began)
        return samples

    async def ain_run(run_id: str, indexes: Iterable[int]) -> list[float]:
        samples = []
        async with effectq.run(run_id, store=store) as bound:
            bound.prefetch_tried = True
            for i in indexes:
                began = time.perf_counter()
                await apiece(i)
                samples.append(time.perf_counter() - began)
        return samples

    async def aalone(n: int) -> list[float]:
        samples = []
        for i in itertools.islice(fresh, n):
            began = time.perf_counter()
            async with effectq.run(f"aalone-{namespace}-{i}", store=store):
                await apiece(i)
            samples.append(time.perf_counter() - began)
        return samples

    def replayed(side: str, n: int) -> Iterator[int]:
        return (next(replays[side]) % prepared for _ in range(n))

    def on_loop(calls: Callable[[int], Any]) -> Callable[[int], list[float]]:
        return lambda n: loop.run_until_complete(calls(n))  # type: ignore[no-any-return]

    with effectq.run(f"replay-{namespace}", store=store):  # the records the replays find
        for i in range(prepared):
            piece(i)

    async def aprepare() -> None:
        async with effectq.run(f"areplay-{namespace}", store=store):
            for i in range(prepared):
                await apiece(i)

    loop.run_until_complete(aprepare())
    return {
        f"{NEXT}, sync": lambda n: in_run(f"next-{namespace}", itertools.islice(fresh, n)),
        f"{ALONE}, sync": alone,
        f"{REPLAY}, sync": lambda n: in_run(f"replay-{namespace}", replayed("sync", n)),
        f"{NEXT}, async": on_loop(lambda n: ain_run(f"anext-{namespace}", itertools.islice(fresh, n))),
        f"{ALONE}, async": on_loop(aalone),
        f"{REPLAY}, async": on_loop(lambda n: ain_run(f"areplay-{namespace}", replayed("async", n))),
    }


def _cleanup(url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"*{namespace}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


def child(
    url: str, cases: tuple[str, ...], number: int, repeat: int, calls_only: bool, prepared: int
) -> None:
    """In a child process: each case's p50 µs per call as JSON (or only run the calls)."""
    namespace = f"bench-wire-{uuid.uuid4().hex[:8]}"
    try:
        runs = _cases(url, namespace, max(prepared, WARM))
        out: dict[str, float] = {}
        for name in cases:
            runs[name](WARM)
            if calls_only:
                runs[name](number)
                continue
            samples = sorted(s for _ in range(repeat) for s in runs[name](number))
            out[name] = samples[len(samples) // 2] * 1e6
        print(json.dumps(out))
    finally:
        _cleanup(url, namespace)


def _spawn(tree: Path, args: list[str], wrap: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    cmd = [*wrap, sys.executable, str(Path(__file__).resolve()), "--child", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())


def timed(tree: Path, url: str, cases: tuple[str, ...], number: int, repeat: int) -> dict[str, float]:
    chosen = [arg for case in cases for arg in ("--case", case)]
    done = _spawn(tree, ["--redis-url", url, "-n", str(number), "--repeat", str(repeat), *chosen], [])
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def counted(tree: Path, url: str, number: int, case: str) -> int:
    """Instructions of ``case`` run ``number`` times more, counted by callgrind in the client's
    main thread, where the calls run (the heartbeat's thread wakes by the clock, which valgrind
    and a busy machine stretch)."""
    totals = []
    for n in (number, 2 * number):
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "callgrind"
            wrap = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}"]
            args = ["--redis-url", url, "-n", str(n), "--calls-only", "--case", case]
            args += ["--prepared", str(2 * number)]
            _spawn(tree, args, wrap)
            found = re.search(r"^totals: (\d+)", Path(f"{out}-01").read_text(), re.MULTILINE)
            assert found is not None, f"no totals in {out}-01"
            totals.append(int(found.group(1)))
    return totals[1] - totals[0]


def compare(
    trees: dict[str, Path],
    url: str,
    cases: tuple[str, ...],
    rounds: int,
    number: int,
    repeat: int,
    instructions: bool,
    jobs: int,
) -> str:
    """The table: each case's best figure in each tree, and each tree's ratio to the first."""
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    for _ in range(1 if instructions else rounds):
        for name, tree in trees.items():
            if instructions:  # the counts do not depend on the load: children run side by side
                with ThreadPoolExecutor(jobs) as pool:
                    per_call = lambda case, tree=tree: counted(tree, url, number, case) / number  # noqa: E731
                    found = dict(zip(cases, pool.map(per_call, cases), strict=True))
            else:
                found = timed(tree, url, cases, number, repeat)
            for case, value in found.items():
                best[name][case] = min(value, best[name].get(case, value))
    names = list(trees)
    unit = "instructions per call, client" if instructions else "p50 µs"
    ratios = [f"{name} / {names[0]}" for name in names[1:]]
    lines = [
        f"| real Redis ({unit}) | " + " | ".join([*names, *ratios]) + " |",
        "|---" * (1 + len(names) + len(ratios)) + "|",
    ]
    for case in cases:
        values = [best[name][case] for name in names]
        shown = [f"{v:,.0f}" if instructions else f"{v:.1f}" for v in values]
        shown += [f"{v / values[0]:.3f}" for v in values[1:]]
        lines.append(f"| {case} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        action="append",
        help="also measure this revision or checkout (repeatable)",
    )
    parser.add_argument("--without-this", action="store_true", help="measure only the --against trees")
    parser.add_argument("--jobs", type=int, default=2, help="callgrind children run side by side")
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind")
    parser.add_argument("--redis-url", help="a Redis to measure against (default: a redis-server of its own)")
    parser.add_argument("--case", action="append", choices=CASES, help="only this case (repeatable)")
    parser.add_argument("-n", type=int, default=0, help="calls per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per child (samples pooled)")
    parser.add_argument("--rounds", type=int, default=5, help="children per tree, taking turns")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prepared", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = tuple(args.case or CASES)
    if args.child:
        child(args.redis_url, cases, args.n, args.repeat, args.calls_only, args.prepared or args.n)
        return
    try:
        from common import pinned, redis_server
    except ImportError:  # imported as bench.wire
        from .common import pinned, redis_server
    number = args.n or (300 if args.instructions else 2000)
    with contextlib.ExitStack() as stack:
        trees: dict[str, Path] = {}
        for rev in args.against or ():
            made = Path(rev) if Path(rev).is_dir() else stack.enter_context(checkout(rev))
            trees[rev] = made.resolve()
        if not args.without_this:
            trees["this checkout"] = Path(__file__).resolve().parent.parent
        url = stack.enter_context(redis_server(args.redis_url))
        stack.enter_context(pinned())  # the children inherit the pinning
        print(compare(trees, url, cases, args.rounds, number, args.repeat, args.instructions, args.jobs))


if __name__ == "__main__":
    main()
