"""Records of every standing, and the suite every :class:`~effectq.store.OperatorStore` passes.

    from effectq.testing import OperatorStoreContract

    class TestMyStore(OperatorStoreContract):
        @pytest.fixture
        def store_factory(self):
            return lambda namespace: MyStore(namespace=namespace)

:func:`seed_records` builds one record of each kind through the store's own
primitives (claim, complete, release, mark_unknown, with short leases for
holders that "die"), so what it seeds is exactly what a real run leaves.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest

from ..store.base import ClaimRequest, Record, ResultState, Status
from ..store.operators import OperatorStore, Standing, since, standing

__all__ = ["OperatorStoreContract", "Seeded", "seed_records"]

LIVE_MS = 120_000
"""A lease no test outlives."""
DEAD_MS = 80
"""A lease left to run out, for a holder that died."""
RETENTION_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Seeded:
    """The keys :func:`seed_records` wrote, one per kind of record.

    Attributes:
        unknown: its function raised a maybe-applied exception (mark_unknown).
        dead_holder: dispatched, and its holder died (the lease ran out; nobody called since).
        in_flight: dispatched, with a live lease.
        reconciling: pending, with a live lease (a reconcile before the first run).
        abandoned: pending, and its holder died before running anything.
        completed: applied, with a result.
        released: not applied.
    """

    unknown: str
    dead_holder: str
    in_flight: str
    reconciling: str
    abandoned: str
    completed: str
    released: str

    def standing_of(self) -> dict[str, Standing]:
        """Where each seeded key stands."""
        return {
            self.unknown: Standing.UNKNOWN,
            self.dead_holder: Standing.UNKNOWN,
            self.in_flight: Standing.IN_FLIGHT,
            self.reconciling: Standing.IN_FLIGHT,
            self.abandoned: Standing.RELEASED,
            self.completed: Standing.COMPLETED,
            self.released: Standing.RELEASED,
        }

    def keys(self, where: Standing) -> set[str]:
        """The seeded keys that stand ``where``."""
        return {key for key, found in self.standing_of().items() if found is where}


def seed_records(
    store: OperatorStore, *, run_id: str = "seed-run", name: str = "seed.effect", result: bytes = b'"ok"'
) -> Seeded:
    """One record of every kind in ``store``, written through its primitives (sleeps ~0.2 s)."""
    tag = uuid.uuid4().hex[:8]
    calls = itertools.count(1)

    def key(what: str) -> str:
        return f"{run_id}:{name}:{what}-{tag}"

    def claim(k: str, lease_ms: int = LIVE_MS, *, reconcile_first: bool = False) -> int:
        request = ClaimRequest(
            lease_ms=lease_ms,
            owner=f"seed-host:4242:{next(calls)}",
            name=name,
            run_id=run_id,
            retention_ms=RETENTION_MS,
            can_reconcile=reconcile_first,
            reconcile_first=reconcile_first,
        )
        return store.claim(k, request).token

    seeded = Seeded(
        unknown=key("unknown"),
        dead_holder=key("dead-holder"),
        in_flight=key("in-flight"),
        reconciling=key("reconciling"),
        abandoned=key("abandoned"),
        completed=key("completed"),
        released=key("released"),
    )
    # the mark comes first, so the unknown is in doubt longer than the dead holder (whose
    # doubt starts when its lease runs out): a fixed order, however slow the machine
    store.mark_unknown(seeded.unknown, claim(seeded.unknown), error="builtins.TimeoutError: read timed out")
    claim(seeded.dead_holder, DEAD_MS)
    claim(seeded.abandoned, DEAD_MS, reconcile_first=True)
    claim(seeded.in_flight)
    claim(seeded.reconciling, reconcile_first=True)
    store.complete(
        seeded.completed,
        claim(seeded.completed),
        result=result,
        result_state=ResultState.STORED,
        retention_ms=RETENTION_MS,
    )
    store.release(
        seeded.released,
        claim(seeded.released),
        error="builtins.ValueError: bad input",
        retention_ms=RETENTION_MS,
    )
    time.sleep(DEAD_MS / 1000 * 2.5)
    return seeded


def _read(store: OperatorStore, key: str) -> Record:
    record = store.get(key)
    assert record is not None, key
    return record


class OperatorStoreContract:
    """Tests every operator store must pass. Subclasses provide ``store_factory(namespace)``."""

    @pytest.fixture
    def store(self, store_factory: Callable[[str], OperatorStore]) -> OperatorStore:
        return store_factory(f"o{uuid.uuid4().hex[:12]}")

    @pytest.fixture
    def seeded(self, store: OperatorStore) -> Seeded:
        return seed_records(store)

    def test_every_seeded_record_stands_where_expected(self, store: OperatorStore, seeded: Seeded) -> None:
        """Each kind of record is classified by status and lease, by the store's clock."""
        now = store.clock()
        for key, where in seeded.standing_of().items():
            record = store.get(key)
            assert record is not None, key
            assert standing(record, now) is where, key

    def test_in_doubt_lists_unknown_and_dead_holders_oldest_first(
        self, store: OperatorStore, seeded: Seeded
    ) -> None:
        """Unknown records and dispatched ones whose holder died, and nothing else, longest in doubt first."""
        found = list(store.in_doubt())
        assert {r.key for r in found} == seeded.keys(Standing.UNKNOWN)
        assert all(since(r, Standing.UNKNOWN) for r in found)
        assert [r.key for r in found] == [seeded.unknown, seeded.dead_holder]
        assert "TimeoutError" in found[0].error
        assert found[1].status is Status.DISPATCHED, "listing does not change the record"

    def test_in_doubt_limit(self, store: OperatorStore, seeded: Seeded) -> None:
        """A limit returns the oldest ones."""
        assert [r.key for r in store.in_doubt(limit=1)] == [seeded.unknown]

    def test_in_flight_lists_live_leases(self, store: OperatorStore, seeded: Seeded) -> None:
        """Dispatched and pending records with a live lease; not the dead or the settled."""
        found = list(store.in_flight())
        assert {r.key for r in found} == seeded.keys(Standing.IN_FLIGHT)
        assert all(r.owner.startswith("seed-host:4242:") for r in found)
        assert len(list(store.in_flight(limit=1))) == 1

    def test_scan_sees_every_record_of_its_namespace_only(
        self, store_factory: Callable[[str], OperatorStore], store: OperatorStore, seeded: Seeded
    ) -> None:
        """scan() reads every record of the namespace, and none of another."""
        other = store_factory(f"o{uuid.uuid4().hex[:12]}")
        seed_records(other, run_id="other-run")
        assert {r.key for r in store.scan()} == set(seeded.standing_of())

    def test_summary_matches_the_listing(self, store: OperatorStore, seeded: Seeded) -> None:
        """The cheap summary counts what the listings list, and dates the oldest doubt."""
        summary = store.summary()
        assert summary.in_doubt == 2
        assert summary.in_flight == 2
        unknown = store.get(seeded.unknown)
        assert unknown is not None
        assert summary.oldest_in_doubt == unknown.unknown_since

    def test_summary_of_an_empty_namespace(self, store: OperatorStore) -> None:
        """Nothing in doubt: zero, and no oldest."""
        summary = store.summary()
        assert (summary.in_doubt, summary.oldest_in_doubt, summary.in_flight) == (0, None, 0)

    def test_purge_deletes_only_settled_records(self, store: OperatorStore, seeded: Seeded) -> None:
        """Completed, released and abandoned pending go; unknown, dead holders and live ones stay."""
        for key, where in seeded.standing_of().items():
            deleted = store.purge(_read(store, key))
            assert deleted is (where in (Standing.COMPLETED, Standing.RELEASED)), key
            assert (store.get(key) is None) is deleted, key
        assert {r.key for r in store.in_doubt()} == seeded.keys(Standing.UNKNOWN)
        assert store.summary().in_doubt == 2

    def test_purge_what_a_scan_lists(self, store: OperatorStore, seeded: Seeded) -> None:
        """Records as scanned can be purged, a completed one whose listed key is shortened too."""
        key = f"seed-run:seed.effect:{'ab' * 32}"  # a default key: the store may keep only part of it
        claim = store.claim(
            key, ClaimRequest(lease_ms=LIVE_MS, owner="scan-test", name="seed.effect", run_id="seed-run")
        )
        store.complete(
            key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        now = store.clock()
        settled = [r for r in store.scan() if standing(r, now) in (Standing.COMPLETED, Standing.RELEASED)]
        assert len(settled) == 4
        assert all(store.purge(record) for record in settled)
        assert store.get(key) is None
        assert {r.key for r in store.scan()} == seeded.keys(Standing.UNKNOWN) | seeded.keys(
            Standing.IN_FLIGHT
        )

    def test_purge_checks_the_run(self, store: OperatorStore, seeded: Seeded) -> None:
        """A purge for another run keeps the record."""
        record = _read(store, seeded.completed)
        assert not store.purge(record, run_id="another-run")
        assert store.purge(record, run_id="seed-run")

    def test_purge_checks_the_age(self, store: OperatorStore, seeded: Seeded) -> None:
        """A record changed more recently than older_than is kept."""
        hour = int(timedelta(hours=1).total_seconds() * 1000)
        for key in (seeded.completed, seeded.released):
            record = _read(store, key)
            assert not store.purge(record, older_than_ms=hour)
            assert store.purge(record, older_than_ms=1)

    def test_purged_key_applies_again(self, store: OperatorStore, seeded: Seeded) -> None:
        """After a purge the key is fresh: the next claim executes (that is what purge is for)."""
        assert store.purge(_read(store, seeded.completed))
        claim = store.claim(seeded.completed, ClaimRequest(lease_ms=LIVE_MS, owner="after-purge"))
        assert claim.status is Status.DISPATCHED

    def test_purge_of_a_record_already_gone(self, store: OperatorStore, seeded: Seeded) -> None:
        """Nothing to delete is not an error."""
        record = _read(store, seeded.released)
        assert store.purge(record)
        assert not store.purge(record)

    def test_clock_is_the_stores(self, store: OperatorStore) -> None:
        """The store's clock is a real UTC time (a sanity bound, not a timing assertion)."""
        from datetime import UTC, datetime

        assert abs((store.clock() - datetime.now(UTC)).total_seconds()) < 3600
