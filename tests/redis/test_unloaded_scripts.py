"""A completion posted to a Redis that does not hold its script still lands before the effect returns.

A pipelined completion is written before the effect returns and its reply read
later. A Redis whose script cache lacks ``complete.lua`` (a fresh or restarted
server, a replica promoted without it, a flushed cache, a new version's digest)
answers a bare ``EVALSHA`` with NOSCRIPT, and the completion would run only once
that reply was read: a worker killed right after the effect returned would leave
it dispatched. These tests kill such workers and find the record completed. They
run on a redis-server of their own, whose script cache they flush.
"""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import effectq
from effectq.store.redis.scripts import lua
from tests.support.procs import killed_after_first_line
from tests.support.servers import Server


@pytest.fixture
def server(private_redis: Server) -> Server:
    """A redis-server of this module's own: its script cache is the tests' to flush."""
    return private_redis


@pytest.fixture
def url(server: Server) -> str:
    """The server's URL, its script cache empty, as a fresh or restarted Redis's is."""
    server.client().script_flush()
    return f"redis://{server.address}/0"


@pytest.fixture
def stores(url: str) -> Iterator[tuple[effectq.RedisStore, effectq.RedisStore]]:
    """A store on the server, and an onlooker on a client of its own, in a fresh namespace."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    made = [effectq.RedisStore(redis.Redis.from_url(url), namespace=namespace) for _ in range(2)]
    yield made[0], made[1]
    for store in made:
        store.close()
        store.client.close()


_SYNC = """
import sys, time, effectq, redis
store = effectq.RedisStore.from_url({url!r}, namespace={namespace!r})
keys = []

@effectq.effect(name="unloaded.charge")
def charge(cents: int) -> str:
    keys.append(effectq.current_effect().key)
    return f"charged {{cents}}"

if {flush_between!r}:
    with effectq.run("warm-up", store=store):
        charge(100)  # every script loaded, and its connection has sent them
    redis.Redis.from_url({url!r}).script_flush()  # an operator, on a connection of their own
with effectq.run("order-7", store=store):
    charge(500)
    print(keys[-1], store._lane._local.conn is not None, flush=True)
    time.sleep(60)  # killed here: the reply of the completion never read
"""

_ASYNC = """
import asyncio, effectq, redis
from effectq.store.redis.wire.aio import _pending_on
store = effectq.RedisStore.from_url({url!r}, namespace={namespace!r})
keys = []

@effectq.effect(name="unloaded.charge")
async def charge(cents: int) -> str:
    keys.append(effectq.current_effect().key)
    return f"charged {{cents}}"

async def main():
    if {flush_between!r}:
        async with effectq.run("warm-up", store=store):
            await charge(100)  # every script loaded, and its connection has sent them
        redis.Redis.from_url({url!r}).script_flush()  # an operator, on a connection of their own
    async with effectq.run("order-7", store=store):
        await charge(500)
        owing = _pending_on(asyncio.get_running_loop())
        print(keys[-1], bool(owing and owing.get(asyncio.current_task())), flush=True)
        await asyncio.sleep(60)  # killed here: the reply of the completion never read

asyncio.run(main())
"""


def _killed_after_the_effect_returned(program: str) -> str:
    """Run ``program`` in a child, SIGKILL it once it printed the effect's key; the key."""
    key, owed = killed_after_first_line(program).split()
    assert owed == "True"  # it did owe the completion's reply when killed
    return key


@pytest.mark.parametrize("flush_between", [False, True], ids=["empty-cache", "flushed-between-runs"])
@pytest.mark.parametrize("program", [_SYNC, _ASYNC], ids=["sync", "async"])
def test_a_worker_killed_right_after_the_effect_returned_leaves_it_completed(
    url: str, stores: tuple[effectq.RedisStore, effectq.RedisStore], program: str, flush_between: bool
) -> None:
    """The completion's script is not in Redis' cache when it is posted: on a server that never
    ran it, or one an operator flushed since the worker's connection sent it."""
    _, onlooker = stores
    namespace = onlooker.namespace
    source = textwrap.dedent(program).format(url=url, namespace=namespace, flush_between=flush_between)
    record = onlooker.get(_killed_after_the_effect_returned(source))
    assert record is not None and record.status is effectq.Status.COMPLETED


def _loads(client: redis.Redis) -> int:
    """How many ``SCRIPT LOAD`` the server ran since its statistics were reset."""
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_script|load", {}).get("calls", 0))


def test_a_connection_loads_the_completion_s_script_once_not_per_completion(
    stores: tuple[effectq.RedisStore, effectq.RedisStore], server: Server
) -> None:
    """The load rides ahead of the first completion posted on the connection, and of no other."""
    store, onlooker = stores
    keys: list[str] = []

    @effectq.effect(name="unloaded.send")
    def send(n: int) -> int:
        keys.append(effectq.current_effect().key)
        return n

    assert onlooker.get("nothing") is None  # its script loaded: the loads counted are the store's
    server.client().config_resetstat()
    for run in ("first", "second"):
        with effectq.run(run, store=store):
            for n in range(3):
                assert send(n) == n
                record = onlooker.get(keys[-1])  # its reply not read yet: Redis ran it already
                assert record is not None and record.status is effectq.Status.COMPLETED
    # the first claim met NOSCRIPT and loaded its own script; the first completion's rode ahead
    assert _loads(server.client()) == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_connection_opened_again_loads_the_script_ahead_of_its_first_completion(
    stores: tuple[effectq.RedisStore, effectq.RedisStore], server: Server, kind: str
) -> None:
    """Redis restarted (or failed over) under idle connections: its cache is empty, and the
    worker's claim may not meet NOSCRIPT (another worker's claim loaded that script first), yet
    its completion must not either: the connection, opened again, loads it ahead."""
    store, onlooker = stores
    seen: list[bool] = []

    @effectq.effect(name="unloaded.send")
    def send(n: int) -> int:
        return n

    @effectq.effect(name="unloaded.asend")
    async def asend(n: int) -> int:
        return n

    def completed(effect: Any, n: int) -> None:  # its reply not read yet: Redis ran it
        record = onlooker.get(effect.key(n))  # in the run: its key
        seen.append(record is not None and record.status is effectq.Status.COMPLETED)

    def restart() -> None:
        server.client().script_flush()  # the restart, as the cache sees it
        server.client().client_kill_filter(_type="normal")  # and as the connections do
        server.client().script_load(lua("claim"))  # another worker's claim met NOSCRIPT first

    async def in_one_loop() -> None:  # the loop keeps its connections between the runs
        for run, n in (("before", 1), ("after", 2)):
            async with effectq.run(run, store=store):
                assert await asend(n) == n
                completed(asend, n)
            if n == 1:
                restart()

    if kind == "async":
        asyncio.run(in_one_loop())
    else:
        for run, n in (("before", 1), ("after", 2)):
            with effectq.run(run, store=store):
                assert send(n) == n  # the first: every script loaded, noted on the connection
                completed(send, n)
            if n == 1:
                restart()
    assert seen == [True, True]
