"""FAILED records at the primitives: ``fail``, the attempts cap in ``claim`` and ``dispatch``, and
what ``resolve`` and ``purge`` do with them; the Redis scripts and the memory store alike."""

from __future__ import annotations

import pytest
import redis

import effectq
from effectq.store.base import ClaimKind, ClaimRequest, ResultState, Status
from effectq.store.operators import OperatorStore

KEY = "run-f:failed.effect:k1"
LONG = 60_000


def _request(owner: str, cap: int = 0, **flags: bool) -> ClaimRequest:
    return ClaimRequest(
        lease_ms=LONG, owner=owner, name="failed.effect", run_id="run-f", max_attempts=cap, **flags
    )


def _released_times(store: effectq.Store, times: int) -> int:
    """Claim and release ``times`` times (no cap); the last token."""
    token = 0
    for n in range(times):
        claim = store.claim(KEY, _request(f"o{n}"))
        assert claim.kind is ClaimKind.CLAIMED and claim.attempt == n + 1
        token = claim.token
        assert store.release(KEY, token, error=f"declined #{n + 1}", retention_ms=LONG)
    return token


def test_fail_records_a_terminal_exception_that_every_claim_replies(store: effectq.Store) -> None:
    claim = store.claim(KEY, _request("o1"))
    failure = '{"type": "shop.CardDeclined", "message": "no", "args": ["no"]}'
    assert store.fail(KEY, claim.token, error="shop.CardDeclined: no", failure=failure, retention_ms=LONG)
    assert store.fail(KEY, claim.token, error="shop.CardDeclined: no", failure=failure, retention_ms=LONG)
    assert not store.fail(KEY, claim.token + 1, error="x", failure=failure, retention_ms=LONG)
    for owner in ("o2", "o3"):
        again = store.claim(KEY, _request(owner, cap=3, replay_safe=True, can_reconcile=True))
        assert (again.kind, again.failure) == (ClaimKind.FAILED, failure)
        assert again.error == "shop.CardDeclined: no"
    # the holder's other writes are refused: the record is settled
    stored = ResultState.STORED
    assert not store.complete(KEY, claim.token, result=b"1", result_state=stored, retention_ms=LONG)
    assert not store.release(KEY, claim.token, error="x", retention_ms=LONG)
    assert not store.mark_unknown(KEY, claim.token, error="x")
    assert not store.renew(KEY, claim.token, lease_ms=LONG)
    record = store.get(KEY)
    assert record is not None
    assert (record.status, record.failure, record.attempt) == (Status.FAILED, failure, 1)
    assert record.expires_at is not None and record.lease_expires_at is None


def test_a_claim_past_max_attempts_parks_the_record(store: effectq.Store) -> None:
    """Three releases: a fourth claim with max_attempts=3 is refused and the record parked (the
    token bumped, the last error kept); without a cap it would have run."""
    token = _released_times(store, 3)
    parked = store.claim(KEY, _request("o4", cap=3))
    assert (parked.kind, parked.attempt, parked.error) == (ClaimKind.FAILED, 3, "declined #3")
    assert (parked.token, parked.failure) == (token + 1, "")
    assert store.claim(KEY, _request("o5", cap=10)).kind is ClaimKind.FAILED  # parked stays parked
    record = store.get(KEY)
    assert record is not None
    assert (record.status, record.error, record.owner) == (Status.FAILED, "declined #3", "")


def test_a_claim_under_the_cap_runs(store: effectq.Store) -> None:
    _released_times(store, 2)
    claim = store.claim(KEY, _request("o3", cap=3))
    assert (claim.kind, claim.attempt) == (ClaimKind.CLAIMED, 3)


def test_a_replay_safe_re_run_past_the_cap_parks(store: effectq.Store) -> None:
    claim = store.claim(KEY, _request("o1"))
    assert store.mark_unknown(KEY, claim.token, error="timed out")
    parked = store.claim(KEY, _request("o2", cap=1, replay_safe=True))
    assert (parked.kind, parked.error) == (ClaimKind.FAILED, "timed out")
    if isinstance(store, OperatorStore):  # no longer in doubt: not listed as unknown
        assert list(store.in_doubt()) == []


def test_a_dispatch_past_the_cap_parks(store: effectq.Store) -> None:
    """After a reconcile that found nothing, the dispatch would start attempt 2 of 1: parked (-1)."""
    claim = store.claim(KEY, _request("o1"))
    assert store.mark_unknown(KEY, claim.token, error="timed out")
    lease = store.claim(KEY, _request("o2", cap=1, can_reconcile=True))
    assert lease.kind is ClaimKind.RECONCILE
    assert store.dispatch(KEY, lease.token, lease_ms=LONG, max_attempts=1, retention_ms=LONG) == -1
    record = store.get(KEY)
    assert record is not None and (record.status, record.attempt) == (Status.FAILED, 1)
    assert store.dispatch(KEY, lease.token, lease_ms=LONG, max_attempts=1, retention_ms=LONG) == 0


def test_resolve_not_applied_resets_a_failed_record_and_its_attempts(store: effectq.Store) -> None:
    _released_times(store, 2)
    assert store.claim(KEY, _request("o3", cap=2)).kind is ClaimKind.FAILED
    record = store.resolve(KEY, applied=False, note="fixed the relay", retention_ms=LONG)
    assert (record.status, record.attempt, record.error) == (Status.RELEASED, 0, "fixed the relay")
    claim = store.claim(KEY, _request("o4", cap=2))
    assert (claim.kind, claim.attempt) == (ClaimKind.CLAIMED, 1)


def test_resolve_applied_settles_a_failed_record(store: effectq.Store) -> None:
    claim = store.claim(KEY, _request("o1"))
    failure = '{"type": "x.Y", "message": "m"}'
    assert store.fail(KEY, claim.token, error="e", failure=failure, retention_ms=LONG)
    record = store.resolve(KEY, applied=True, result=b'"found"', note="it did apply", retention_ms=LONG)
    assert record.status is Status.COMPLETED
    assert store.claim(KEY, _request("o2")).result == b'"found"'


def test_purge_deletes_a_failed_record(store: effectq.Store) -> None:
    if not isinstance(store, OperatorStore):
        pytest.skip("not an operator store")
    _released_times(store, 1)
    store.claim(KEY, _request("o2", cap=1))
    record = store.get(KEY)
    assert record is not None and record.status is Status.FAILED
    assert store.purge(record)
    assert store.get(KEY) is None


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
