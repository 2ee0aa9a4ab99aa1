"""Waiting for replicas, and failover: what a promoted replica knows, with and without the wait.

Each test gets a primary and a replica of its own; the replica replicates through a
relay the test can hold, so it falls behind at an exact point (as over a congested
or partitioned link). A failover is SIGKILL of the primary and REPLICAOF NO ONE on
the replica, what Sentinel does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import effectq
from effectq.store.base import ClaimKind, ClaimRequest, ResultState
from tests.support.probes import stored_status
from tests.support.servers import Pair, primary_with_replica

pytestmark = pytest.mark.slow

TIMEOUT = 0.3
"""How long a store waits for the replica: long on loopback, short for a test."""


@pytest.fixture
def pair() -> Iterator[Pair]:
    with primary_with_replica() as made:
        yield made


def store_on(server: Any, namespace: str, wait_replicas: int = 0) -> effectq.RedisStore:
    return effectq.RedisStore(
        server.client(), namespace=namespace, wait_replicas=wait_replicas, replica_timeout=TIMEOUT
    )


def status_on(server: Any, store: effectq.RedisStore, key: str) -> str:
    """The status letter of a record as one server has it ('' when it has none)."""
    return stored_status(server.client(), store.record_key(key))


def counting(applied: list[str], hook: Callable[[], None] = lambda: None) -> effectq.Effect[[str], str]:
    @effectq.effect(name="email.send", lease=0.5, wait=10)
    def send(to: str) -> str:
        hook()
        applied.append(to)
        return f"sent to {to}"

    return send


def test_a_healthy_replica_has_the_claim_before_the_function_runs(pair: Pair, namespace: str) -> None:
    """With wait_replicas=1 the replica has the claim when the function starts, the record when it returns."""
    store = store_on(pair.primary, namespace, wait_replicas=1)
    seen: list[str] = []
    send = counting([], lambda: seen.append(status_on(pair.replica, store, send.key("ada"))))
    with effectq.run("r1", store=store):
        assert send("ada") == "sent to ada"
        key = send.key("ada")
    assert seen == ["d"]
    assert status_on(pair.replica, store, key) == "c"


def test_a_claim_too_few_replicas_acknowledged_never_runs(pair: Pair, namespace: str) -> None:
    """The replica does not acknowledge the claim: the function is not called and the claim is given back."""
    store = store_on(pair.primary, namespace, wait_replicas=1)
    applied: list[str] = []
    send = counting(applied)
    pair.hold()
    with effectq.run("r1", store=store):
        with pytest.raises(effectq.ClaimNotReplicatedError) as caught:
            send("ada")
        key = send.key("ada")
    assert applied == []
    assert (caught.value.acknowledged, caught.value.required) == (0, 1)
    assert isinstance(caught.value, effectq.StoreError)
    record = store.get(key)
    assert record is not None and record.status is effectq.Status.RELEASED
    assert "replicas" in record.error


def test_a_completion_too_few_replicas_acknowledged_reports_the_result(pair: Pair, namespace: str) -> None:
    """The effect applied but its record is only on the primary: the caller gets the result in the error."""
    store = store_on(pair.primary, namespace, wait_replicas=1)
    applied: list[str] = []
    send = counting(applied, pair.hold)  # the claim is replicated, what follows is not
    with effectq.run("r1", store=store):
        with pytest.raises(effectq.CompletionNotReplicatedError) as caught:
            send("ada")
        key = send.key("ada")
    assert applied == ["ada"]
    assert caught.value.result == "sent to ada"
    assert caught.value.name == "email.send"
    assert not isinstance(caught.value, effectq.StoreError)
    assert status_on(pair.primary, store, key) == "c"
    assert status_on(pair.replica, store, key) == "d"


def test_an_unreplicated_redispatch_of_an_unknown_goes_back_to_unknown(pair: Pair, namespace: str) -> None:
    """A replay-safe re-run of an unknown, refused for want of replicas, leaves it unknown, not released."""
    store = store_on(pair.primary, namespace, wait_replicas=1)
    applied: list[str] = []

    @effectq.effect(name="card.charge", replay_safe=True)
    def charge() -> str:
        applied.append("charged")
        return "charged"

    with effectq.run("r1", store=store):
        key = charge.key()
    earlier = store.claim(key, ClaimRequest(lease_ms=30_000, owner="dead-worker"))
    store.mark_unknown(key, earlier.token, error="TimeoutError: read timed out")
    pair.hold()
    with effectq.run("r1", store=store), pytest.raises(effectq.ClaimNotReplicatedError):
        charge()
    assert applied == []
    record = store.get(key)
    assert record is not None and record.status is effectq.Status.UNKNOWN
    assert "read timed out" in record.error


def test_an_unreplicated_dispatch_after_a_reconcile_never_runs(pair: Pair, namespace: str) -> None:
    """Reconcile found nothing, but the dispatch that follows is not replicated: released, not run."""
    store = store_on(pair.primary, namespace, wait_replicas=1)
    applied: list[str] = []

    def nothing_found(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> None:
        pair.hold()  # the reconcile lease was granted; what follows is not replicated

    @effectq.effect(name="email.send", reconcile=nothing_found, reconcile_on="always")
    def send(to: str) -> str:
        applied.append(to)
        return "sent"

    with effectq.run("r1", store=store):
        with pytest.raises(effectq.ClaimNotReplicatedError):
            send("ada")
        key = send.key("ada")
    assert applied == []
    record = store.get(key)
    assert record is not None and record.status is effectq.Status.RELEASED


def test_a_retry_is_not_mistaken_for_replicated(pair: Pair, namespace: str) -> None:
    """A claim or completion retried after a lost reply waits for the first try's write, not an older one."""
    plain, waiting = store_on(pair.primary, namespace), store_on(pair.primary, namespace, wait_replicas=1)
    request = ClaimRequest(lease_ms=30_000, owner="worker-1")
    pair.hold()
    first = plain.claim("k1", request)  # landed on the primary; its reply, say, was lost
    with pytest.raises(effectq.ClaimNotReplicatedError) as caught:
        waiting.claim("k1", request)  # the retry: same owner, same grant
    assert caught.value.claim.token == first.token
    kwargs: dict[str, Any] = {"result": b"1", "result_state": ResultState.STORED, "retention_ms": 60_000}
    assert plain.complete("k1", first.token, **kwargs)
    with pytest.raises(effectq.CompletionNotReplicatedError):
        waiting.complete("k1", first.token, **kwargs)


