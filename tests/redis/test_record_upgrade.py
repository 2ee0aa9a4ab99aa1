"""Records in flight written before the identity was one hash field still work.

Earlier releases kept an in-flight record's effect name, run id, effect key and input hash as
four fields (n, u, k, i) and set m beside c on creation; records now carry them as one field, h,
and no m until they change. A record the old layout wrote must complete, read, resolve, purge
and be granted again as before: each is written here as the old claim wrote it.
"""

from __future__ import annotations

import hashlib

import pytest
import redis

import effectq
from effectq.store.base import ClaimKind, ClaimRequest, ResultState, Status

RUN, NAME = "run-upgrade", "upgrade.send"
KEY = f"{RUN}:{NAME}:{hashlib.sha256(b'input').hexdigest()}"


@pytest.fixture(params=["redis", "fakeredis"])
def store(request: pytest.FixtureRequest) -> effectq.RedisStore:
    return request.getfixturevalue("redis_store" if request.param == "redis" else "fake_store")  # type: ignore[no-any-return]


def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _old_layout(
    store: effectq.RedisStore, *, status: str, token: int, lease_ms: int, input_hash: str = ""
) -> str:
    """The record as the old claim.lua wrote it (and a later transition, for r and u)."""
    client = store.client
    now = _now_ms(client)
    record, open_index, doubt_index = store._keys(KEY)
    fields: dict[str, object] = {
        "s": status, "t": token, "a": 1, "x": now + lease_ms if lease_ms else 0, "o": "old-host:1:1",
        "n": NAME, "u": RUN, "k": KEY, "m": now, "c": now,
    }  # fmt: skip
    if input_hash:
        fields["i"] = input_hash
    client.hset(record, mapping=fields)  # type: ignore[arg-type]
    if status == "d":
        client.zadd(open_index, {record: now + lease_ms})
    if status == "u":
        client.zadd(doubt_index, {record: now})
    return record


def test_an_old_layout_record_reads_whole(store: effectq.RedisStore) -> None:
    _old_layout(store, status="d", token=7, lease_ms=60_000, input_hash="ab" * 16)
    record = store.get(KEY)
    assert record is not None
    assert (record.status, record.token, record.name, record.run_id, record.key, record.input_hash) == (
        Status.DISPATCHED, 7, NAME, RUN, KEY, "ab" * 16,
    )  # fmt: skip
    assert record.created_at is not None and record.updated_at == record.created_at


def test_an_old_layout_record_completes_with_its_identity(store: effectq.RedisStore) -> None:
    _old_layout(store, status="d", token=7, lease_ms=60_000, input_hash="cd" * 16)
    assert store.complete(KEY, 7, result=b'"sent"', result_state=ResultState.STORED, retention_ms=60_000)
    record = store.get(KEY)
    assert record is not None and record.status is Status.COMPLETED
    assert (record.name, record.run_id, record.input_hash, record.result) == (NAME, RUN, "cd" * 16, b'"sent"')
    claim = store.claim(KEY, ClaimRequest(lease_ms=1000, owner="new:1:1", name=NAME, run_id=RUN))
    assert (claim.kind, claim.result, claim.input_hash) == (ClaimKind.COMPLETED, b'"sent"', "cd" * 16)


def test_an_old_layout_record_in_doubt_resolves_with_its_identity(store: effectq.RedisStore) -> None:
    _old_layout(store, status="u", token=3, lease_ms=0, input_hash="ef" * 16)
    record = store.resolve(KEY, applied=True, result=b"1", note="checked by hand", retention_ms=60_000)
    assert (record.status, record.name, record.run_id, record.input_hash) == (
        Status.COMPLETED, NAME, RUN, "ef" * 16,
    )  # fmt: skip


def test_an_old_layout_record_is_purged_by_its_run(store: effectq.RedisStore) -> None:
    _old_layout(store, status="r", token=2, lease_ms=0)
    record = store.get(KEY)
    assert record is not None and record.status is Status.RELEASED
    assert not store.purge(record, run_id="another-run")
    assert store.purge(record, run_id=RUN)
    assert store.get(KEY) is None


def test_a_grant_rewrites_an_old_layout_record_in_the_new_one(store: effectq.RedisStore) -> None:
    record_key = _old_layout(store, status="r", token=2, lease_ms=0, input_hash="12" * 16)
    request = ClaimRequest(lease_ms=60_000, owner="new:1:2", name=NAME, run_id=RUN, input_hash="34" * 16)
    claim = store.claim(KEY, request)
    assert (claim.kind, claim.token) == (ClaimKind.CLAIMED, 3)
    fields = store.client.hgetall(record_key)
    assert not {b"n", b"u", b"k", b"i"} & set(fields)
    assert fields[b"h"] == f"{NAME}\n{RUN}\n{KEY}\n{'34' * 16}".encode()
    assert store.complete(KEY, 3, result=b"2", result_state=ResultState.STORED, retention_ms=60_000)
    record = store.get(KEY)
    assert record is not None and (record.name, record.run_id, record.input_hash) == (NAME, RUN, "34" * 16)


def test_a_first_claim_writes_the_identity_as_one_field(store: effectq.RedisStore) -> None:
    request = ClaimRequest(lease_ms=60_000, owner="new:1:3", name=NAME, run_id=RUN)
    store.claim(KEY, request)
    fields = store.client.hgetall(store.record_key(KEY))
    assert set(fields) == {b"s", b"t", b"a", b"x", b"o", b"h", b"c"}
    assert fields[b"h"] == f"{NAME}\n{RUN}\n{KEY}\n".encode()
    record = store.get(KEY)
    assert record is not None
    assert (record.name, record.run_id, record.key, record.input_hash) == (NAME, RUN, KEY, "")
    assert record.updated_at == record.created_at is not None


def test_a_new_layout_record_is_purged_by_its_run_and_age(store: effectq.RedisStore) -> None:
    claim = store.claim(KEY, ClaimRequest(lease_ms=60_000, owner="new:1:4", name=NAME, run_id=RUN))
    assert store.release(KEY, claim.token, error="gave up", retention_ms=60_000)
    record = store.get(KEY)
    assert record is not None and record.status is Status.RELEASED
    assert not store.purge(record, run_id="another-run")
    assert not store.purge(record, run_id=RUN, older_than_ms=3_600_000)  # changed just now
    assert store.purge(record, run_id=RUN)


@pytest.mark.parametrize("where", ["key", "name", "run_id"])
def test_a_line_break_in_the_identity_is_refused_before_anything_is_written(
    store: effectq.RedisStore, where: str
) -> None:
    """The identity field is split on line breaks: a part holding one is refused, not written."""
    parts = {"key": KEY, "name": NAME, "run_id": RUN}
    parts[where] = parts[where][:5] + "\n" + parts[where][5:]
    request = ClaimRequest(lease_ms=60_000, owner="new:1:5", name=parts["name"], run_id=parts["run_id"])
    with pytest.raises(effectq.errors.InvalidKeyError, match="line break"):
        store.claim(parts["key"], request)
    assert not store.client.exists(store.record_key(parts["key"]))
