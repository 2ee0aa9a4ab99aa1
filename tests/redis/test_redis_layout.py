"""How records sit in Redis: one slot per effect, compact completed records, namespaced keys."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.crc import key_slot

import effectq
from effectq.store.base import ClaimRequest, ResultState


def test_every_key_of_an_effect_shares_one_slot(redis_store: effectq.RedisStore) -> None:
    """The record and both indexes a script touches hash to one slot (Redis Cluster ready)."""
    for i in range(50):
        keys = redis_store._keys(f"run:{i}:e:{uuid.uuid4().hex}")
        assert len({key_slot(k.encode()) for k in keys}) == 1


def test_a_namespace_spreads_over_many_slots(redis_store: effectq.RedisStore) -> None:
    """Records of one namespace are not all on one slot (or one cluster node)."""
    slots = {key_slot(redis_store.record_key(f"run:{i}").encode()) for i in range(500)}
    assert len(slots) > 200


def test_completed_record_is_compact(redis_store: effectq.RedisStore, redis_client: redis.Redis) -> None:
    """A completed record with a small result takes at most 256 bytes plus the result."""

    @effectq.effect(name="email.send")
    def send(to: str) -> dict[str, object]:
        return {"id": "msg_8f3a", "ok": True}

    with effectq.run(str(uuid.uuid4()), store=redis_store):
        key = send.key("ada@example.com")
        result = send("ada@example.com")
    record_key = redis_store.record_key(key)
    assert redis_client.type(record_key) == b"string"
    usage = redis_client.memory_usage(record_key)
    assert usage is not None
    assert usage <= 256 + len(str(result))
    record = redis_store.get(key)
    assert record is not None and record.key == key and record.status is effectq.Status.COMPLETED


def test_completed_effects_leave_only_their_records(
    redis_store: effectq.RedisStore, redis_client: redis.Redis
) -> None:
    """Twenty completed effects leave twenty records in the namespace, and nothing else."""

    @effectq.effect
    def act(n: int) -> int:
        return n

    with effectq.run("r", store=redis_store):
        for n in range(20):
            act(n)
    mine = list(redis_client.scan_iter(match=f"effectq:{{{redis_store.namespace}*", count=1000))
    records = [k for k in mine if b":run:" not in k]
    assert len(records) == 20
    assert len(mine) == 21  # and the run's index of completed records
    assert all(redis_client.type(k) == b"string" for k in mine)


def test_a_run_lives_in_one_slot(redis_store: effectq.RedisStore) -> None:
    """Default keys of one run share a slot (so its index can list them); runs spread out."""
    digest = "ab" * 32
    one_run = {key_slot(redis_store.record_key(f"run-1:e{i}:{digest}").encode()) for i in range(50)}
    assert len(one_run) == 1
    runs = {key_slot(redis_store.record_key(f"run-{i}:e:{digest}").encode()) for i in range(500)}
    assert len(runs) > 200


def test_record_keys_stay_where_earlier_releases_wrote_them() -> None:
    """An upgrade must find the records it finds today: the layout of two keys, pinned."""
    store = effectq.RedisStore.embedded(namespace="golden")
    assert store.record_key("order-42") == "effectq:{golden:48}:4831c5a9cf0b903cdd8b10afde5399df"
    default = "run-7:email.send:" + "ab" * 32
    layout = store._layout_of(default)
    assert list(layout.script_keys) == [
        "effectq:{golden:8c}:446eb6751e9e6a1b7057aa6ea825908e",
        "effectq:{golden:8c}:open",
        "effectq:{golden:8c}:doubt",
        "effectq:{golden:8c}:run:e1862ff9cf8dd87c69af84ba86ec43d7",
    ]
    assert layout.digest.hex() == "446eb6751e9e6a1b7057aa6ea825908e"


@pytest.mark.parametrize("backend", ["redis_store", "fake_store"])
@pytest.mark.parametrize(
    ("run_id", "key", "form"),
    [
        ("r", "r:e.act:" + "ab" * 32, ":" + "ab" * 8),  # a default key: its run and name, and 16 hex
        ("a:b", "a:b:e.act:" + "0f" * 32, ":" + "0f" * 8),  # a run id with a colon
        ("r", "order-17", "order-17"),  # a key of the caller's own: whole
        ("r", "other:e.act:" + "ab" * 32, "other:e.act:" + "ab" * 32),  # default-shaped, another run's
        ("r", "r:e.act:" + "AB" * 32, "r:e.act:" + "AB" * 32),  # upper-case: no sha256 hex digest
        ("r", "r:e.act:" + "ab" * 31 + "a", "r:e.act:" + "ab" * 31 + "a"),  # 63 digits
        ("r", "r:e.act:" + "ab" * 32 + "a", "r:e.act:" + "ab" * 32 + "a"),  # 65 digits
    ],
)
def test_a_completed_record_keeps_the_key_in_its_form(
    request: pytest.FixtureRequest, backend: str, run_id: str, key: str, form: str
) -> None:
    """The packed record gives a default key of its own run and name as ":" and 16 of its hex
    digits (the reader knows the rest), and any other key whole; the rest of the layout is fixed."""
    store: effectq.RedisStore = request.getfixturevalue(backend)
    claim = store.claim(
        key, ClaimRequest(lease_ms=60_000, owner="o", name="e.act", run_id=run_id, input_hash="ih")
    )
    assert store.complete(
        key, claim.token, result=b"R\nS", result_state=ResultState.STORED, retention_ms=60_000
    )
    packed = store.client.get(store.record_key(key))
    assert isinstance(packed, bytes)
    parts = packed.split(b"\n", 10)
    assert parts[:4] == [b"c1", str(claim.token).encode(), b"1", b""] and parts[4].isdigit()
    assert parts[5:] == [b"e.act", run_id.encode(), form.encode(), b"ih", b"", b"R\nS"]


def test_layouts_stay_byte_identical_whatever_was_computed_before() -> None:
    """A run's bucket and a bucket's indexes are remembered once computed: the keys a store gives
    are the same on a fresh store as on one that laid out other keys of the run and bucket first."""
    run_id = "tâche:7"  # a colon and a character beyond ASCII in the run id
    default = f"{run_id}:email.send:" + "cd" * 32
    warm = effectq.RedisStore.embedded(namespace="golden")
    for i in range(300):  # fills the remembered buckets, and the run's
        warm._keys(f"{run_id}:e{i}:" + "ab" * 32)
        warm._keys(f"own-{i}")
    for store in (effectq.RedisStore.embedded(namespace="golden"), warm):
        assert list(store._layout_of(default).script_keys) == [
            "effectq:{golden:0c}:36ce852adc83d2f51f4e898af144043a",
            "effectq:{golden:0c}:open",
            "effectq:{golden:0c}:doubt",
            "effectq:{golden:0c}:run:71f7cbb555b23cb7d04bd63cfdb7e8d1",
        ]
        assert list(store._keys("order-42")) == [
            "effectq:{golden:48}:4831c5a9cf0b903cdd8b10afde5399df",
            "effectq:{golden:48}:open",
            "effectq:{golden:48}:doubt",
        ]
