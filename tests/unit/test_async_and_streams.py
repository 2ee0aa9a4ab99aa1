"""Async effects, generator effects, and run scopes across asyncio tasks and threads."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

import effectq


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def test_async_effect_applies_once(store: effectq.Store) -> None:
    """An async effect is awaited once per key; later awaits replay."""
    applied: list[int] = []

    @effectq.effect
    async def post(n: int) -> int:
        await asyncio.sleep(0.01)
        applied.append(n)
        return n * 10

    async def main() -> list[int]:
        async with effectq.run(run_id(), store=store):
            return [await post(1), await post(1), await post(2)]

    assert asyncio.run(main()) == [10, 10, 20]
    assert applied == [1, 2]


def test_parallel_identical_async_calls_share_one_execution(store: effectq.Store) -> None:
    """Five identical calls gathered in one turn apply once and all get the result."""
    applied: list[int] = []

    @effectq.effect
    async def refund(order: int) -> str:
        await asyncio.sleep(0.1)
        applied.append(order)
        return f"refund-{order}"

    async def main() -> list[str]:
        async with effectq.run(run_id(), store=store):
            return await asyncio.gather(*(refund(7) for _ in range(5)))

    assert asyncio.run(main()) == ["refund-7"] * 5
    assert applied == [7]


def test_waiting_does_not_block_the_event_loop(store: effectq.Store) -> None:
    """While a call waits for an effect in flight elsewhere, other tasks keep running."""
    rid = run_id()

    @effectq.effect(wait=5)
    async def job() -> str:
        return "mine"

    async def main() -> tuple[str, int]:
        async with effectq.run(rid, store=store):
            key = job.key()
            claim = store.claim(key, effectq.store.ClaimRequest(lease_ms=10_000, owner="elsewhere"))
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            async def finish_elsewhere() -> None:
                await asyncio.sleep(0.3)
                await asyncio.to_thread(
                    store.complete,
                    key,
                    claim.token,
                    result=b'"theirs"',
                    result_state=effectq.ResultState.STORED,
                    retention_ms=60_000,
                )

            tick = asyncio.create_task(ticker())
            done = asyncio.create_task(finish_elsewhere())
            result = await job()
            await done
            tick.cancel()
            return result, ticks

    result, ticks = asyncio.run(main())
    assert result == "theirs"
    assert ticks >= 5


def test_cancelled_async_effect_is_unknown(store: effectq.Store) -> None:
    """A task cancelled mid-effect may have applied it: unknown, never silently repeated."""

    @effectq.effect
    async def push() -> None:
        await asyncio.sleep(10)

    async def main() -> None:
        async with effectq.run(run_id(), store=store):
            task = asyncio.create_task(push())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(effectq.OutcomeUnknown, match="CancelledError"):
                await push()

    asyncio.run(main())


def test_generator_records_the_last_item(store: effectq.Store) -> None:
    """A generator effect streams its items once; a replay yields the last one."""
    runs: list[int] = []

    @effectq.effect
    def stream(n: int) -> Iterator[int]:
        runs.append(n)
        for i in range(n):
            assert effectq.current_effect().name.endswith("stream")
            yield i

    rid = run_id()
    with effectq.run(rid, store=store):
        assert list(stream(3)) == [0, 1, 2]
    with effectq.run(rid, store=store):
        assert list(stream(3)) == [2]
    assert runs == [3]


def test_async_generator_records_the_last_item(store: effectq.Store) -> None:
    """Async generators stream the same way."""
    runs: list[int] = []

    @effectq.effect
    async def stream(n: int) -> AsyncIterator[str]:
        runs.append(n)
        for i in range(n):
            yield f"part-{i}"

    async def collect(rid: str) -> list[str]:
        async with effectq.run(rid, store=store):
            return [item async for item in stream(2)]

    rid = run_id()
    assert asyncio.run(collect(rid)) == ["part-0", "part-1"]
    assert asyncio.run(collect(rid)) == ["part-1"]
    assert runs == [2]


def test_generator_failing_midway_releases(store: effectq.Store) -> None:
    """A generator that raises an ordinary exception part way is released and runs again."""
    runs: list[int] = []

    @effectq.effect
    def stream() -> Iterator[int]:
        runs.append(1)
        yield 1
        if len(runs) == 1:
            raise ValueError("upstream refused")
        yield 2

    with effectq.run(run_id(), store=store):
        with pytest.raises(ValueError, match="upstream"):
            list(stream())
        assert list(stream()) == [1, 2]
    assert len(runs) == 2


def test_runs_do_not_leak_between_asyncio_tasks(store: effectq.Store) -> None:
    """Each task sees its own run; none sees another's."""

    async def task(rid: str) -> str:
        async with effectq.run(rid, store=store):
            await asyncio.sleep(0.01)
            return effectq.current_run().id

    async def main() -> list[str]:
        return await asyncio.gather(task("a"), task("b"), task("c"))

    assert asyncio.run(main()) == ["a", "b", "c"]
    assert effectq.active_run() is None


def test_runs_nest_and_restore() -> None:
    """An inner run shadows the outer one and gives it back on exit."""
    store = effectq.MemoryStore()
    with effectq.run("outer", store=store):
        with effectq.run("inner", store=store):
            assert effectq.current_run().id == "inner"
        assert effectq.current_run().id == "outer"
    assert effectq.active_run() is None


def test_threads_inherit_a_run_only_through_a_copied_context() -> None:
    """A plain thread has no run; one started in copy_context() has the caller's."""
    store = effectq.MemoryStore()
    seen: list[str | None] = []

    def look() -> None:
        bound = effectq.active_run()
        seen.append(bound.id if bound else None)

    with effectq.run("r", store=store):
        plain = threading.Thread(target=look)
        copied = threading.Thread(target=contextvars.copy_context().run, args=(look,))
        for t in (plain, copied):
            t.start()
            t.join()
    assert seen == [None, "r"]


def test_default_store() -> None:
    """effectq.run() without a store uses the default one, or says how to set it."""
    effectq.set_default_store(None)
    with pytest.raises(effectq.ConfigurationError, match="set_default_store"):
        effectq.run("r")
    store = effectq.MemoryStore()
    effectq.set_default_store(store)
    try:
        with effectq.run("r") as bound:
            assert bound.store is store
    finally:
        effectq.set_default_store(None)
