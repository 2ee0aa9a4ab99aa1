"""The Redis store lists what is in doubt or in flight from its indexes, never by scanning."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

import effectq
from effectq.store import Standing
from effectq.testing import seed_records


class NoScanRedis(redis.Redis):
    """A client that fails the test if anything scans the keyspace."""

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("listing in doubt / in flight must not SCAN")

    def scan_iter(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("listing in doubt / in flight must not SCAN")

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("never KEYS")


def test_doubt_flight_and_summary_read_only_the_indexes(
    redis_url: str, redis_client: redis.Redis, namespace: str
) -> None:
    """in_doubt, in_flight and summary work with SCAN and KEYS forbidden."""
    seeded = seed_records(effectq.RedisStore(redis_client, namespace=namespace))
    store = effectq.RedisStore(NoScanRedis.from_url(redis_url), namespace=namespace)
    assert {r.key for r in store.in_doubt()} == seeded.keys(Standing.UNKNOWN)
    assert {r.key for r in store.in_flight()} == seeded.keys(Standing.IN_FLIGHT)
    assert store.summary().in_doubt == 2


def test_index_entries_of_vanished_records_are_skipped_then_pruned(
    redis_client: redis.Redis, namespace: str
) -> None:
    """A record deleted by hand leaves index entries: listings skip them, prune_indexes drops them."""
    store = effectq.RedisStore(redis_client, namespace=namespace)
    seeded = seed_records(store)
    redis_client.delete(store.record_key(seeded.unknown), store.record_key(seeded.abandoned))
    assert {r.key for r in store.in_doubt()} == {seeded.dead_holder}
    assert store.summary().in_doubt == 2, "the summary counts index entries, stale ones too"
    assert store.prune_indexes() == 2
    assert store.summary().in_doubt == 1
    assert store.prune_indexes() == 0
    assert {r.key for r in store.in_doubt()} == {seeded.dead_holder}
    assert {r.key for r in store.in_flight()} == seeded.keys(Standing.IN_FLIGHT)


def test_prune_keeps_every_entry_whose_record_exists(redis_client: redis.Redis, namespace: str) -> None:
    """prune_indexes only touches entries whose record is gone; live and doubtful records stay listed."""
    store = effectq.RedisStore(redis_client, namespace=namespace)
    seeded = seed_records(store)
    assert store.prune_indexes() == 0
    assert {r.key for r in store.in_doubt()} == seeded.keys(Standing.UNKNOWN)
    assert {r.key for r in store.in_flight()} == seeded.keys(Standing.IN_FLIGHT)


@effectq.effect(name="idx.touch")
def touch(n: int) -> int:
    return n


def test_scan_lists_completed_default_keys_and_skips_run_indexes(
    redis_store: effectq.RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A run's completed default keys (kept shortened, beside the run's index) are all listed."""
    with effectq.run("idx-run", store=redis_store):
        keys = [touch.key(n) for n in range(3)]
    with effectq.run("idx-run", store=redis_store):
        for n in range(3):
            touch(n)
    caplog.set_level(logging.WARNING, logger="effectq")
    found = list(redis_store.scan())
    assert not [r for r in caplog.records if r.name.startswith("effectq")]
    assert len(found) == 3
    assert {r.status for r in found} == {effectq.Status.COMPLETED}
    for record in found:  # kept shortened: the run, the name and 16 hex of the input hash
        assert record.key.endswith("…")
        assert sum(key.startswith(record.key[:-1]) for key in keys) == 1
    assert all(redis_store.purge(record, run_id="idx-run") for record in found)
    assert all(redis_store.get(key) is None for key in keys)
