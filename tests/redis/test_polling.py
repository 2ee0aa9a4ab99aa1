"""``RedisStore(poll_replies=...)``: replies waited for by polling the socket, then asleep.

Polling only decides when the read starts: every outcome is the same as a store's that sleeps
in the read at once, whether the reply comes within the budget or after it.
"""

from __future__ import annotations

import socket
import threading
from datetime import timedelta
from typing import Any

import pytest
import redis

import effectq
from effectq.store.redis.wire import polling
from tests.support.pauses import until_held, writes_paused


@pytest.mark.parametrize("bad", [-1, 0.5, timedelta(seconds=1), "0.001", float("nan"), True])
def test_poll_replies_takes_a_short_duration_or_nothing(bad: Any) -> None:
    with pytest.raises(effectq.ConfigurationError, match="poll_replies"):
        effectq.RedisStore(redis.Redis(port=1), poll_replies=bad)  # refused before any connection


@pytest.mark.parametrize("budget", [1e-6, 0.01], ids=["spent before each reply", "reply within it"])
def test_a_polling_store_records_and_replays_as_a_sleeping_one(
    redis_client: redis.Redis, namespace: str, budget: float
) -> None:
    calls: list[int] = []

    @effectq.effect(name="polling.send")
    def send(i: int) -> int:
        calls.append(i)
        return i * 10

    store = effectq.RedisStore(redis_client, namespace=namespace, poll_replies=budget)
    with effectq.run("alone", store=store):
        assert send(1) == 10  # the run's end reads the completion's reply
    with effectq.run("several", store=store):  # each claim reads the completion before it
        assert [send(2), send(3), send(4)] == [20, 30, 40]
    store.close()

    again = effectq.RedisStore(redis_client, namespace=namespace, poll_replies=budget)
    for run_id, inputs in (("alone", [1]), ("several", [2, 3, 4])):
        with effectq.run(run_id, store=again) as bound:
            assert [send(i) for i in inputs] == [i * 10 for i in inputs]
        assert (bound.stats.replayed, bound.stats.executed) == (len(inputs), 0)
    again.close()
    assert calls == [1, 2, 3, 4]


def test_a_reply_later_than_the_budget_is_read_asleep(private_redis_url: str, namespace: str) -> None:
    """Writes paused in Redis well past the budget: the claim polls 10 ms, then waits in the read
    until the pause ends, and the effect applies once."""
    admin = redis.Redis.from_url(private_redis_url)
    client = redis.Redis.from_url(private_redis_url)
    store = effectq.RedisStore(client, namespace=namespace, poll_replies=0.01)
    calls: list[str] = []

    @effectq.effect(name="polling.late")
    def late(x: str) -> str:
        calls.append(x)
        return x.upper()

    got: list[str] = []

    def task() -> None:
        with effectq.run("late", store=store):
            got.append(late("a"))

    with writes_paused(admin):
        worker = threading.Thread(target=task)
        worker.start()
        until_held(admin)  # the claim waits in Redis: the budget runs out while it does
        assert worker.is_alive() and not calls
    worker.join(30)
    assert (got, calls) == (["A"], ["a"])
    store.close()
    client.close()
    admin.close()


class _Wrapped(socket.socket):
    """A socket class of its own, as a library's wrapper makes one."""


def test_only_a_standard_library_socket_is_polled(monkeypatch: pytest.MonkeyPatch) -> None:
    polled: list[Any] = []
    real = polling._poll
    assert real is not None

    def recording() -> Any:
        poller = real()
        polled.append(poller)
        return poller

    monkeypatch.setattr(polling, "_poll", recording)
    left, right = socket.socketpair()
    with left, right:
        right.sendall(b"+OK\r\n")
        polling.await_readable(left, 0.01)  # readable at once
        assert len(polled) == 1
        wrapped = _Wrapped(fileno=left.detach())
        with wrapped:
            polling.await_readable(wrapped, 0.01)
    gevent_socket = pytest.importorskip("gevent.socket")
    one, other = gevent_socket.socketpair()
    with one, other:
        other.sendall(b"+OK\r\n")
        polling.await_readable(one, 0.01)
    assert len(polled) == 1, "a socket of another class was polled"


def test_poll_replies_is_refused_where_the_scripts_go_through_redis_py(redis_client: redis.Redis) -> None:
    """Only effectq's own wire polls: a budget it would silently ignore is an error, not a no-op."""
    with pytest.raises(effectq.ConfigurationError, match="poll_replies"):
        effectq.RedisStore(redis_client, via_execute_command=True, poll_replies=0.0002)
    effectq.RedisStore(redis_client, via_execute_command=True, poll_replies=0).close()  # nothing asked
