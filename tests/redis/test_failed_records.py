"""FAILED records on Redis, as the scripts keep them (the contract every store passes on failed
records is ``effectq.testing.failed_contract``, run by ``tests/unit/test_contract.py``)."""

from __future__ import annotations

import pytest
import redis

import effectq
from effectq.store.base import ClaimKind, ClaimRequest, Status

KEY = "run-f:failed.effect:k1"
LONG = 60_000


def _request(owner: str, cap: int = 0, **flags: bool) -> ClaimRequest:
    return ClaimRequest(
        lease_ms=LONG, owner=owner, name="failed.effect", run_id="run-f", max_attempts=cap, **flags
    )


@pytest.fixture(params=["redis", "fakeredis"])
def rstore(request: pytest.FixtureRequest) -> effectq.RedisStore:
    return request.getfixturevalue("redis_store" if request.param == "redis" else "fake_store")  # type: ignore[no-any-return]


def test_a_record_without_an_attempts_field_counts_from_zero(rstore: effectq.RedisStore) -> None:
    """A released record with no ``a`` (none is written so by effectq, but a record edited or
    written elsewhere may lack it) reads as 0 attempts, and its next grant is attempt 1."""
    client: redis.Redis = rstore.client  # type: ignore[assignment]
    record_key = rstore.record_key(KEY)
    identity = f"failed.effect\nrun-f\n{KEY}\n"
    client.hset(record_key, mapping={"s": "r", "t": 5, "h": identity, "c": 1, "e": "old"})
    found = rstore.get(KEY)
    assert found is not None and (found.status, found.attempt) == (Status.RELEASED, 0)
    claim = rstore.claim(KEY, _request("o1", cap=1))
    assert (claim.kind, claim.attempt, claim.token) == (ClaimKind.CLAIMED, 1, 6)


def test_a_failed_record_is_a_hash_with_its_exception_in_one_field(rstore: effectq.RedisStore) -> None:
    claim = rstore.claim(KEY, _request("o1"))
    assert rstore.fail(KEY, claim.token, error="e", failure='{"type": "x.Y"}', retention_ms=LONG)
    client: redis.Redis = rstore.client  # type: ignore[assignment]
    fields = client.hgetall(rstore.record_key(KEY))
    assert (fields[b"s"], fields[b"z"], fields[b"e"]) == (b"f", b'{"type": "x.Y"}', b"e")
    assert not {b"o", b"w"} & set(fields)
    assert 0 < client.pttl(rstore.record_key(KEY)) <= LONG
