"""Async effects send their scripts from the event loop, on the real Redis: no thread hop.

The claim and the completion of an async effect go out on asyncio connections
of the store's async lane. These tests hold what that must not change: the
effect applies once and replays, a flushed script cache is reloaded, a
connection Redis closed while idle is replaced, a cancelled call never leaves
a half-read reply for the next one, a loop's connections close when it shuts
down, and a store the lane cannot serve (replicas waited for, a subclass's
own claim) keeps the thread.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import effectq
from effectq.store.base import Claim, ClaimKind, ClaimRequest
from effectq.store.redis.wire.aio import AsyncLane
from tests.support import pauses
from tests.support.collected import verdict
from tests.support.servers import Server, wait_until


@pytest.fixture(scope="module")
def redis_url(private_redis_url: str) -> str:
    """These tests flush the script cache, pause clients and kill every connection: they run on a
    server of their own."""
    return private_redis_url


@pytest.fixture
def no_threads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Fail any store call that hops to a thread; returns what tried."""
    tried: list[Any] = []

    async def to_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
        tried.append(fn)
        raise AssertionError(f"{fn} went to a thread")

    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    return tried


def _idle(lane: AsyncLane) -> list[Any]:
    """The lane's idle connections on the running loop (the loop holds them)."""
    stacks = asyncio.get_running_loop().__dict__["_effectq_idle_connections"]
    return stacks[1].get(lane, [])  # type: ignore[no-any-return]


def _effect(calls: list[int]) -> Any:
    @effectq.effect(name=f"lane.send.{uuid.uuid4().hex[:6]}")
    async def send(n: int) -> dict[str, int]:
        calls.append(n)
        return {"sent": n}

    return send


def test_an_async_effect_applies_once_and_replays_without_a_thread(
    redis_store: effectq.RedisStore, no_threads: list[Any]
) -> None:
    calls: list[int] = []
    send = _effect(calls)

    async def main() -> list[Any]:
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=redis_store) as run:
            run.prefetch_tried = True  # a redelivery's prefetch is another path
            first = await send(1)
            again = await send(1)
            return [first, again, run.stats.executed, run.stats.replayed]

    assert asyncio.run(main()) == [{"sent": 1}, {"sent": 1}, 1, 1]
    assert calls == [1]
    assert no_threads == []


def test_a_flushed_script_cache_is_loaded_again(
    redis_store: effectq.RedisStore, no_threads: list[Any]
) -> None:
    calls: list[int] = []
    send = _effect(calls)

    async def main() -> None:
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=redis_store) as run:
            run.prefetch_tried = True  # a redelivery's prefetch is another path
            await send(1)
            redis_store.client.script_flush()
            assert await send(2) == {"sent": 2}
            assert await send(2) == {"sent": 2}

    asyncio.run(main())
    assert calls == [1, 2]


def test_a_connection_redis_closed_while_idle_is_replaced(
    redis_store: effectq.RedisStore, redis_client: redis.Redis, no_threads: list[Any]
) -> None:
    calls: list[int] = []
    send = _effect(calls)

    async def main() -> None:
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=redis_store):
            await send(1)
            killed = redis_client.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 1  # the lane's idle connection among them
            assert await send(2) == {"sent": 2}  # its claim, on a fresh connection

    asyncio.run(main())
    assert calls == [1, 2]


def test_a_cancelled_call_leaves_no_reply_for_the_next(
    redis_store: effectq.RedisStore, redis_client: redis.Redis
) -> None:
    """Cancelled while its claim's reply is on the way: that connection is dropped, so the next
    call reads its own reply, not the cancelled one's."""
    lane = redis_store._async_lane
    assert lane is not None
    calls: list[int] = []
    send = _effect(calls)

    async def main() -> None:
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=redis_store):
            await send(0)  # a connection on the loop's stack
            before = list(_idle(lane))
            with pauses.writes_paused(redis_client):
                call = asyncio.ensure_future(send(1))
                await pauses.until_held_async(redis_client)  # the claim is written; Redis holds it
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
            wait_until(lambda: not pauses.held(redis_client), "the cancelled claim left the pause")
            assert before
            assert not any(conn in _idle(lane) for conn in before)  # dropped, not stacked
            reply = await redis_store._claim_async(
                "lane:another-key",
                ClaimRequest(60_000, "owner-2", "lane.other", "r", "", False, False, False, 60_000, False),
            )
            assert isinstance(reply, Claim)
            assert reply.kind is ClaimKind.CLAIMED  # its own reply: a fresh key's grant

    asyncio.run(main())
    assert calls == [0]


