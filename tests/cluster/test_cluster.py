"""Redis Cluster: the store contract, processes racing, and slots migrating under running effects.

One cluster (3 primaries, 3 replicas on free loopback ports) serves the whole
session; every test works in its own namespace and deletes its keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

import effectq
from effectq.cli import Exit, main
from effectq.doctor import Level, diagnose
from effectq.errors import ConfigurationError
from effectq.store.base import ClaimKind, ClaimRequest, ResultState, Status
from effectq.store.redis.cluster import check_cluster, seed_nodes
from effectq.testing import OperatorStoreContract, StoreContract
from tests.conftest import delete_namespace
from tests.support.probes import ROOT, applications, read_line, stored_status
from tests.support.servers import Cluster, free_port, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster_client(redis_cluster: Cluster) -> Iterator[RedisCluster]:
    client = redis_cluster.client()
    yield client
    client.close()


@pytest.fixture
def cluster_store(cluster_client: RedisCluster, namespace: str) -> Iterator[effectq.RedisStore]:
    store = effectq.RedisStore(cluster_client, namespace=namespace)
    yield store
    store.close()
    delete_namespace(cluster_client, namespace)


class TestClusterStore(StoreContract, OperatorStoreContract):
    @pytest.fixture
    def store_factory(self, cluster_client: RedisCluster) -> Iterator[Callable[[str], effectq.Store]]:
        made: list[effectq.RedisStore] = []

        def make(namespace: str) -> effectq.Store:
            made.append(effectq.RedisStore(cluster_client, namespace=namespace))
            return made[-1]

        yield make
        for store in made:
            store.close()
            delete_namespace(cluster_client, store.namespace)


# -- building a store for a cluster --------------------------------------------------------


def test_cluster_url_names_every_seed() -> None:
    """A redis+cluster:// URL keeps credentials and options, and lists every seed node."""
    first, seeds = seed_nodes("rediss+cluster://u:p%40ss@h1:7000,[::1]:7001,h3?ssl_cert_reqs=none")
    assert first == "rediss://u:p%40ss@h1:7000?ssl_cert_reqs=none"
    assert seeds == [("h1", 7000), ("::1", 7001), ("h3", 6379)]
    for bad in ("redis://h1:7000", "redis+cluster://", "redis+cluster://h1:port"):
        with pytest.raises(ConfigurationError):
            seed_nodes(bad)


def test_from_url_builds_a_cluster_store(redis_cluster: Cluster, namespace: str) -> None:
    """from_url with seed nodes gives a clustered store on which effects apply once."""
    store = effectq.RedisStore.from_url(redis_cluster.url, namespace=namespace)
    calls: list[int] = []

    @effectq.effect(name="cluster.url")
    def act(n: int) -> int:
        calls.append(n)
        return n * 2

    try:
        assert store.clustered
        with effectq.run("r1", store=store):
            assert [act(n) for n in range(20)] == [act(n) for n in range(20)]
        assert calls == list(range(20))
    finally:
        store.close()
        delete_namespace(store.client, namespace)  # type: ignore[arg-type]


class _Versions:
    """Stands in for a cluster client whose nodes report the given versions."""

    ALL_NODES = "all"

    def __init__(self, *versions: str) -> None:
        self.versions = versions

    def info(self, section: str, target_nodes: str) -> dict[str, dict[str, str]]:
        return {f"n{i}": {"redis_version": v} for i, v in enumerate(self.versions)}


def test_cluster_older_than_7_is_refused() -> None:
    """A node without sharded pub/sub is refused when the store is built, not in the middle of an effect."""
    check_cluster(_Versions("7.0.15", "7.2.4"))
    with pytest.raises(ConfigurationError, match=r"n1 runs 6\.2\.14"):
        check_cluster(_Versions("7.0.15", "6.2.14"))


def test_waiting_for_replicas_on_a_cluster(redis_cluster: Cluster, namespace: str) -> None:
    """With wait_replicas=1, each record is on its slot's replica by the time the call returns.

    Forty runs: a run's default-keyed records share its bucket, and forty buckets
    land on every primary (all but certainly: each misses one with odds (2/3)**40).
    """
    store = effectq.RedisStore.from_url(redis_cluster.url, namespace=namespace, wait_replicas=1)

    @effectq.effect(name="cluster.replicated")
    def act(n: int) -> int:
        return n

    try:
        keys = []
        for n in range(40):
            with effectq.run(f"r{n}", store=store):
                keys.append(act.key(n))
                assert act(n) == n
        replicas = set()
        for key in keys:
            record_key = store.record_key(key)
            replica = redis_cluster.replica_of(key_slot(record_key.encode()))
            replicas.add(replica.port)
            reader = redis.Redis(port=replica.port, single_connection_client=True)
            reader.execute_command("READONLY")
            assert stored_status(reader, record_key) == "c", key
            reader.close()
        assert len(replicas) == 3
    finally:
        store.close()
        delete_namespace(store.client, namespace)  # type: ignore[arg-type]