def test_a_replay_is_not_refused_for_lagging_replicas(pair: Pair, namespace: str) -> None:
    """Only a claim that runs the function must be replicated: a replay answers though the replica lags."""
    store = store_on(pair.primary, namespace, wait_replicas=1)
    claim = store.claim("k1", ClaimRequest(lease_ms=30_000, owner="w"))
    pair.hold()
    with pytest.raises(effectq.CompletionNotReplicatedError):
        store.complete("k1", claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=60_000)
    replay = store.claim("k1", ClaimRequest(lease_ms=30_000, owner="x"))  # WAIT answers 0 after the timeout
    assert replay.kind is ClaimKind.COMPLETED
    assert replay.result == b"1"


# -- failover ----------------------------------------------------------------------------


def test_failover_without_waiting_can_repeat_an_effect(pair: Pair, namespace: str) -> None:
    """The honest baseline: the primary dies before replicating the claim; the promoted replica never saw it.

    Asynchronous replication acknowledges a write before any replica has it, so the
    retry on the new primary finds no record and applies the effect a second time.
    This is the repeat that wait_replicas exists to prevent.
    """
    applied: list[str] = []
    send = counting(applied)
    pair.hold()
    with effectq.run("r1", store=store_on(pair.primary, namespace)):
        assert send("ada") == "sent to ada"
    pair.fail_over()
    with effectq.run("r1", store=store_on(pair.replica, namespace)):
        assert send("ada") == "sent to ada"
    assert applied == ["ada", "ada"]


def test_failover_with_waiting_never_repeats_an_effect(pair: Pair, namespace: str) -> None:
    """Same failure with wait_replicas=1: the unreplicated claim never ran, so the retry applies it once."""
    applied: list[str] = []
    send = counting(applied)
    pair.hold()
    primary = store_on(pair.primary, namespace, wait_replicas=1)
    with effectq.run("r1", store=primary), pytest.raises(effectq.ClaimNotReplicatedError):
        send("ada")
    pair.fail_over()
    promoted = store_on(pair.replica, namespace)  # it has no replica of its own in this test
    with effectq.run("r1", store=promoted):
        assert send("ada") == "sent to ada"
        assert send("ada") == "sent to ada"
    assert applied == ["ada"]