def test_a_loop_s_connections_close_when_it_shuts_down(redis_store: effectq.RedisStore) -> None:
    lane = redis_store._async_lane
    assert lane is not None
    calls: list[int] = []
    send = _effect(calls)
    held: list[Any] = []

    async def main() -> None:
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=redis_store):
            await asyncio.gather(send(1), send(2), send(3))
            held.extend(_idle(lane))
            assert held and all(conn.is_connected for conn in held)

    asyncio.run(main())
    assert not any(conn.is_connected for conn in held)
    first = list(held)
    held.clear()
    asyncio.run(main())  # a new loop makes its own
    assert not any(conn in first for conn in held)
    assert sorted(calls) == [1, 1, 2, 2, 3, 3]  # a new run id each time


def test_stores_the_lane_cannot_serve_keep_the_thread(redis_client: redis.Redis, namespace: str) -> None:
    waited = effectq.RedisStore(redis_client, namespace=namespace, wait_replicas=1)
    assert waited.async_store() is None  # each write must be followed by its WAIT

    class Audited(effectq.RedisStore):
        def claim(self, key: str, request: ClaimRequest) -> Claim:
            return super().claim(key, request)

    audited = Audited(redis_client, namespace=namespace)
    on_loop = audited.async_store()
    assert on_loop is not None
    assert on_loop.claim != audited._claim_async  # its own claim runs, in a thread
    assert on_loop.complete == audited._complete_async
    spied = effectq.RedisStore(redis_client, namespace=namespace)
    spied.complete = spied.complete  # type: ignore[method-assign]  # set on the instance, as a spy is
    assert spied.async_store() is None
    for store in (waited, audited, spied):
        store.close()


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[str]:
    socket = tmp_path / "redis.sock"
    server = Server(tmp_path, "--unixsocket", str(socket), "--unixsocketperm", "700").start()
    yield f"unix://{socket}?db=0"
    server.stop()


def test_a_unix_socket_store_sends_from_the_loop(unix_redis: str, no_threads: list[Any]) -> None:
    store = effectq.RedisStore.from_url(unix_redis, namespace="unix")
    assert store.async_store() is not None
    calls: list[int] = []
    send = _effect(calls)

    async def main() -> None:
        with effectq.run("unix-run", store=store) as run:
            run.prefetch_tried = True
            await send(1)
            await send(1)

    try:
        asyncio.run(main())
    finally:
        store.close()
        store.client.close()
    assert calls == [1]


def test_a_loop_is_not_kept_alive_by_its_connections(
    redis_client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """A task queue that runs asyncio.run per task must not keep every loop it made (asked in a
    process of its own: only effectq's references count there)."""
    result = verdict("loops-of-asyncio-run", redis_url, namespace)
    assert result["alive"] == [], result["alive"]  # what holds each loop still alive
    assert result["calls"] == [1, 1, 1]


def test_a_loop_closed_without_shutting_down_leaves_nothing_behind(
    redis_client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """Closed without shutdown_asyncgens (as some runners do): collecting it raises nothing, not
    even an exception Python can only print, and leaves no loop alive."""
    result = verdict("loop-closed-without-shutdown", redis_url, namespace)
    assert result["unraisable"] == []
    assert result["alive"] == [], result["alive"]
    assert result["calls"] == [1]


def test_a_loop_that_cannot_hold_connections_sends_from_a_thread(
    redis_store: effectq.RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop object without attributes of its own: the scripts go to a worker thread, and the
    effect applies once all the same."""
    monkeypatch.setattr(AsyncLane, "serves", staticmethod(lambda loop: False))
    hopped: list[Any] = []
    to_thread = asyncio.to_thread

    async def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hopped.append(getattr(fn, "__name__", fn))
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    calls: list[int] = []
    send = _effect(calls)

    async def main() -> None:
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=redis_store) as run:
            run.prefetch_tried = True
            await send(1)
            await send(1)

    asyncio.run(main())
    assert calls == [1]
    assert hopped == ["_run", "_run", "_run"]  # claim, complete, the replay's claim