def test_a_redelivered_run_on_a_cluster_replays_from_its_first_claim(
    cluster_store: effectq.RedisStore, cluster_client: RedisCluster, namespace: str
) -> None:
    """The replay's claim reads the run's other records in its own slot: on Cluster too the
    redelivered run gets them from that one reply, with or without replicas to wait for."""
    calls: list[int] = []

    @effectq.effect(name="cluster.step")
    def step(n: int) -> int:
        calls.append(n)
        return n

    with effectq.run("order", store=cluster_store):
        assert [step(n) for n in range(5)] == list(range(5))
    for wait_replicas in (0, 1):
        worker = effectq.RedisStore(cluster_client, namespace=namespace, wait_replicas=wait_replicas)
        try:
            with effectq.run("order", store=worker) as again:
                assert [step(n) for n in range(5)] == list(range(5))
                assert again.prefetched is not None and len(again.prefetched) == 4
            assert again.stats.replayed == 5 and again.stats.executed == 0
        finally:
            worker.close()
    assert calls == list(range(5))


def unknowns(store: effectq.RedisStore, count: int) -> list[str]:
    """``count`` keys of their own (so their own buckets), each claimed then marked unknown."""
    keys = [f"r:{n}" for n in range(count)]
    for key in keys:
        claim = store.claim(key, ClaimRequest(lease_ms=30_000, owner="o"))
        store.mark_unknown(key, claim.token, error="TimeoutError")
    return keys


def test_listing_after_the_scripts_were_flushed(
    cluster_store: effectq.RedisStore, redis_cluster: Cluster
) -> None:
    """A primary that never loaded the scripts (a promoted replica, a SCRIPT FLUSH) still lists records."""
    keys = unknowns(cluster_store, 20)
    for server in redis_cluster.primaries():
        server.client().script_flush()
    assert {record.key for record in cluster_store.in_doubt()} == set(keys)


# -- notifications -----------------------------------------------------------------------


def _bus(cluster: Cluster) -> Counter[str]:
    """Pub/sub messages sent over the cluster bus, summed over every node."""
    totals: Counter[str] = Counter()
    for server in cluster.servers:
        info = server.client().execute_command("CLUSTER INFO")
        totals.update({k: int(v) for k, v in info.items() if k.startswith("cluster_stats_messages_publish")})
    return totals


def test_waiter_is_woken_by_a_sharded_notification(
    cluster_store: effectq.RedisStore, redis_cluster: Cluster
) -> None:
    """On Cluster a completion wakes its waiter through SPUBLISH, which only the slot's shard hears."""
    key = f"r:{uuid.uuid4().hex}"
    request = ClaimRequest(lease_ms=30_000, owner="holder")
    claim = cluster_store.claim(key, request)
    assert cluster_store.claim(key, ClaimRequest(lease_ms=30_000, owner="waiter")).kind is ClaimKind.IN_FLIGHT
    heard = threading.Event()
    unsubscribe = cluster_store.watch(key, heard.set)
    before = _bus(redis_cluster)
    try:
        cluster_store.complete(
            key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=60_000
        )
        assert heard.wait(10)
    finally:
        unsubscribe()
    sent = _bus(redis_cluster) - before
    assert sent["cluster_stats_messages_publishshard_sent"] >= 1
    assert sent["cluster_stats_messages_publish_sent"] == 0


def test_a_watcher_hears_every_notification_until_it_leaves(cluster_store: effectq.RedisStore) -> None:
    """Woken once, a waiter that finds the record claimed again keeps its watch and is woken again."""
    key = f"r:{uuid.uuid4().hex}"
    heard = threading.Semaphore(0)
    unsubscribe = cluster_store.watch(key, heard.release)
    try:
        for holder in ("first", "second"):
            claim = cluster_store.claim(key, ClaimRequest(lease_ms=30_000, owner=holder))
            cluster_store.claim(key, ClaimRequest(lease_ms=30_000, owner="waiter"))  # flags the record
            cluster_store.release(key, claim.token, error="not applied", retention_ms=60_000)
            assert heard.acquire(timeout=10), holder
    finally:
        unsubscribe()


