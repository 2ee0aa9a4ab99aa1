"""Redis Sentinel: the URL, and effects that follow a failover, with and without waiting for replicas.

The failover tests run a primary, a replica and three sentinels of their own
(tests/support/servers.py: free loopback ports, stopped by pid); the store is built with
``RedisStore.from_url("redis+sentinel://...")``, and the primary is SIGKILLed
while effects run. Figures are printed (``pytest -s``): how long the failover
took as the effects saw it, how many calls raised ``StoreError`` meanwhile, how
many acknowledged records the new primary lost.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection

import effectq
from effectq import events
from effectq.errors import ConfigurationError
from effectq.store.base import ClaimKind, ClaimRequest
from effectq.store.redis.sentinel import SentinelLane, split_sentinel_url
from tests.support.probes import stored_status
from tests.support.servers import HOST, SERVICE, SentinelGroup, Server, sentinel_group, wait_until

FAILOVER = 60.0
"""How long a test waits for Sentinel to promote the replica (it takes a few seconds)."""


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with sentinel_group() as made:
        yield made


@pytest.fixture
def held() -> Iterator[SentinelGroup]:
    """A group whose replica replicates through a relay the test can hold (see sentinel_group)."""
    with sentinel_group(relay=True, failover_timeout_ms=120_000) as made:
        yield made


@pytest.fixture
def stores() -> Iterator[Callable[..., effectq.RedisStore]]:
    """``RedisStore.from_url``, each store closed after the test (before its servers stop)."""
    made: list[effectq.RedisStore] = []

    def make(url: str, **kwargs: Any) -> effectq.RedisStore:
        made.append(effectq.RedisStore.from_url(url, **kwargs))
        return made[-1]

    yield make
    for store in made:
        store.close()


# -- the URL -----------------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_db() -> None:
    """Sentinels default to port 26379; credentials, db and options stay the data nodes'."""
    sentinels, service, data = split_sentinel_url("rediss+sentinel://u:p%40ss@h1:7000,[::1],h3/shop/2?a=b")
    assert sentinels == [("h1", 7000), ("::1", 26379), ("h3", 26379)]
    assert service == "shop"
    assert data == "rediss://u:p%40ss@h1:7000/2?a=b"
    assert split_sentinel_url("redis+sentinel://h1/shop")[2] == "redis://h1"
    with pytest.raises(ConfigurationError):
        split_sentinel_url("redis://h1/shop")
    for bad in (
        "redis+sentinel:///shop",
        "redis+sentinel://h1",
        "redis+sentinel://h1/shop/zero",
        "redis+sentinel://h1/shop/0/more",
        "redis+sentinel://h1:port/shop",
        "redis+sentinel://h1/shop?db=zero",
    ):
        with pytest.raises(ConfigurationError):
            effectq.RedisStore.from_url(bad)


def test_from_url_gives_the_data_nodes_and_the_sentinels_their_own_options() -> None:
    """The URL's credentials go to the primary, sentinel_password to the sentinels; timeouts to both.

    Nothing connects until the first call: the options are read off the client.
    """
    url = "rediss+sentinel://ada:s3cret@127.0.0.1:1,127.0.0.1:2/shop/3?sentinel_password=watch&ssl_cert_reqs=none"
    store = effectq.RedisStore.from_url(url, namespace="n")
    pool = store.client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert (pool.service_name, pool.connection_class) == ("shop", SentinelManagedSSLConnection)
    data = pool.connection_kwargs
    assert (data["username"], data["password"], data["db"]) == ("ada", "s3cret", 3)
    assert (data["socket_timeout"], data["socket_connect_timeout"]) == (5.0, 5.0)
    watchers = [s.connection_pool for s in pool.sentinel_manager.sentinels]
    assert [(w.connection_kwargs["host"], w.connection_kwargs["port"]) for w in watchers] == [
        ("127.0.0.1", 1),
        ("127.0.0.1", 2),
    ]
    for watcher in watchers:
        kwargs = watcher.connection_kwargs
        assert (kwargs.get("username"), kwargs["password"]) == (None, "watch")
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (5.0, 5.0)
        assert issubclass(watcher.connection_class, redis.SSLConnection)
        assert kwargs["ssl_cert_reqs"] == "none"
    assert isinstance(store._lane, SentinelLane)  # the scripts go on the lane, as on one Redis
    plain = effectq.RedisStore.from_url(
        "redis+sentinel://127.0.0.1:1/shop", sentinel_password="watch", socket_timeout=2
    )
    watcher = plain.client.connection_pool.sentinel_manager.sentinels[0].connection_pool
    assert watcher.connection_kwargs["password"] == "watch"
    assert watcher.connection_kwargs["socket_timeout"] == 2
    assert "password" not in plain.client.connection_pool.connection_kwargs


