"""Latency of one async effect, in one event loop: first time and replay, against the floor.

The floor is redis-py's asyncio client doing what no layer can beat on it: two
round trips (``SET NX``, then ``SET``) for a first-time effect, one (``GET``)
for a replay. Beside effectq as it runs (scripts sent from the loop on the
store's async lane), the same store with that lane off: each script goes to a
worker thread (``asyncio.to_thread``), as every async effect's did before. All
run interleaved in one loop, the function itself a no-op.

"effectq" is an effect alone in its run: it waits for its completion's reply,
as the floor waits for its second ``SET``. "effectq, the next call reads the
reply" runs effects one after another in a run entered with ``async with`` by
their task: each completion is written as its effect returns, and its reply read
by the next claim, written behind it on the same connection.

    python bench/async_latency.py [-n 3000] [--redis-url URL]
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio

import effectq

try:
    from common import Series, main_sized, paths_table
except ImportError:  # imported as bench.async_latency
    from .common import Series, main_sized, paths_table

THREAD = "effectq, a thread hop per script"
"""The async lane off: claim and completion each in a worker thread."""

POSTED = "effectq, the next call reads the reply"
"""Effects one after another in a run their task entered: completions posted."""


def measure(url: str, n: int) -> dict[str, Any]:
    return asyncio.run(_measure(url, n))


async def _measure(url: str, n: int, rounds: int = 10) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(url)
    aclient = redis.asyncio.Redis.from_url(url)
    store = effectq.RedisStore(client, namespace=f"bench-{tag}")
    hopping = effectq.RedisStore(client, namespace=f"bench-{tag}")
    if hasattr(hopping, "_on_loop"):
        hopping._on_loop = None  # every script through asyncio.to_thread
    else:  # a revision before the async store (bench/versus.py): its coroutine twins, off
        hopping._twins = None

    @effectq.effect(name="bench.async_noop")
    async def noop(i: int) -> int:
        return i

    @effectq.effect(name="bench.async_noop_thread")
    async def noop_thread(i: int) -> int:
        return i

    @effectq.effect(name="bench.async_noop_posted")
    async def noop_posted(i: int) -> int:
        return i

    async def floor_first(i: int) -> None:
        await aclient.set(f"afloor:{tag}:{i}", b"1", nx=True)
        await aclient.set(f"afloor:{tag}:{i}", b"result")

    async def floor_replay(i: int) -> None:
        await aclient.get(f"afloor:{tag}:{i}")

    first: dict[str, Callable[[int], Awaitable[Any]]] = {
        "floor (SET NX + SET)": floor_first,
        "effectq": noop,
        POSTED: noop_posted,
        THREAD: noop_thread,
    }
    replay: dict[str, Callable[[int], Awaitable[Any]]] = {
        "floor (GET)": floor_replay,
        "effectq": noop,
        THREAD: noop_thread,
    }
    stores = {"effectq": store, POSTED: store, THREAD: hopping}
    try:
        with effectq.run(f"bench-{tag}", store=store):
            await noop(-1)  # load the scripts, open a connection
        await aclient.ping()
        first_series = await _interleave(first, n, rounds, stores, f"bench-{tag}")
        replay_series = await _interleave(replay, n, rounds, stores, f"bench-{tag}")
    finally:
        await aclient.aclose()
        store.close()
        hopping.close()
        client.close()
    return {
        "first": first_series,
        "replay": replay_series,
        "n": n,
        "cleanup": [f"afloor:{tag}:*", f"effectq:{{bench-{tag}*"],
    }


async def _interleave(
    systems: dict[str, Callable[[int], Awaitable[Any]]],
    n: int,
    rounds: int,
    stores: dict[str, effectq.RedisStore],
    run_id: str,
) -> dict[str, Series]:
    """Time ``n`` awaited calls of each system, in ``rounds`` interleaved batches."""
    series = {name: Series(name) for name in systems}
    per_round = max(1, n // rounds)
    for start in range(0, n, per_round):
        for name, call in systems.items():
            samples = series[name].samples
            store = stores.get(name)
            if name == POSTED:  # entered by this task: its effects' completions are posted
                async with effectq.run(run_id, store=store) as run:
                    run.prefetch_tried = True
                    await _timed(call, range(start, min(n, start + per_round)), samples)
                continue
            with effectq.run(run_id, store=store) if store is not None else _nothing() as run:
                if run is not None:
                    run.prefetch_tried = True
                await _timed(call, range(start, min(n, start + per_round)), samples)
    return series


async def _timed(call: Callable[[int], Awaitable[Any]], numbers: range, samples: list[float]) -> None:
    for i in numbers:
        began = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - began)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def report(result: dict[str, Any]) -> str:
    first, replay = result["first"], result["replay"]
    return "\n".join(
        [
            f"### Latency of one async effect, in one event loop (n = {result['n']} each, interleaved; µs)",
            "",
            paths_table(first, replay),
            "",
            "The floor is redis-py's asyncio client. effectq sends its scripts from the loop; an"
            " effect alone waits for both replies, and effects one after another in a run their"
            f' task entered with `async with` wait for one each ("{POSTED}"). The "{THREAD}" row is'
            " the same store sending each script from a worker thread.",
        ]
    )


def main() -> None:
    main_sized(__doc__, measure, report, default_n=3000)


if __name__ == "__main__":
    main()
