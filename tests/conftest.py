"""Shared fixtures: a real Redis for every test that claims safety, a fresh namespace each.

The Redis server is the one at ``EFFECTQ_TEST_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``). Tests never flush it, nor pause its clients: each
one works in its own namespace and deletes that namespace's keys afterwards. A
test that flushes the script cache or pauses clients runs on ``private_redis``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

import effectq
from tests.support import servers

REDIS_URL = os.environ.get("EFFECTQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _drop_repairs() -> None:
    """Forget the heartbeat's queued background writes (each test's stores are its own)."""
    from effectq._runtime.leases import heartbeat

    heartbeat._repairs.clear()


@pytest.fixture(autouse=True)
def _no_repairs_from_other_tests() -> Iterator[None]:
    """A write the heartbeat keeps retrying in the background (against a server a test stopped,
    say) belongs to the test that queued it: it must not log into the next one's records."""
    _drop_repairs()
    yield
    _drop_repairs()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of the real Redis server the suite runs against (it must answer)."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:  # pragma: no cover - environment
        pytest.fail(f"no Redis answering at {REDIS_URL} ({exc}); start one or set EFFECTQ_TEST_REDIS_URL")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    """A redis-server of the module's own (a free port, stopped by its pid at the end), for the
    tests that flush its script cache or pause its clients: the shared server never sees that.

    A module all of whose tests may run there overrides ``redis_url`` with
    :func:`private_redis_url`'s value."""
    started = servers.Server(tmp_path_factory.mktemp("redis")).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def private_redis_url(private_redis: servers.Server) -> str:
    """The URL of :func:`private_redis`."""
    return f"redis://{private_redis.address}/0"


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[servers.Cluster]:
    """A Redis Cluster of the session's own (3 primaries, 3 replicas, free ports), stopped at the end."""
    with servers.cluster() as made:
        yield made


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_client(redis_url: str, namespace: str) -> Iterator[redis.Redis]:
    """A client of the real Redis; the test namespace's keys are deleted afterwards."""
    client = redis.Redis.from_url(redis_url)
    yield client
    delete_namespace(client, namespace)
    client.close()


def delete_namespace(client: redis.Redis, namespace: str, prefix: str = "effectq") -> None:
    """Delete every key of one namespace (SCAN, never FLUSH)."""
    for pattern in (f"{prefix}:{{{namespace}:*", f"{prefix}:{{{namespace}}}*"):
        batch = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(batch), 500):
            client.delete(*batch[i : i + 500])


@pytest.fixture
def redis_store(redis_client: redis.Redis, namespace: str) -> Iterator[effectq.RedisStore]:
    """A RedisStore on the real server, in the test's namespace."""
    store = effectq.RedisStore(redis_client, namespace=namespace)
    yield store
    store.close()


@pytest.fixture
def commands_store(redis_client: redis.Redis, namespace: str) -> Iterator[effectq.RedisStore]:
    """A RedisStore on the real server whose scripts go through redis-py's ``execute_command``
    (``via_execute_command=True``), in the test's namespace."""
    store = effectq.RedisStore(redis_client, namespace=namespace, via_execute_command=True)
    yield store
    store.close()


@pytest.fixture
def onlooker(redis_url: str, namespace: str) -> Iterator[effectq.RedisStore]:
    """Another store on its own client, in the same namespace: reads records without touching
    the connections of the store under test."""
    store = effectq.RedisStore(redis.Redis.from_url(redis_url), namespace=namespace)
    yield store
    store.close()
    store.client.close()


@pytest.fixture
def fake_store(namespace: str) -> Iterator[effectq.RedisStore]:
    """A RedisStore on fakeredis (lupa runs the same Lua)."""
    store = effectq.RedisStore.embedded(namespace=namespace)
    yield store
    store.close()


@pytest.fixture(params=["memory", "fakeredis", "redis"])
def store(request: pytest.FixtureRequest, namespace: str) -> effectq.Store:
    """Each store in turn: the engine's behaviour must not depend on which."""
    if request.param == "memory":
        return effectq.MemoryStore(namespace=namespace)
    return request.getfixturevalue("fake_store" if request.param == "fakeredis" else "redis_store")  # type: ignore[no-any-return]
