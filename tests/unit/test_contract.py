"""Every store passes the same contracts (the store's, and the operator primitives'):
memory, fakeredis (same Lua) and a real Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

import effectq
from effectq.testing import OperatorStoreContract, StoreContract
from tests.conftest import delete_namespace


class TestMemoryStore(StoreContract, OperatorStoreContract):
    @pytest.fixture
    def store_factory(self) -> Callable[[str], effectq.Store]:
        return lambda namespace: effectq.MemoryStore(namespace=namespace)


class TestFakeRedisStore(StoreContract, OperatorStoreContract):
    @pytest.fixture
    def store_factory(self) -> Callable[[str], effectq.Store]:
        import fakeredis

        server = fakeredis.FakeServer()
        return lambda namespace: effectq.RedisStore(fakeredis.FakeRedis(server=server), namespace=namespace)


class TestRedisStore(StoreContract, OperatorStoreContract):
    via_execute_command = False

    @pytest.fixture
    def store_factory(self, redis_url: str) -> Iterator[Callable[[str], effectq.Store]]:
        client = redis.Redis.from_url(redis_url)
        made: list[str] = []

        def make(namespace: str) -> effectq.Store:
            made.append(namespace)
            return effectq.RedisStore(
                client, namespace=namespace, via_execute_command=self.via_execute_command
            )

        yield make
        for namespace in made:
            delete_namespace(client, namespace)
        client.close()


class TestRedisStoreViaExecuteCommand(TestRedisStore):
    """The scripts through redis-py's ``execute_command`` (what APM instrumentation sees): the
    store's contract holds there too."""

    via_execute_command = True