def test_waiter_is_woken_after_its_slot_moved(
    cluster_store: effectq.RedisStore, cluster_client: RedisCluster, redis_cluster: Cluster
) -> None:
    """When a slot moves, the listener re-subscribes on the new owner and still wakes waiters."""
    key = f"r:{uuid.uuid4().hex}"
    claim = cluster_store.claim(key, ClaimRequest(lease_ms=30_000, owner="holder"))
    cluster_store.claim(key, ClaimRequest(lease_ms=30_000, owner="waiter"))
    first = threading.Event()
    cluster_store.watch(key, first.set)()  # subscribed; this watcher leaves at once
    slot = cluster_client.keyslot(cluster_store.record_key(key))
    owner = redis_cluster.owner(slot)
    redis_cluster.move_slot(slot, next(p for p in redis_cluster.primaries() if p is not owner))
    heard = threading.Event()
    unsubscribe = cluster_store.watch(key, heard.set)
    try:
        wait_until(lambda: _subscribed(redis_cluster, cluster_store, slot), "the re-subscription")
        cluster_store.complete(
            key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=60_000
        )
        assert heard.wait(10)
    finally:
        unsubscribe()


def _subscribed(cluster: Cluster, store: effectq.RedisStore, slot: int) -> bool:
    channel = next(o for o, _ in store.bucket_keys() if key_slot(o.encode()) == slot).rsplit(":", 1)[0]
    counts = cluster.owner(slot).client().execute_command("PUBSUB SHARDNUMSUB", f"{channel}:notify")
    return bool(counts[0][1])


def test_watch_survives_a_failed_subscription(caplog: pytest.LogCaptureFixture) -> None:
    """A subscription that cannot be made costs the waiter its hint, not its call."""
    store = effectq.RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    with caplog.at_level("WARNING", logger="effectq.notify"):
        unsubscribe = store.watch("some-key", lambda: None)
    unsubscribe()
    store.close()
    assert "could not subscribe" in caplog.text


def test_unknowns_are_listed_across_every_primary(
    cluster_store: effectq.RedisStore, cluster_client: RedisCluster
) -> None:
    """The doubt index is one key per bucket: reading every bucket finds unknowns on every primary."""
    keys = unknowns(cluster_store, 40)
    found = set()
    nodes = set()
    for _open, doubt in cluster_store.bucket_keys():
        members = cluster_client.zrange(doubt, 0, -1)
        if members:
            nodes.add(cluster_client.get_node_from_key(doubt).name)
        found.update(members)
    assert found == {cluster_store.record_key(key).encode() for key in keys}
    assert len(nodes) == 3
    assert {cluster_store.get(key).status for key in keys} == {Status.UNKNOWN}  # type: ignore[union-attr]


# -- processes ---------------------------------------------------------------------------


