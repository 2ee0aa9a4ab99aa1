"""An async effect's completion is written before it returns; its reply is read later, on the real Redis.

Inside a run its task entered with ``async with``, an async effect's completion
is posted on the store's async lane: written at once, its reply read by the
task's next script on that connection (which rides behind it) or at the run's
end. These tests hold what that must not change: the record is completed as
soon as Redis reads the write, a worker killed right after the effect returned
leaves it completed, a flushed script cache, a claim taken over and a
connection lost before the reply was read are each handled as a completion
waited for would be, other tasks wait for their own, and nothing is owed once
the run ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import textwrap
import time
import uuid
from typing import Any

import pytest
import redis

import effectq
from effectq import events
from effectq._runtime.leases import heartbeat
from effectq.store.redis.wire.aio import _pending_on
from effectq.store.redis.wire.posted import ignore
from tests.support.procs import killed_after_first_line


@pytest.fixture(scope="module")
def redis_url(private_redis_url: str) -> str:
    """These tests flush the script cache and pause clients: they run on a server of their own."""
    return private_redis_url


@pytest.fixture
def store(redis_store: effectq.RedisStore) -> effectq.RedisStore:
    assert redis_store._async_lane is not None  # the path under test
    return redis_store


def _owed(store: effectq.RedisStore) -> tuple[Any, list[Any]] | None:
    """The connection on the store's async lane that owes the running task replies, and what."""
    registry = _pending_on(asyncio.get_running_loop())
    task = asyncio.current_task()
    mine = registry.get(task) if registry is not None and task is not None else None
    held: tuple[Any, list[Any]] | None = mine.get(store._async_lane) if mine else None
    return held


def _owes(store: effectq.RedisStore) -> int:
    """How many posts' replies the running task owes (a ``SCRIPT LOAD`` ahead of one is not counted)."""
    held = _owed(store)
    return sum(on_reply is not ignore for on_reply, _, _ in held[1]) if held else 0


def _idle(store: effectq.RedisStore) -> list[Any]:
    stacks = asyncio.get_running_loop().__dict__["_effectq_idle_connections"][1]
    idle: list[Any] = stacks.get(store._async_lane, [])
    return idle


def _completed(store: effectq.RedisStore, key: str) -> bool:
    record = store.get(key)
    return record is not None and record.status is effectq.Status.COMPLETED


def test_the_completion_lands_before_the_effect_returns_and_its_reply_by_the_run_s_end(
    store: effectq.RedisStore, onlooker: effectq.RedisStore
) -> None:
    keys: list[str] = []

    @effectq.effect(name="aposted.send")
    async def send(to: str) -> str:
        keys.append(effectq.current_effect().key)
        return f"sent to {to}"

    async def main() -> None:
        async with effectq.run(f"aposted-{uuid.uuid4().hex[:8]}", store=store):
            assert await send("a@example.com") == "sent to a@example.com"
            assert _owes(store) == 1  # written, its reply not read yet
            assert _completed(onlooker, keys[0])  # another connection: Redis ran it already
            assert await send("b@example.com") == "sent to b@example.com"
            assert _owes(store) == 1  # the second claim read the first reply; the second's is owed
            assert _idle(store) == []  # the one connection is the task's until the run ends
        assert _owes(store) == 0
        assert len(_idle(store)) == 1  # the lane's again
        assert heartbeat.pending()[1] == 0

    asyncio.run(main())
    for key in keys:
        assert _completed(onlooker, key)


def test_a_worker_killed_right_after_the_effect_returned_leaves_it_completed(
    redis_url: str, namespace: str, onlooker: effectq.RedisStore, tmp_path: Any
) -> None:
    """SIGKILL between the async effect's return and the reading of its reply: the record is
    completed, and the redelivered run replays it instead of applying it again."""
    applied = tmp_path / "applied"
    program = textwrap.dedent(
        f"""
        import asyncio, effectq
        from effectq.store.redis.wire.aio import _pending_on
        store = effectq.RedisStore.from_url({redis_url!r}, namespace={namespace!r})

        @effectq.effect(name="aposted.charge")
        async def charge(cents: int) -> str:
            with open({str(applied)!r}, "a") as f:
                f.write("charged\\n")
            return f"charged {{cents}}"

        async def main():
            async with effectq.run("order-7", store=store):
                await charge(500)
                owing = _pending_on(asyncio.get_running_loop())
                print(bool(owing and owing.get(asyncio.current_task())), flush=True)
                await asyncio.sleep(60)  # killed here: the reply of the completion never read

        asyncio.run(main())
        """
    )
    assert killed_after_first_line(program) == "True"  # it did owe the reply when killed

    @effectq.effect(name="aposted.charge")
    async def charge(cents: int) -> str:
        with open(applied, "a") as f:
            f.write("charged again\n")
        return f"charged {cents}"

    async def again() -> str:
        async with effectq.run("order-7", store=onlooker):
            return await charge(500)

    assert asyncio.run(again()) == "charged 500"
    assert applied.read_text() == "charged\n"