def test_failover_after_an_unreplicated_completion_is_unknown_not_a_repeat(
    pair: Pair, namespace: str
) -> None:
    """The claim replicated, the completion did not: after promotion the record is in doubt, never re-run."""
    applied: list[str] = []
    send = counting(applied, pair.hold)
    primary = store_on(pair.primary, namespace, wait_replicas=1)
    with effectq.run("r1", store=primary), pytest.raises(effectq.CompletionNotReplicatedError):
        send("ada")
    pair.fail_over()
    promoted = store_on(pair.replica, namespace)
    with effectq.run("r1", store=promoted), pytest.raises(effectq.OutcomeUnknown, match="lease expired"):
        send("ada")
    assert applied == ["ada"]


def test_wait_options_are_checked_when_the_store_is_built() -> None:
    """A negative count, or a wait the socket would give up on first, is refused up front."""
    with pytest.raises(effectq.ConfigurationError, match="wait_replicas"):
        effectq.RedisStore.from_url("redis://127.0.0.1:1/0", wait_replicas=-1)
    with pytest.raises(effectq.ConfigurationError, match="socket_timeout"):
        effectq.RedisStore.from_url("redis://127.0.0.1:1/0", wait_replicas=1, replica_timeout=5)
    store = effectq.RedisStore.from_url("redis://127.0.0.1:1/0", wait_replicas=2, replica_timeout=0.25)
    assert store.wait_replicas == 2


def test_the_wait_goes_out_with_the_script_in_one_write(pair: Pair, namespace: str) -> None:
    """On the store's lane, EVALSHA and WAIT are one write and two replies, also after a SCRIPT FLUSH."""
    from effectq.store.redis.wire.sync import Lane

    store = store_on(pair.primary, namespace, wait_replicas=1)
    assert store._lane is not None
    frames: list[bytes] = []
    write = Lane._write

    def recording(lane: Lane, conn: Any, frame: bytes) -> None:
        frames.append(frame)
        write(lane, conn, frame)

    applied: list[str] = []
    act = counting(applied)
    with effectq.run("warm", store=store):
        act("warm@example.com")  # the scripts loaded on this new server
    Lane._write = recording  # type: ignore[method-assign]
    try:
        with effectq.run("one-write", store=store):
            assert act("a@example.com") == "sent to a@example.com"
            pair.primary.client().script_flush()
            assert act("b@example.com") == "sent to b@example.com"
    finally:
        Lane._write = write  # type: ignore[method-assign]

    def pair_of(frame: bytes) -> bool:
        return frame.count(b"\r\nEVALSHA\r\n") == 1 and frame.endswith(
            b"$4\r\nWAIT\r\n$1\r\n1\r\n$3\r\n300\r\n"
        )

    assert pair_of(frames[0]) and pair_of(frames[1])  # claim, complete: one write each
    loads = [i for i, frame in enumerate(frames) if b"\r\nSCRIPT\r\n$4\r\nLOAD\r\n" in frame]
    assert loads and all(pair_of(frames[i + 1]) for i in loads)  # the flush: loaded, the pair sent again
    assert applied == ["warm@example.com", "a@example.com", "b@example.com"]


def test_a_client_without_the_lane_waits_through_a_pipeline(pair: Pair, namespace: str) -> None:
    """A redis.Redis subclass keeps redis-py's path: the same wait, pipelined by redis-py."""
    import redis

    class Custom(redis.Redis):
        pass

    store = effectq.RedisStore(
        Custom(port=pair.primary.port), namespace=namespace, wait_replicas=1, replica_timeout=TIMEOUT
    )
    assert store._lane is None
    applied: list[str] = []
    act = counting(applied)
    with effectq.run("pipelined", store=store):
        assert act("c@example.com") == "sent to c@example.com"
    pair.hold()
    with effectq.run("pipelined-2", store=store), pytest.raises(effectq.ClaimNotReplicatedError):
        act("d@example.com")
    assert applied == ["c@example.com"]