@pytest.fixture
def ledger(redis_url: str) -> Iterator[str]:
    name = f"ledger-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(f"{name}:log", f"{name}:by-key", f"{name}:go", f"{name}:stop")
    client.close()


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.cluster_procs", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_processes_racing_on_a_cluster_apply_each_key_once(
    redis_cluster: Cluster, cluster_client: RedisCluster, redis_url: str, namespace: str, ledger: str
) -> None:
    """Six processes race through 40 keys spread over every primary: one application per key, one result."""
    ledger_client = redis.Redis.from_url(redis_url)
    args = (redis_cluster.url, redis_url, namespace, "race-1", ledger, "40")
    procs = [spawn("race", *args) for _ in range(6)]
    try:
        for proc in procs:
            assert read_line(proc) == "ready"
        ledger_client.rpush(f"{ledger}:go", "go")
        results = [json.loads(read_line(proc, timeout=120)) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        delete_namespace(cluster_client, namespace)
    applied = Counter(entry["key"] for entry in applications(ledger_client, ledger))
    assert len(applied) == 40
    assert set(applied.values()) == {1}
    for n in map(str, range(40)):
        assert len({result[n] for result in results}) == 1


FAILED_CLOSED = {"StoreError", "InProgress", "ClaimNotReplicatedError", "CompletionNotReplicatedError"}
"""What a call may raise while its slot migrates (a completion not replicated did apply, once)."""


def test_slots_migrating_under_running_effects_never_repeat_one(
    redis_cluster: Cluster, cluster_client: RedisCluster, redis_url: str, namespace: str, ledger: str
) -> None:
    """Every slot of a namespace moves to another primary, key by key, while four processes claim.

    Claims that meet the migration (MOVED, ASK, TRYAGAIN) complete or fail closed; no
    effect applies twice, and no record says completed for an effect that never ran.
    Two of the processes wait for replicas, so their scripts and WAITs go to the slot's
    node directly and follow the redirections themselves.
    """
    ledger_client = redis.Redis.from_url(redis_url)
    store = effectq.RedisStore(cluster_client, namespace=namespace)
    slots = sorted({cluster_client.keyslot(open_key) for open_key, _ in store.bucket_keys()})
    before = redis_cluster.errorstats()
    procs = [
        spawn("churn", redis_cluster.url, redis_url, namespace, "churn-1", ledger, "24", replicas)
        for replicas in ("0", "0", "1", "1")
    ]
    try:
        for proc in procs:
            assert read_line(proc) == "ready"
        primaries = redis_cluster.primaries()
        moved = 0
        for slot in slots:
            owner = redis_cluster.owner(slot)
            target = primaries[(primaries.index(owner) + 1) % len(primaries)]
            moved += redis_cluster.move_slot(slot, target)
        ledger_client.set(f"{ledger}:stop", 1)
        reports = [json.loads(read_line(proc, timeout=120)) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    try:
        after = redis_cluster.errorstats()
        redirects = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in ("MOVED", "ASK", "TRYAGAIN")}
        assert moved > 0
        assert redirects["MOVED"] + redirects["ASK"] + redirects["TRYAGAIN"] > 0, redirects
        for replicas in (0, 1):
            outcomes: Counter[str] = Counter()
            for report in reports:
                if report["replicas"] == replicas:
                    outcomes.update(report["outcomes"])
            assert outcomes["ok"] > 0
            assert set(outcomes) <= FAILED_CLOSED | {"ok"}, outcomes
        applied = Counter(entry["key"] for entry in applications(ledger_client, ledger))
        assert applied and max(applied.values()) == 1
        for rnd in range(max(report["rounds"] for report in reports)):
            for n in range(24):
                key = f"churn-1:{rnd}:{n}"
                record = store.get(key)
                if applied[effectq.idempotency_key(namespace, key)]:
                    assert record is not None and record.status is not Status.RELEASED, key
                else:
                    assert record is None or record.status is not Status.COMPLETED, key
    finally:
        store.close()
        delete_namespace(cluster_client, namespace)


# -- doctor ------------------------------------------------------------------------------


def _doctor(
    cluster: Cluster, namespace: str, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, Any]:
    code = main(["doctor", "--url", cluster.url, "--namespace", namespace, "--json", *extra])
    findings = json.loads(capsys.readouterr().out)["findings"]
    by_node: dict[str, dict[str, Any]] = {}
    for finding in findings:
        if finding["node"]:
            by_node.setdefault(finding["node"], {})[finding["check"]] = finding
    return code, by_node


def test_doctor_examines_every_node_of_a_cluster(
    redis_cluster: Cluster, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replicas, min-replicas-to-write, persistence and eviction, for each of the six nodes."""
    code, by_node = _doctor(redis_cluster, namespace, capsys)
    assert set(by_node) == {s.address for s in redis_cluster.servers}
    primaries = {s.address for s in redis_cluster.primaries()}
    for node, found in by_node.items():
        assert {"eviction", "persistence", "replicas", "version"} <= set(found), node
        assert found["eviction"]["level"] == "ok"
        assert found["persistence"]["level"] == "fail"  # these servers keep nothing on disk
        replicas = found["replicas"]
        if node in primaries:
            assert replicas["level"] == "warn"
            assert replicas["summary"].startswith("1 replica(s)")
            assert "min-replicas-to-write 0" in replicas["summary"]
        else:
            assert replicas["level"] == "ok"
            assert replicas["summary"].startswith("cluster replica of 127.0.0.1:")
    assert code == Exit.FAILED


def test_doctor_holds_every_primary_to_the_stores_wait(
    redis_cluster: Cluster, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --wait-replicas 1 each primary (one replica each) passes; with 2 each fails, saying why."""
    primaries = {s.address for s in redis_cluster.primaries()}
    _, by_node = _doctor(redis_cluster, namespace, capsys, "--wait-replicas", "1")
    assert {by_node[p]["replicas"]["level"] for p in primaries} == {"ok"}
    _, by_node = _doctor(redis_cluster, namespace, capsys, "--wait-replicas", "2")
    for primary in primaries:
        assert by_node[primary]["replicas"]["level"] == "fail"
        assert "the store waits for 2" in by_node[primary]["replicas"]["summary"]
    assert main(["doctor", "--url", redis_cluster.url, "--wait-replicas", "-1"]) == Exit.USAGE
    store = effectq.RedisStore.from_url(redis_cluster.url, namespace=namespace, wait_replicas=2)
    try:
        found = [f for f in diagnose(store) if f.check == "replicas" and f.node in primaries]
    finally:
        store.close()
    assert {f.level for f in found} == {Level.FAIL}, "diagnose(store) reads the store's own wait"