# -- failover -----------------------------------------------------------------------------


@dataclass
class Call:
    index: int
    started: float
    ended: float
    outcome: str
    """"ok", or the exception's type name."""


@dataclass
class Loop:
    """Effects called one after another in a thread, each an order of its own (its own run and key),
    until stopped; a call that fails is counted and the loop goes on to the next order."""

    store: effectq.RedisStore
    calls: list[Call] = field(default_factory=list)
    applied: Counter[int] = field(default_factory=Counter)
    """How many times the function ran, per order."""
    recorded: set[str] = field(default_factory=set)
    """Effect keys whose completion the store acknowledged (a completed event without error)."""
    errors: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        @effectq.effect(name="order.ship")
        def ship(order: int) -> str:
            self.applied[order] += 1
            return f"shipped {order}"

        self.ship = ship
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Loop:
        self._unsubscribe = events.subscribe(self._on_event)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self._unsubscribe()

    def _on_event(self, event: events.Event) -> None:
        if event.kind is events.EventKind.COMPLETED and not event.error:
            self.recorded.add(event.key)

    def _run(self) -> None:
        order = 0
        while not self._stop.is_set():
            order += 1
            started = time.monotonic()
            try:
                with effectq.run(f"order-{order}", store=self.store):
                    assert self.ship(order) == f"shipped {order}"
                outcome = "ok"
            except (effectq.StoreError, effectq.CompletionNotReplicatedError) as exc:
                outcome = type(exc).__name__
                self.errors[f"{type(exc).__name__}: {str(exc).split(': ', 1)[-1][:60]}"] += 1
            except Exception as exc:  # anything else is a failure of the test: recorded as such
                outcome = f"unexpected {type(exc).__name__}: {exc}"
            self.calls.append(Call(order, started, time.monotonic(), outcome))
            if outcome != "ok":
                time.sleep(0.05)  # as a worker would back off

    def ok_since(self, moment: float) -> list[Call]:
        return [c for c in self.calls if c.outcome == "ok" and c.started > moment]

    def key(self, order: int) -> str:
        with effectq.run(f"order-{order}", store=self.store):
            return self.ship.key(order)

    def replay(self, order: int) -> str:
        with effectq.run(f"order-{order}", store=self.store):
            return self.ship(order)


def _kill_and_follow(group: SentinelGroup, loop: Loop, ok_before: int = 200) -> tuple[float, float]:
    """Let the loop run ``ok_before`` calls, SIGKILL the primary, wait until the sentinels name
    the replica; returns (when the primary died, when the sentinels had switched)."""
    wait_until(lambda: len(loop.ok_since(0)) >= ok_before, f"{ok_before} calls on the first primary")
    killed = time.monotonic()
    group.pair.primary.kill()
    wait_until(lambda: group.primary_ports() == {group.pair.replica.port}, "the failover", timeout=FAILOVER)
    return killed, time.monotonic()


def _during(loop: Loop, killed: float, resumed: float) -> Counter[str]:
    return Counter(c.outcome for c in loop.calls if c.ended >= killed and c.started < resumed)


def _longest_failure(loop: Loop) -> float:
    return max((c.ended - c.started for c in loop.calls if c.outcome != "ok"), default=0.0)


def _replay_all(loop: Loop, orders: list[int]) -> list[int]:
    """Call each order's effect again, as a redelivery would: the orders whose function ran again."""
    again = []
    for order in orders:
        ran = loop.applied[order]
        assert loop.replay(order) == f"shipped {order}"  # the recorded result, or a second run's
        if loop.applied[order] > ran:
            again.append(order)
    return again


