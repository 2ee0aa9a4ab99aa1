"""The wire at its edges, on real Redis servers: what a failure or a reset after a posted
completion must not do.

Inside a run, an effect's completion is written at once and its reply read by
the thread's next script on the same connection. These tests hold that: a
completion that cannot get a connection is written in the background and the
caller gets its result; a connection closed while it owes replies is never
reconnected under them; a flushed script cache keeps scripts in the order they
were sent; a refused connection is not taken for a request that may have
landed; and a forked child never inherits a lock another thread held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import effectq
from effectq import events
from effectq._runtime.leases import heartbeat
from tests.support import servers


@pytest.fixture(scope="module")
def redis_url(private_redis_url: str) -> str:
    """These tests flush the script cache: they run on a server of their own."""
    return private_redis_url


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[servers.Server]:
    """A redis-server of this test's own, at most 8 clients, stopped at the end."""
    server = servers.Server(tmp_path, "--maxclients", "8").start()
    try:
        yield server
    finally:
        server.stop()


def _until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _completed(store: effectq.RedisStore, key: str) -> bool:
    record = store.get(key)
    return record is not None and record.status is effectq.Status.COMPLETED


def _client(server: servers.Server) -> redis.Redis:
    """A client of ``server`` that tries a refused connection once (redis-py's default backs off)."""
    return redis.Redis(host=servers.HOST, port=server.port, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def _fill(server: servers.Server) -> list[redis.Redis]:
    """Connections that take every client slot the server has left."""
    fillers: list[redis.Redis] = []
    while True:
        filler = _client(server)
        try:
            filler.ping()
        except redis.ConnectionError:
            filler.close()
            return fillers
        fillers.append(filler)
        assert len(fillers) < 20, "the server takes more clients than it was started with"


def test_a_completion_that_cannot_get_a_connection_is_written_in_the_background(
    own_server: servers.Server, caplog: Any
) -> None:
    """The effect applied; its completion needs a new connection (another thread holds the one the
    lane had) and the server refuses it (maxclients). The caller gets its result, the completion
    is retried in the background and lands once the server takes clients again."""
    client = _client(own_server)
    store = effectq.RedisStore(client, namespace="edge")
    onlooker = effectq.RedisStore(_client(own_server), namespace="edge")
    holding, done = threading.Event(), threading.Event()
    fillers: list[redis.Redis] = []
    keys: list[str] = []

    @effectq.effect(name="edge.checkout.note")
    def note() -> str:
        return "noted"

    def worker() -> None:
        with effectq.run("worker", store=store):
            note()  # its completion is posted: this thread holds the lane's connection until the end
            holding.set()
            done.wait(60)

    thread = threading.Thread(target=worker)

    @effectq.effect(name="edge.checkout.charge")
    def charge(cents: int) -> str:
        keys.append(effectq.current_effect().key)
        thread.start()
        assert holding.wait(30)
        fillers.extend(_fill(own_server))
        return f"charged {cents}"

    try:
        with caplog.at_level(logging.ERROR, logger="effectq"), effectq.run("main", store=store):
            assert charge(250) == "charged 250"
        assert any("recording it failed" in r.getMessage() for r in caplog.records)  # handed over
        for filler in fillers:
            filler.close()
        fillers.clear()
        _until(lambda: _completed(onlooker, keys[0]), "the completion written in the background")
    finally:
        done.set()
        if thread.ident is not None:
            thread.join(30)
        for filler in fillers:
            filler.close()
        store.close()
        onlooker.close()
        onlooker.client.close()
        client.close()


def test_a_connection_reset_while_it_owes_a_reply_is_not_reconnected_under_it(
    redis_url: str, namespace: str, onlooker: effectq.RedisStore, caplog: Any
) -> None:
    """``pool.disconnect()`` (a client's close, an application's reset) while a posted completion's
    reply is owed: the next claim goes out on a connection of its own and gets its own reply, at
    once; the owed completion, whose reply is gone with the old socket, is written again in the
    background."""
    client = redis.Redis.from_url(redis_url, socket_timeout=3)
    store = effectq.RedisStore(client, namespace=namespace)
    seen: list[events.Event] = []
    unsubscribe = events.subscribe(seen.append)
    keys: list[str] = []

    @effectq.effect(name="edge.reset.act")
    def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        return n

    try:
        with (
            caplog.at_level(logging.INFO, logger="effectq"),
            effectq.run(f"reset-{uuid.uuid4().hex[:8]}", store=store),
        ):
            assert act(1) == 1
            client.connection_pool.disconnect()
            assert act(2) == 2
    finally:
        unsubscribe()
    try:
        assert [e.error for e in seen if e.kind is events.EventKind.STORE_ERROR] == []
        assert [e.kind for e in seen if e.key == keys[1]] == [
            events.EventKind.CLAIMED,
            events.EventKind.EXECUTED,
            events.EventKind.COMPLETED,
        ]
        _until(lambda: heartbeat.pending()[1] == 0, "the background write of the first completion")
        assert all(_completed(onlooker, key) for key in keys)
    finally:
        store.close()
        client.close()


def test_after_a_flushed_script_cache_the_scripts_still_run_in_the_order_they_were_sent(
    redis_store: effectq.RedisStore, redis_client: redis.Redis
) -> None:
    """Redis restarted (its script cache empty): the first claim loads claim.lua, the completion
    posted after it meets NOSCRIPT, and the next call of the same key writes its claim behind it.
    That claim must see the effect completed (it replays), not in flight."""
    calls: list[int] = []

    @effectq.effect(name="edge.flush.charge", wait=0)
    def charge(cents: int) -> str:
        calls.append(cents)
        return f"charged {cents}"

    redis_client.script_flush()
    with effectq.run(f"flush-{uuid.uuid4().hex[:8]}", store=redis_store):
        assert charge(250) == "charged 250"
        assert charge(250) == "charged 250"
    assert calls == [250]
    assert heartbeat.pending()[1] == 0


def test_after_a_flushed_script_cache_an_async_run_keeps_the_order_too(
    redis_store: effectq.RedisStore, redis_client: redis.Redis
) -> None:
    """The same on the async lane: the second call of the key, in the same task, replays."""
    assert redis_store._async_lane is not None  # the path under test
    calls: list[int] = []

    @effectq.effect(name="edge.flush.acharge", wait=0)
    async def charge(cents: int) -> str:
        calls.append(cents)
        return f"charged {cents}"

    async def main() -> None:
        async with effectq.run(f"aflush-{uuid.uuid4().hex[:8]}", store=redis_store):
            assert await charge(250) == "charged 250"
            assert await charge(250) == "charged 250"

    redis_client.script_flush()
    asyncio.run(main())
    assert calls == [250]
    assert heartbeat.pending()[1] == 0


@pytest.mark.parametrize("retry", [True, False], ids=["may-run-twice", "runs-once"])
def test_a_script_sent_after_posts_sees_what_they_wrote_after_a_flush(
    redis_client: redis.Redis, namespace: str, retry: bool
) -> None:
    """Posts meet NOSCRIPT; the script sent next on the lane was loaded already. It sees what the
    posts wrote: run again after them if it may run twice, else sent only once they are read."""
    from effectq.store.redis.wire.sync import Lane

    counter = f"{namespace}:counter"
    bump = "return redis.call('INCR', KEYS[1])"
    peek = "return redis.call('GET', KEYS[1])"
    lane = Lane(redis_client.connection_pool)
    settled: list[Any] = []
    try:
        redis_client.script_flush()
        peek_sha = redis_client.script_load(peek)
        bump_sha = redis_client.register_script(bump).sha  # not loaded: the posts meet NOSCRIPT
        assert lane.send_pipelined(bump_sha, bump, [counter], [], settled.append)
        assert lane.send_pipelined(bump_sha, bump, [counter], [], settled.append)
        assert lane.evalsha(peek_sha, peek, [counter], [], retry=retry) == b"2"
        assert settled == [1, 2]
    finally:
        lane.close()
        redis_client.delete(counter)


def test_a_refused_connection_leaves_nothing_to_take_back(namespace: str, caplog: Any) -> None:
    """No Redis listening: every claim is refused at connect, so nothing reached Redis. The call
    raises StoreError, and no background release of a claim that cannot exist is queued (nor
    reported as never landed, with advice to resolve a record that is not there)."""
    store = effectq.RedisStore.from_url(
        f"redis://{servers.HOST}:{servers.free_port()}/0", namespace=namespace
    )

    @effectq.effect(name="edge.refused.act")
    def act() -> str:
        raise AssertionError("never runs")

    try:
        with (
            caplog.at_level(logging.INFO, logger="effectq"),
            pytest.raises(effectq.StoreError, match="Connection refused"),
            effectq.run("refused", store=store),
        ):
            act()
        assert heartbeat.pending()[1] == 0
    finally:
        store.close()
    assert not [r.getMessage() for r in caplog.records if r.name == "effectq.repair"]


def test_a_refused_connection_leaves_nothing_to_take_back_in_an_async_run(
    namespace: str, caplog: Any
) -> None:
    """The same for an async effect, whose claims go out on the async lane."""
    store = effectq.RedisStore.from_url(
        f"redis://{servers.HOST}:{servers.free_port()}/0", namespace=namespace
    )
    assert store._async_lane is not None  # the path under test

    @effectq.effect(name="edge.refused.aact")
    async def act() -> str:
        raise AssertionError("never runs")

    async def main() -> None:
        async with effectq.run("arefused", store=store):
            await act()

    try:
        with (
            caplog.at_level(logging.INFO, logger="effectq"),
            pytest.raises(effectq.StoreError, match="refused"),
        ):
            asyncio.run(main())
        assert heartbeat.pending()[1] == 0
    finally:
        store.close()
    assert not [r.getMessage() for r in caplog.records if r.name == "effectq.repair"]


def _forked(child: Callable[[], bool]) -> int:
    """Run ``child`` in a forked child; its exit code (0: it returned True), or -9 if it hung."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if child() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9


@contextlib.contextmanager
def _held(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread for as long as the block runs."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


def _lanes_lock() -> Any:
    from effectq.store.redis.wire import sync as lane

    return lane._lanes_lock  # held while a store's lane registers itself


def _ordinals_lock() -> Any:
    from effectq import runs

    return runs._ordinals  # held while a run numbers a call (every run's counts share it)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("lock", [_lanes_lock, _ordinals_lock], ids=["making a store", "numbering a call"])
def test_a_child_forked_while_another_thread_holds_a_lock_runs_effects(
    redis_url: str, namespace: str, lock: Callable[[], Any]
) -> None:
    """A prefork worker forks its children whenever it likes: one forked while another thread of
    the parent was making a store, or numbering a call in its run, makes stores and runs effects
    (it does not wait forever for a lock held by a thread it does not have)."""

    @effectq.effect(name="edge.fork.lane")
    def act(n: int) -> int:
        return n

    def child() -> bool:
        store = effectq.RedisStore.from_url(redis_url, namespace=namespace)
        with effectq.run(f"fork-{uuid.uuid4().hex[:8]}", store=store):
            return act(3) == 3

    with _held(lock()):
        assert _forked(child) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_another_thread_subscribes_can_wait_on_records(
    redis_store: effectq.RedisStore,
) -> None:
    """Forked while another thread held the notification listener's lock (it does while it
    subscribes, a round trip): the child watches records of the store it inherited."""

    def child() -> bool:
        unsubscribe = redis_store.watch("some-key", lambda: None)
        unsubscribe()
        return True

    with _held(redis_store._notifier._lock):
        assert _forked(child) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_inside_a_running_loop_ends_that_loop_cleanly(redis_url: str, namespace: str) -> None:
    """A coroutine forks (os.fork, or a library that does): the child goes on in its copy of the
    loop, whose idle connections are its parent's sockets. When that loop ends, effectq leaves
    them alone, and says nothing: closing its connection stacks raises nothing into the loop."""

    @effectq.effect(name="edge.fork.loop")
    async def act(n: int) -> int:
        return n

    async def main() -> int:
        loop = asyncio.get_running_loop()
        store = effectq.RedisStore.from_url(redis_url, namespace=namespace)
        with effectq.run(f"fork-{uuid.uuid4().hex[:8]}", store=store):
            assert await act(5) == 5  # the loop now holds this lane's idle connection
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, until its loop ends below
            loop.set_exception_handler(lambda _, context: os._exit(3))
            return 0
        return pid

    parent = os.getpid()
    try:
        pid = asyncio.run(main())
    except BaseException:
        if os.getpid() != parent:  # pragma: no cover
            os._exit(4)
        raise
    if pid == 0:  # pragma: no cover - the child's loop ended without trouble
        os._exit(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