def test_a_flushed_script_cache_loads_the_script_and_runs_the_completion_again(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_client: redis.Redis, caplog: Any
) -> None:
    keys: list[str] = []

    @effectq.effect(name="aposted.flush")
    async def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        redis_client.script_flush()  # the completion, posted next, meets NOSCRIPT
        return n

    async def main() -> None:
        async with effectq.run(f"aflush-{uuid.uuid4().hex[:8]}", store=store):
            assert await act(1) == 1
            assert _owes(store) == 1
            assert await act(2) == 2  # its claim rides behind the first completion; NOSCRIPT too

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if r.name.startswith("effectq")] == []
    assert len(keys) == 2 and all(_completed(onlooker, key) for key in keys)
    assert heartbeat.pending()[1] == 0  # settled where it was read, not left to the background


def test_a_claim_taken_over_meanwhile_is_logged_when_the_reply_is_read(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, caplog: Any
) -> None:
    @effectq.effect(name="aposted.stolen")
    async def act(n: int) -> int:
        ctx = effectq.current_effect()
        assert onlooker.release(ctx.key, ctx.token, error="taken over", retention_ms=60_000)
        return n

    async def main() -> None:
        async with effectq.run(f"astolen-{uuid.uuid4().hex[:8]}", store=store):
            assert await act(3) == 3  # applied: the caller gets its value
            assert _owes(store) == 1
            assert not caplog.records  # the refusal is not known yet

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "was taken over or settled by someone else" in messages[0]


def _client_id(admin: redis.Redis, conn: Any) -> int:
    """The server's id of one of our asyncio connections, found by its local port."""
    port = conn._writer.get_extra_info("sockname")[1]
    for entry in admin.client_list():
        if entry["addr"].endswith(f":{port}"):
            return int(entry["id"])
    raise AssertionError(f"no client on port {port}")