@pytest.mark.slow
def test_effects_follow_a_failover_to_the_new_primary(
    group: SentinelGroup, namespace: str, stores: Callable[..., effectq.RedisStore]
) -> None:
    """The primary dies mid-run: calls fail with StoreError (never hang, never another error) until
    Sentinel promotes the replica, then go on there, async effects too. Without wait_replicas, a
    completion that only the dead primary had is lost (its order would run again); the others
    replay their recorded results."""
    store = stores(group.url, namespace=namespace)
    with Loop(store) as loop:
        killed, switched = _kill_and_follow(group, loop)
        wait_until(lambda: len(loop.ok_since(killed)) >= 50, "calls on the new primary", timeout=FAILOVER)
    resumed = loop.ok_since(killed)[0].started
    during = _during(loop, killed, resumed)
    assert set(during) <= {"ok", "StoreError"}, during  # ok: calls that had all but ended at the kill
    assert all(c.outcome in ("ok", "StoreError") for c in loop.calls), Counter(c.outcome for c in loop.calls)
    last = loop.ok_since(killed)[-1].index
    assert stored_status(group.pair.replica.client(), store.record_key(loop.key(last))) == "c"

    @effectq.effect(name="order.ship_later")
    async def ship_later(order: int) -> str:
        return f"shipped {order} later"

    async def from_a_loop() -> str:
        with effectq.run("order-async", store=store):
            return await ship_later(1)

    assert asyncio.run(from_a_loop()) == "shipped 1 later"

    acknowledged = [c.index for c in loop.calls if c.ended < killed and loop.key(c.index) in loop.recorded]
    assert len(acknowledged) >= 200
    lost = _replay_all(loop, acknowledged)
    print(
        f"\nno wait: the sentinels agreed on the new primary {switched - killed:.2f}s after the kill, "
        f"the effects resumed after {resumed - killed:.2f}s; {during['StoreError']} calls raised "
        f"StoreError meanwhile ({dict(loop.errors)}; the longest took {_longest_failure(loop):.2f}s); "
        f"{len(lost)} of {len(acknowledged)} acknowledged "
        f"completions lost (their orders ran again: {lost})"
    )


@pytest.mark.slow
def test_with_wait_replicas_a_completion_the_replica_acknowledged_survives_the_failover(
    group: SentinelGroup, namespace: str, stores: Callable[..., effectq.RedisStore]
) -> None:
    """With wait_replicas=1, every completion acknowledged before the kill replays after the failover
    with its recorded result, never re-running. The promoted replica has no replica of its own:
    claims are refused (ClaimNotReplicatedError, nothing runs) until one joins it. While the one
    that joins settles in (a loaded machine, a resync), a claim it acknowledged may be followed by
    a completion it did not: that caller is told so (CompletionNotReplicatedError: applied, the
    record may be lost), never a plain success, and its effect ran once."""
    store = stores(group.url, namespace=namespace, wait_replicas=1, replica_timeout=0.3)
    with Loop(store) as loop:
        killed, switched = _kill_and_follow(group, loop)
        wait_until(
            lambda: any(c.outcome == "ClaimNotReplicatedError" for c in loop.calls),
            "claims refused for want of a replica",
        )
        joined = time.monotonic()
        group.add_replica(group.pair.replica)
        wait_until(lambda: len(loop.ok_since(joined)) >= 50, "calls on the new primary", timeout=FAILOVER)
    resumed = loop.ok_since(killed)[0].started
    during = _during(loop, killed, resumed)
    assert set(during) <= {"ok", "StoreError", "ClaimNotReplicatedError", "CompletionNotReplicatedError"}, (
        during
    )
    refused = [c.index for c in loop.calls if c.outcome == "ClaimNotReplicatedError"]
    assert refused and all(loop.applied[i] == 0 for i in refused)
    unreplicated = [c.index for c in loop.calls if c.outcome == "CompletionNotReplicatedError"]
    assert all(loop.applied[i] == 1 for i in unreplicated)
    assert not [c.outcome for c in loop.calls if c.outcome.startswith("unexpected")]

    acknowledged = [c.index for c in loop.calls if c.ended < killed and loop.key(c.index) in loop.recorded]
    assert len(acknowledged) >= 200
    assert _replay_all(loop, acknowledged) == []  # every one replayed, none ran again
    print(
        f"\nwait_replicas=1: the sentinels agreed on the new primary {switched - killed:.2f}s after "
        f"the kill; the effects resumed {resumed - joined:.2f}s after a replica joined the new primary "
        f"({resumed - killed:.2f}s after the kill); calls meanwhile: {dict(during)} ({dict(loop.errors)}); "
        f"0 of {len(acknowledged)} acknowledged completions lost"
    )


