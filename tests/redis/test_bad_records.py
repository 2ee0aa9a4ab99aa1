"""A record effectq did not write is a clear error, nothing runs, and other records are kept."""

from __future__ import annotations

import uuid

import pytest
import redis

import effectq

STORES = {"fakeredis": "fake_store", "redis": "redis_store", "redis-commands": "commands_store"}


@pytest.fixture(params=list(STORES))
def rstore(request: pytest.FixtureRequest) -> effectq.RedisStore:
    return request.getfixturevalue(STORES[request.param])  # type: ignore[no-any-return]


def make_effect(calls: list[str]) -> effectq.Effect[[str], str]:
    @effectq.effect(name="bad.record")
    def act(what: str) -> str:
        calls.append(what)
        return what

    return act


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda c, k: c.rpush(k, "not a record"), "another type"),
        (lambda c, k: c.set(k, "not a packed record"), "not a packed completed record"),
        (lambda c, k: c.hset(k, mapping={"s": "z", "t": 1}), "status 'z'"),
        (lambda c, k: c.set(k, "c1\n1\n1\n??\n0\nn\nr\n:ab\n\n\n1"), "result state"),
    ],
    ids=["wrong-type", "foreign-string", "unknown-status", "bad-result-state"],
)
def test_corrupt_record_is_refused(rstore: effectq.RedisStore, corrupt: object, match: str) -> None:
    """Whatever is stored where a record should be, the call fails clearly and runs nothing."""
    calls: list[str] = []
    act = make_effect(calls)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with effectq.run(run_id, store=rstore):
        assert act("kept") == "kept"
        key = act.key("broken")
    corrupt(rstore.client, rstore.record_key(key))  # type: ignore[operator]
    with effectq.run(run_id, store=rstore):
        with pytest.raises(effectq.CorruptRecordError, match=match) as info:
            act("broken")
        assert act("kept") == "kept"
    assert info.value.key == key
    assert "effectq show" in str(info.value) or "nothing was run" in str(info.value)
    assert calls == ["kept"]


def test_corrupt_record_error_is_a_store_error() -> None:
    """A handler of StoreError (fail closed) also catches corrupt records."""
    assert issubclass(effectq.CorruptRecordError, effectq.StoreError)


def test_get_of_a_corrupt_record_says_so(redis_store: effectq.RedisStore, redis_client: redis.Redis) -> None:
    """Operators reading a corrupt record get the same clear error."""
    redis_client.hset(redis_store.record_key("k"), mapping={"s": "?", "t": 1})
    with pytest.raises(effectq.CorruptRecordError, match="status"):
        redis_store.get("k")


def test_a_decoding_client_is_refused_up_front() -> None:
    """A client that decodes replies to str would corrupt results: refused with how to fix it."""
    with pytest.raises(effectq.ConfigurationError, match="decode_responses=False"):
        effectq.RedisStore(redis.Redis(decode_responses=True))