def _until_completed(onlooker: effectq.RedisStore, key: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _completed(onlooker, key):
        time.sleep(0.05)
    assert _completed(onlooker, key)


def test_a_reply_lost_with_its_connection_is_recorded_in_the_background(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_url: str, caplog: Any
) -> None:
    """Redis paused, the completion queued, the connection killed: the reply never comes. The
    heartbeat thread completes it again (the same token), as it would a completion that failed."""
    keys: list[str] = []
    admin = redis.Redis.from_url(redis_url)

    @effectq.effect(name="aposted.lost")
    async def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        admin.execute_command("CLIENT", "PAUSE", "400", "WRITE")
        return n

    async def main() -> None:
        async with effectq.run(f"alost-{uuid.uuid4().hex[:8]}", store=store):
            assert await act(4) == 4
            held = _owed(store)
            assert held is not None
            admin.execute_command("CLIENT", "KILL", "ID", _client_id(admin, held[0]))
        assert _idle(store) == []  # the broken connection was not handed back

    try:
        with caplog.at_level(logging.ERROR):
            asyncio.run(main())
    finally:
        admin.close()
    assert any("recording it failed" in r.getMessage() for r in caplog.records)
    _until_completed(onlooker, keys[0])
    assert heartbeat.pending()[1] == 0


def test_a_task_cancelled_after_its_owed_reply_came_settles_it_as_it_is(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_url: str, caplog: Any
) -> None:
    """Cancelled while its next claim waits (Redis paused after the completion ran): the owed
    reply was read before the cancel, so it settles as any other; only the connection goes."""
    admin = redis.Redis.from_url(redis_url)
    keys: list[str] = []

    @effectq.effect(name="aposted.cancelled_after")
    async def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        return n

    async def body(started: asyncio.Event) -> None:
        try:
            async with effectq.run(f"acancel-{uuid.uuid4().hex[:8]}", store=store):
                await act(5)
                assert _owes(store) == 1
                admin.execute_command("CLIENT", "PAUSE", "500", "WRITE")  # the claim below waits
                started.set()
                await act(6)
        finally:
            started.set()  # a failed assertion above must not leave main waiting

    _run_cancelled(body, admin, caplog)
    assert [r.getMessage() for r in caplog.records if r.name == "effectq.complete"] == []  # settled
    assert _completed(onlooker, keys[0])
    deadline = time.monotonic() + 10
    while heartbeat.pending()[1] and time.monotonic() < deadline:  # the interrupted claim of 6
        time.sleep(0.05)
    assert heartbeat.pending()[1] == 0


def test_a_task_cancelled_before_its_owed_reply_came_writes_it_again_quietly(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_url: str, caplog: Any
) -> None:
    """Cancelled while the owed reply itself waits (Redis paused before it ran the completion):
    the reply is never read, so the heartbeat writes the completion again (the same token), and
    says so at INFO: a cancel is no failure of Redis. The next call replays it."""
    admin = redis.Redis.from_url(redis_url)
    run_id = f"acancel-{uuid.uuid4().hex[:8]}"
    keys: list[str] = []
    applied: list[int] = []

    @effectq.effect(name="aposted.cancelled_before")
    async def act(n: int) -> int:
        if not applied:
            admin.execute_command("CLIENT", "PAUSE", "500", "WRITE")  # its completion waits
        keys.append(effectq.current_effect().key)
        applied.append(n)
        return n

    async def body(started: asyncio.Event) -> None:
        try:
            async with effectq.run(run_id, store=store):
                await act(5)
                assert _owes(store) == 1
                started.set()
                await act(6)  # its claim rides behind; the reply before it is not in yet
        finally:
            started.set()

    _run_cancelled(body, admin, caplog)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "effectq.complete"]
    assert len(messages) == 1 and messages[0][0] == logging.INFO and "reply not read" in messages[0][1]
    _until_completed(onlooker, keys[0])

    async def again() -> int:
        async with effectq.run(run_id, store=onlooker):
            return await act(5)

    assert asyncio.run(again()) == 5
    assert applied == [5]  # replayed, not applied again
    deadline = time.monotonic() + 10
    while heartbeat.pending()[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert heartbeat.pending()[1] == 0


def _run_cancelled(body: Any, admin: redis.Redis, caplog: Any) -> None:
    """:func:`_cancel_once_started` in a loop of its own, effectq's logs captured from INFO;
    Redis unpaused and ``admin`` closed whatever happens."""
    try:
        with caplog.at_level(logging.INFO, logger="effectq"):
            asyncio.run(_cancel_once_started(body))
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()


async def _cancel_once_started(body: Any) -> None:
    """Run ``body(started)`` as a task and cancel it a moment after it sets ``started``."""
    started = asyncio.Event()
    task = asyncio.create_task(body(started))
    await started.wait()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_effects_in_other_tasks_wait_for_their_own_completions(store: effectq.RedisStore) -> None:
    """Only the task that entered the run reads replies at its end: tasks it starts wait for
    theirs, and a run bound with a plain ``with`` inside a coroutine posts nothing."""

    @effectq.effect(name="aposted.gathered")
    async def act(n: int) -> int:
        return n

    async def child(n: int) -> int:
        value = await act(n)
        assert _owes(store) == 0
        return value

    async def main() -> None:
        async with effectq.run(f"agather-{uuid.uuid4().hex[:8]}", store=store):
            assert await asyncio.gather(child(1), child(2), child(3)) == [1, 2, 3]
            assert _owes(store) == 0
        with effectq.run(f"aplain-{uuid.uuid4().hex[:8]}", store=store):
            assert await act(4) == 4
            assert _owes(store) == 0

    asyncio.run(main())


def test_no_more_tasks_owe_replies_than_the_lane_keeps_connections(
    store: effectq.RedisStore, onlooker: effectq.RedisStore
) -> None:
    """Thousands of tasks must not hold thousands of connections: past the lane's keep, a task's
    completion is waited for, as an effect alone's is."""
    lane = store._async_lane
    assert lane is not None
    keep = lane._keep
    keys: list[str] = []

    @effectq.effect(name="aposted.crowd")
    async def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        return n

    async def one(n: int, owing: list[int], go: asyncio.Event) -> None:
        async with effectq.run(f"acrowd-{uuid.uuid4().hex[:8]}-{n}", store=store):
            await act(n)
            owing.append(_owes(store))
            await go.wait()

    async def main() -> None:
        owing: list[int] = []
        go = asyncio.Event()
        tasks = [asyncio.create_task(one(n, owing, go)) for n in range(keep + 8)]
        while len(owing) < len(tasks):
            await asyncio.sleep(0.01)
        assert sum(owing) == keep and set(owing) == {0, 1}
        registry = _pending_on(asyncio.get_running_loop())
        assert registry is not None and len(registry) == keep
        go.set()
        await asyncio.gather(*tasks)
        assert not registry
        assert len(_idle(store)) <= keep

    asyncio.run(main())
    assert len(keys) == keep + 8 and all(_completed(onlooker, key) for key in keys)


_where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="outside")


def test_with_an_event_listener_on_the_completed_event_comes_with_the_reply(
    store: effectq.RedisStore,
) -> None:
    """Listeners get each completed event once its reply is read, in the context the effect was
    called in, before the next call's events."""
    seen: list[tuple[str, str, str]] = []

    def listen(event: events.Event) -> None:
        seen.append((event.kind.value, event.key, _where.get()))

    unsubscribe = events.subscribe(listen)

    @effectq.effect(name="aposted.listened")
    async def act(n: int) -> int:
        return n

    async def main() -> None:
        async with effectq.run(f"alistened-{uuid.uuid4().hex[:8]}", store=store):
            k5, k6 = act.key(5), act.key(6)
            _where.set("first")
            await act(5)
            assert [kind for kind, *_ in seen] == ["claimed", "executed"]
            assert _owes(store) == 1  # posted, although a listener is on
            _where.set("second")
            await act(6)
            assert seen == [
                ("claimed", k5, "first"),
                ("executed", k5, "first"),
                ("completed", k5, "first"),  # read with the next claim's reply, in the first's context
                ("claimed", k6, "second"),
                ("executed", k6, "second"),
            ]
            _where.set("third")
        assert seen[-1] == ("completed", k6, "second")  # the run's end read the last reply

    try:
        asyncio.run(main())
    finally:
        unsubscribe()