@pytest.mark.slow
def test_without_wait_replicas_a_completion_only_the_dead_primary_had_comes_back_absent(
    held: SentinelGroup, namespace: str, stores: Callable[..., effectq.RedisStore]
) -> None:
    """The replica falls behind (its link held), an effect completes on the primary alone, the primary
    dies: the promoted replica has no record of it, and the next call runs the effect again. With
    wait_replicas=1 the claim is refused before the function runs instead."""
    plain = stores(held.url, namespace=namespace)
    waiting = stores(held.url, namespace=namespace, wait_replicas=1, replica_timeout=0.3)
    applied: list[str] = []

    @effectq.effect(name="email.send")
    def send(to: str) -> str:
        applied.append(to)
        return f"sent to {to}"

    held.pair.hold()
    with effectq.run("r1", store=plain):
        assert send("ada") == "sent to ada"
        key = send.key("ada")
    assert plain.get(key) is not None  # acknowledged by the primary
    with effectq.run("r2", store=waiting), pytest.raises(effectq.ClaimNotReplicatedError):
        send("bob")
    held.pair.primary.kill()
    wait_until(lambda: held.primary_ports() == {held.pair.replica.port}, "the failover", timeout=FAILOVER)
    wait_until(lambda: _answers(plain), "the store to reach the new primary", timeout=FAILOVER)
    assert plain.get(key) is None
    with effectq.run("r1", store=plain):
        assert send("ada") == "sent to ada"
    assert applied == ["ada", "ada"]  # bob never ran


def _answers(store: effectq.RedisStore) -> bool:
    try:
        store.get("probe")
    except effectq.StoreError:
        return False
    return True


# -- a connection left on a demoted primary -------------------------------------------------


def _hold_connections(store: effectq.RedisStore, count: int) -> None:
    """Leave ``count`` connections on the store's lane: threads whose posted completions keep one
    each until they all reach the end of their runs together."""
    together = threading.Barrier(count)

    @effectq.effect(name="warm.up")
    def warm(i: int) -> int:
        return i

    def one(i: int) -> None:
        with effectq.run(f"warm-{i}", store=store):
            warm(i)
            together.wait(30)  # the completion is posted: this thread holds its connection

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def _demote_by_hand(group: SentinelGroup) -> tuple[Server, Server]:
    """Swap the roles under the sentinels' feet (as an operator, or a sentinel that had not heard of
    a failover, can leave them): the replica becomes the primary, the primary its replica. Clients
    stay connected to the old primary, which now answers writes with READONLY."""
    old, new = group.pair.primary, group.pair.replica
    new.client().execute_command("REPLICAOF", "NO", "ONE")
    old.client().execute_command("REPLICAOF", HOST, new.port)
    wait_until(lambda: old.client().info("replication")["master_link_status"] == "up", "the demotion")
    return old, new


@pytest.mark.slow
def test_a_connection_on_a_demoted_primary_fails_as_a_store_error_then_the_next_call_finds_the_new_one(
    group: SentinelGroup, namespace: str, stores: Callable[..., effectq.RedisStore]
) -> None:
    """READONLY on the lane is a StoreError (nothing written) and drops every connection the lane
    holds: once the sentinels name the new primary, the very next call goes there."""
    store = stores(group.url, namespace=namespace)
    _hold_connections(store, 3)
    old, new = _demote_by_hand(group)
    request = ClaimRequest(lease_ms=30_000, owner="w")
    with pytest.raises(effectq.StoreError, match="is now a replica"):
        store.claim("k1", request)
    assert stored_status(old.client(), store.record_key("k1")) == ""
    group.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)  # the sentinels follow
    wait_until(lambda: group.primary_ports() == {new.port}, "the sentinels to name the new primary", FAILOVER)
    for key in ("k2", "k3", "k4"):  # each would take one of the connections held above
        assert store.claim(key, request).kind is ClaimKind.CLAIMED
        assert stored_status(new.client(), store.record_key(key)) == "d"


@pytest.mark.slow
def test_once_the_pool_knows_the_new_primary_the_lane_leaves_the_old_one(
    group: SentinelGroup, namespace: str, stores: Callable[..., effectq.RedisStore]
) -> None:
    """After SENTINEL FAILOVER the old primary still takes writes until Sentinel turns it into a
    replica (seconds later), and what it takes then is lost. A lane connection made before the
    failover keeps writing there; as soon as the pool has asked the sentinels again (any new
    connection does), the lane drops its connections to the old primary instead of using them."""
    store = stores(group.url, namespace=namespace)
    old, new = group.pair.primary, group.pair.replica
    request = ClaimRequest(lease_ms=30_000, owner="w")
    _hold_connections(store, 2)
    group.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)
    wait_until(lambda: group.primary_ports() == {new.port}, "the sentinels to name the new primary", FAILOVER)
    if old.client().info("replication")["role"] == "master":  # Sentinel has not demoted it yet
        store.claim("early", request)
        assert stored_status(old.client(), store.record_key("early")) == "d"  # a write bound to be lost
    pool: Any = store.client.connection_pool
    assert pool.get_master_address() == (HOST, new.port)  # what a new connection asks first
    store.claim("k1", request)
    assert stored_status(new.client(), store.record_key("k1")) == "d"
