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

import logging
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
from effectq.heartbeat import heartbeat

from . import servers


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
