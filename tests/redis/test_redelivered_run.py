"""A redelivered run on real Redis: what its first replay's reply carries, and its round trips.

Round trips are counted at the client, as the requests its connections write (effectq's lane
writes its scripts through the same method); the server's counters would count the commands
a script runs too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection

import effectq
from effectq.store.base import ClaimKind, ClaimRequest


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


def _send(calls: list[int]) -> Any:
    @effectq.effect(name="mail.send")
    def send(to: int) -> dict[str, int]:
        calls.append(to)
        return {"sent": to}

    return send


@pytest.mark.parametrize("effects", [1, 3])
def test_a_redelivered_run_resumes_in_as_few_round_trips(
    redis_client: redis.Redis,
    redis_store: effectq.RedisStore,
    namespace: str,
    sent: list[bytes],
    effects: int,
) -> None:
    """One effect: its replay's claim alone. More: that claim brings the run's index, one MGET the rest."""
    calls: list[int] = []
    send = _send(calls)
    for order in ("order-0", "order-1"):
        with effectq.run(order, store=redis_store):
            assert [send(i) for i in range(effects)] == [{"sent": i} for i in range(effects)]
    worker = effectq.RedisStore(redis_client, namespace=namespace)  # a worker the task was redelivered to
    try:
        with effectq.run("order-0", store=worker):  # its connections made by an earlier task
            for i in range(effects):
                send(i)
        sent.clear()
        with effectq.run("order-1", store=worker) as again:
            assert [send(i) for i in range(effects)] == [{"sent": i} for i in range(effects)]
        assert again.stats.replayed == effects and calls == list(range(effects)) * 2
        assert [request.split(b"\r\n")[2] for request in sent] == [b"EVALSHA", b"MGET"][: min(effects, 2)]
    finally:
        worker.close()


def test_a_replay_brings_the_run_index_only_when_it_lists_other_records(
    redis_store: effectq.RedisStore,
) -> None:
    """A run whose index lists only the record replayed has nothing to prefetch: its claim's reply
    is the record alone, and the engine makes no prefetch of it."""
    send = _send([])
    with effectq.run("alone", store=redis_store):
        send(1)
    with effectq.run("pair", store=redis_store):
        send(1)
        send(2)
    for run, listed in (("alone", False), ("pair", True)):
        with effectq.run(run, store=redis_store):
            key = send.key(1)
        request = ClaimRequest(lease_ms=60_000, owner=f"t:{run}", name="mail.send", run_id=run, prefetch=True)
        claim = redis_store.claim(key, request)
        assert claim.kind is ClaimKind.COMPLETED
        assert (claim.prefetch_hint is not None) is listed, run
    with effectq.run("alone", store=redis_store) as again:
        assert send(1) == {"sent": 1}
    assert again.stats.replayed == 1 and again.prefetched is None
