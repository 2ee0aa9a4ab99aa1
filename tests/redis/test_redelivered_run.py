"""A redelivered run on real Redis: what its first replay's reply carries, and its round trips.

The reply of the claim that replays a run's first effect brings the run's other completed
records (up to claim.lua's bound), so a redelivered run resumes in one round trip; past the
bound, one MGET brings the rest.

Round trips are counted at the client, as the requests its connections write (effectq's lane
writes its scripts through the same method); the server's counters would count the commands
a script runs too.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.connection

import effectq
from effectq.store.base import ClaimKind, ClaimRequest, Store
from effectq.store.redis.wire.aio import AsyncLane
from tests.conftest import delete_namespace

PREFETCH_RECORDS = 64
"""How many of the run's index entries the replay's claim reads (claim.lua)."""
PREFETCH_BYTES = 256 * 1024
"""How many bytes of records the replay's claim returns at most (claim.lua)."""


@pytest.fixture
def sent() -> Iterator[list[bytes]]:
    """The requests written by every redis-py connection while the test runs (one a round trip)."""
    written: list[bytes] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counted(conn: Any, command: Any, check_health: bool = True) -> None:
        written.append(b"".join(command) if isinstance(command, list | tuple) else bytes(command))
        original(conn, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    try:
        yield written
    finally:
        redis.connection.AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def _send(calls: list[int], pad: int = 0) -> Any:
    @effectq.effect(name="mail.send", wait=0, max_result_bytes=pad + 1024)
    def send(to: int) -> dict[str, Any]:
        calls.append(to)
        return {"sent": to, "pad": "x" * pad} if pad else {"sent": to}

    return send


def _commands(sent: list[bytes]) -> list[bytes]:
    return [request.split(b"\r\n")[2] for request in sent]


def _redelivered(
    redis_client: redis.Redis, namespace: str, sent: list[bytes], effects: int, pad: int = 0, **options: Any
) -> list[bytes]:
    """Run ``effects`` effects, then again in a worker new to the run (a redelivery): the
    commands the redelivered run wrote. Every effect runs once, and replays the second time."""
    calls: list[int] = []
    send = _send(calls, pad)
    first = effectq.RedisStore(redis_client, namespace=namespace)
    worker = effectq.RedisStore(redis_client, namespace=namespace, **options)  # the one it was redelivered to
    try:
        for order in ("order-0", "order-1"):
            with effectq.run(order, store=first):
                results = [send(i) for i in range(effects)]
        with effectq.run("order-0", store=worker):  # its connections made by an earlier task
            for i in range(effects):
                send(i)
        sent.clear()
        with effectq.run("order-1", store=worker) as again:
            assert [send(i) for i in range(effects)] == results
        assert again.stats.replayed == effects and again.stats.executed == 0
        assert calls == list(range(effects)) * 2  # each effect ran once in each run, never again
        return _commands(sent)
    finally:
        first.close()
        worker.close()


@pytest.mark.parametrize("effects", [1, 3, 50, PREFETCH_RECORDS])
def test_a_redelivered_run_resumes_in_one_round_trip(
    redis_client: redis.Redis, namespace: str, sent: list[bytes], effects: int
) -> None:
    """The claim that replays the first effect brings the others: no request follows it."""
    assert _redelivered(redis_client, namespace, sent, effects) == [b"EVALSHA"]


def test_a_redelivered_run_resumes_in_one_round_trip_through_redis_py(
    redis_client: redis.Redis, namespace: str, sent: list[bytes]
) -> None:
    """The same reply read by redis-py's ``execute_command`` (``via_execute_command=True``)."""
    assert _redelivered(redis_client, namespace, sent, 3, via_execute_command=True) == [b"EVALSHA"]


@pytest.mark.parametrize(
    ("effects", "pad"),
    [(PREFETCH_RECORDS + 2, 0), (6, PREFETCH_BYTES // 3)],
    ids=["more records than the bound", "more bytes than the bound"],
)
def test_a_redelivered_run_past_the_bound_fetches_the_rest_at_once(
    redis_client: redis.Redis, namespace: str, sent: list[bytes], effects: int, pad: int
) -> None:
    """Past the bound (records or bytes), the replay's reply brings what fits and one MGET the rest;
    every effect still replays, none runs."""
    assert _redelivered(redis_client, namespace, sent, effects, pad) == [b"EVALSHA", b"MGET"]


@pytest.mark.parametrize(("effects", "pad"), [(PREFETCH_RECORDS + 2, 0), (6, PREFETCH_BYTES // 3)])
def test_the_replays_reply_is_bounded(redis_store: effectq.RedisStore, effects: int, pad: int) -> None:
    """The claim's reply carries at most PREFETCH_RECORDS records and PREFETCH_BYTES of them, past
    the run's index (16 bytes a record)."""
    send = _send([], pad)
    with effectq.run("big", store=redis_store):
        for i in range(effects):
            send(i)
        key = send.key(0)
    request = ClaimRequest(lease_ms=60_000, owner="t:big", name="mail.send", run_id="big", prefetch=True)
    claim = redis_store.claim(key, request)
    assert claim.kind is ClaimKind.COMPLETED
    index, *records = claim.prefetch_hint
    assert len(index) == 16 * effects
    assert 0 < len(records) <= PREFETCH_RECORDS
    assert sum(len(record) for record in records if record) <= PREFETCH_BYTES


def test_a_mixed_run_decides_each_effect_by_its_claim(
    redis_store: effectq.RedisStore, redis_client: redis.Redis, sent: list[bytes]
) -> None:
    """What the replay's reply brings is used only as a completed claim is: an effect in flight
    (listed in the run's index when it completed once, then purged and claimed again) or unknown
    is judged by its own claim, and never runs here."""
    calls: list[int] = []
    send = _send(calls)
    with effectq.run("order", store=redis_store):
        for i in range(4):
            send(i)
        keys = [send.key(i) for i in range(5)]
    other = ClaimRequest(lease_ms=60_000, owner="other:1", name="mail.send", run_id="order")
    redis_client.delete(redis_store.record_key(keys[3]))  # purged: still listed in the run's index
    assert redis_store.claim(keys[3], other).kind is ClaimKind.CLAIMED  # now in flight elsewhere
    unknown = redis_store.claim(keys[4], other)
    assert redis_store.mark_unknown(keys[4], unknown.token, error="timed out")
    worker = effectq.RedisStore(redis_client, namespace=redis_store.namespace)
    try:
        with effectq.run("warm", store=worker):  # its connections made by an earlier task
            send(9)
        with effectq.run("order", store=worker) as again:
            sent.clear()
            assert [send(i) for i in range(3)] == [{"sent": i} for i in range(3)]
            assert _commands(sent) == [b"EVALSHA"]
            with pytest.raises(effectq.InProgress):
                send(3)
            with pytest.raises(effectq.OutcomeUnknown):
                send(4)
        assert again.stats.replayed == 3 and again.stats.executed == 0
        assert calls == [0, 1, 2, 3, 9]
    finally:
        worker.close()


@pytest.fixture(params=["memory", "fakeredis", "redis"])
def any_store(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> Iterator[Store]:
    if request.param == "memory":
        yield effectq.MemoryStore(namespace=namespace)
        return
    if request.param == "fakeredis":
        import fakeredis

        client: Any = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        client = redis.Redis.from_url(redis_url)
    store = effectq.RedisStore(client, namespace=namespace)
    yield store
    store.close()
    delete_namespace(client, namespace)
    client.close()


def test_a_replay_brings_the_run_records_only_when_it_lists_other_records(any_store: Store) -> None:
    """A run whose only completed record is the one replayed has nothing to prefetch: its claim
    brings no hint, and the engine makes no prefetch. A run of more brings them, and its other
    effects replay from them. Every store agrees."""
    calls: list[int] = []
    send = _send(calls)
    with effectq.run("alone", store=any_store):
        send(1)
    with effectq.run("pair", store=any_store):
        send(1)
        send(2)
    for run, listed in (("alone", False), ("pair", True)):
        with effectq.run(run, store=any_store):
            key = send.key(1)
        request = ClaimRequest(lease_ms=60_000, owner=f"t:{run}", name="mail.send", run_id=run, prefetch=True)
        claim = any_store.claim(key, request)
        assert claim.kind is ClaimKind.COMPLETED
        assert (claim.prefetch_hint is not None) is listed, run
    with effectq.run("alone", store=any_store) as again:
        assert send(1) == {"sent": 1}
    assert again.stats.replayed == 1 and again.prefetched is None
    with effectq.run("pair", store=any_store) as again:
        assert [send(1), send(2)] == [{"sent": 1}, {"sent": 2}]
        assert again.prefetched is not None and again.prefetched.get(send.key(2)) is not None
    assert again.stats.replayed == 2 and calls == [1, 1, 2]


def test_an_async_redelivered_run_resumes_in_one_round_trip(
    redis_client: redis.Redis, namespace: str, sent: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async effects on the async lane (whose writes are counted at the lane): the replay's reply
    brings the rest there too."""
    lane_write = AsyncLane._write

    async def counted(lane: AsyncLane, conn: Any, frame: bytes) -> None:
        sent.append(frame)
        await lane_write(lane, conn, frame)

    monkeypatch.setattr(AsyncLane, "_write", counted)
    calls: list[int] = []

    @effectq.effect(name="mail.send.async")
    async def send(to: int) -> dict[str, int]:
        calls.append(to)
        return {"sent": to}

    async def run(store: effectq.RedisStore, order: str) -> list[Any]:
        async with effectq.run(order, store=store) as bound:
            results = [await send(i) for i in range(3)]
        return [results, bound.stats.replayed]

    first = effectq.RedisStore(redis_client, namespace=namespace)
    worker = effectq.RedisStore(redis_client, namespace=namespace)
    try:

        async def main() -> list[Any]:
            for order in ("order-0", "order-1"):
                await run(first, order)
            await run(worker, "order-0")  # its connections made by an earlier task
            sent.clear()
            return await run(worker, "order-1")

        assert asyncio.run(main()) == [[{"sent": i} for i in range(3)], 3]
        assert _commands(sent) == [b"EVALSHA"] and calls == [0, 1, 2] * 2
    finally:
        first.close()
        worker.close()


class _Recording(ThreadPoolExecutor):
    """A default executor that records what is handed to it (``asyncio.to_thread`` submits there)."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted: list[Any] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        inner = fn.args[0] if isinstance(fn, functools.partial) and fn.args else fn  # to_thread's ctx.run
        self.submitted.append(getattr(inner, "__name__", inner))
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize(("effects", "hops"), [(1, 0), (3, 0), (PREFETCH_RECORDS + 4, 1)])
def test_an_async_redelivered_run_hops_to_a_thread_only_for_records_past_the_bound(
    redis_client: redis.Redis, namespace: str, effects: int, hops: int
) -> None:
    """The records the replay's claim brought are read in the event loop; only the MGET of those
    past claim.lua's bound runs in a worker thread (a blocking round trip)."""
    calls: list[int] = []

    @effectq.effect(name="mail.send.async")
    async def send(to: int) -> dict[str, int]:
        calls.append(to)
        return {"sent": to}

    async def run(store: effectq.RedisStore, order: str) -> int:
        async with effectq.run(order, store=store) as bound:
            assert [await send(i) for i in range(effects)] == [{"sent": i} for i in range(effects)]
        return bound.stats.replayed

    first = effectq.RedisStore(redis_client, namespace=namespace)
    worker = effectq.RedisStore(redis_client, namespace=namespace)  # the one it was redelivered to
    executor = _Recording()
    try:

        async def main() -> int:
            asyncio.get_running_loop().set_default_executor(executor)
            await run(first, "order")
            executor.submitted.clear()
            return await run(worker, "order")

        assert asyncio.run(main()) == effects
        assert calls == list(range(effects))
        assert executor.submitted == ["prefetch"] * hops
    finally:
        executor.shutdown()
        first.close()
        worker.close()
