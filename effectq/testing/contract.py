"""The store contract: what every store must do, as a pytest class to subclass.

    from effectq.testing import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store_factory(self):
            return lambda namespace: MyStore(namespace=namespace)

Every test gets a fresh namespace. Lease expiry is tested with short leases
and real sleeps (the store's own clock judges leases), so the suite takes a
few seconds.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest

from ..store.base import ClaimKind, ResultState, Status, Store
from .contract_requests import LIVE_MS, RETENTION_MS, SHORT_MS, expire, request
from .failed_contract import FailedContract
from .unknown_contract import UnknownContract

__all__ = ["StoreContract"]


class StoreContract(UnknownContract, FailedContract):
    """Tests every store must pass. Subclasses provide ``store_factory(namespace) -> Store``.
    The tests on unknown outcomes (``mark_unknown``, reconcile, ``resolve``) are
    :class:`UnknownContract`'s; those on failed records (``fail``, the attempts cap)
    :class:`FailedContract`'s."""

    @pytest.fixture
    def store(self, store_factory: Callable[[str], Store]) -> Store:
        return store_factory(f"c{uuid.uuid4().hex[:12]}")

    @pytest.fixture
    def key(self) -> str:
        return f"run-1:contract.effect:{uuid.uuid4().hex}"

    # -- claim -------------------------------------------------------------------------

    def test_first_claim_dispatches(self, store: Store, key: str) -> None:
        """A fresh key is claimed: dispatched, attempt 1, a token to fence with."""
        claim = store.claim(key, request())
        assert claim.kind is ClaimKind.CLAIMED
        assert claim.status is Status.DISPATCHED
        assert claim.attempt == 1
        assert claim.token > 0
        record = store.get(key)
        assert record is not None
        assert record.status is Status.DISPATCHED
        assert record.token == claim.token
        assert record.name == "contract.effect"
        assert record.run_id == "run-1"
        assert record.lease_live

    def test_second_claim_sees_in_flight(self, store: Store, key: str) -> None:
        """While a live lease holds the key, another caller is told to wait, with the holder."""
        first = store.claim(key, request(owner="holder-1"))
        second = store.claim(key, request())
        assert second.kind is ClaimKind.IN_FLIGHT
        assert second.token == first.token
        assert 0 < second.lease_ms <= LIVE_MS
        assert second.owner == "holder-1"

    def test_retried_claim_with_same_owner_gets_same_grant(self, store: Store, key: str) -> None:
        """A claim whose reply was lost can be retried with the same owner: same token, no conflict."""
        first = store.claim(key, request(owner="me"))
        again = store.claim(key, request(owner="me"))
        assert again.kind is ClaimKind.CLAIMED
        assert again.token == first.token

    def test_retried_claim_takes_a_fresh_lease(self, store: Store, key: str) -> None:
        """A retried claim whose first try's lease ran out while its reply was lost gets its
        grant back with a lease from the retry: nobody else takes the key over meanwhile."""
        first = store.claim(key, request(owner="me", lease_ms=SHORT_MS))
        expire()
        again = store.claim(key, request(owner="me"))
        assert again.kind is ClaimKind.CLAIMED
        assert (again.token, again.attempt) == (first.token, first.attempt)
        record = store.get(key)
        assert record is not None and record.status is Status.DISPATCHED and record.lease_live
        other = store.claim(key, request(can_reconcile=True, replay_safe=True))
        assert other.kind is ClaimKind.IN_FLIGHT
        assert other.owner == "me"

    def test_retried_reconcile_claim_takes_a_fresh_lease(self, store: Store, key: str) -> None:
        """The same for a reconcile lease, of a pending record and of an unknown one."""
        pending = store.claim(
            key, request(owner="p", lease_ms=SHORT_MS, can_reconcile=True, reconcile_first=True)
        )
        expire()
        again = store.claim(key, request(owner="p", can_reconcile=True, reconcile_first=True))
        assert (again.kind, again.token, again.status) == (ClaimKind.RECONCILE, pending.token, Status.PENDING)
        assert store.claim(key, request()).kind is ClaimKind.IN_FLIGHT
        assert store.dispatch(key, again.token, lease_ms=LIVE_MS) == 1
        assert store.mark_unknown(key, again.token, error="x")
        held = store.claim(key, request(owner="u", lease_ms=SHORT_MS, can_reconcile=True))
        expire()
        again = store.claim(key, request(owner="u", can_reconcile=True))
        assert (again.kind, again.token, again.status) == (ClaimKind.RECONCILE, held.token, Status.UNKNOWN)
        assert store.claim(key, request(can_reconcile=True)).kind is ClaimKind.IN_FLIGHT

    def test_missing_record_is_none(self, store: Store, key: str) -> None:
        """get() of a key never claimed is None."""
        assert store.get(key) is None

    # -- complete ----------------------------------------------------------------------

    def test_complete_then_claim_replays(self, store: Store, key: str) -> None:
        """A completed record answers every later claim with its result, in one call."""
        claim = store.claim(key, request())
        assert store.complete(
            key, claim.token, result=b'{"id":7}', result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        again = store.claim(key, request())
        assert again.kind is ClaimKind.COMPLETED
        assert again.result == b'{"id":7}'
        assert again.result_state is ResultState.STORED
        record = store.get(key)
        assert record is not None and record.status is Status.COMPLETED
        assert record.result == b'{"id":7}'
        assert record.expires_at is not None

    def test_complete_is_idempotent_for_its_token(self, store: Store, key: str) -> None:
        """Completing twice with the same token (a retried reply) succeeds and changes nothing."""
        claim = store.claim(key, request())
        kw = {"result": b"1", "result_state": ResultState.STORED, "retention_ms": RETENTION_MS}
        assert store.complete(key, claim.token, **kw)  # type: ignore[arg-type]
        assert store.complete(key, claim.token, **kw)  # type: ignore[arg-type]

    def test_complete_with_stale_token_is_refused(self, store: Store, key: str) -> None:
        """A token that does not hold the record cannot complete it."""
        claim = store.claim(key, request())
        assert not store.complete(
            key, claim.token + 1, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        record = store.get(key)
        assert record is not None and record.status is Status.DISPATCHED

    def test_complete_without_result(self, store: Store, key: str) -> None:
        """A result too large to keep is recorded as applied, without the result."""
        claim = store.claim(key, request())
        assert store.complete(
            key, claim.token, result=None, result_state=ResultState.TOO_LARGE, retention_ms=RETENTION_MS
        )
        again = store.claim(key, request())
        assert again.kind is ClaimKind.COMPLETED
        assert again.result_state is ResultState.TOO_LARGE
        assert not again.result

    def test_input_hash_is_kept(self, store: Store, key: str) -> None:
        """The input hash of the claim comes back with the completed record."""
        claim = store.claim(key, request(input_hash="abc123"))
        store.complete(
            key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        assert store.claim(key, request()).input_hash == "abc123"

    def test_completed_record_expires_after_retention(self, store: Store, key: str) -> None:
        """After the retention, a completed record is gone (and the key is free)."""
        claim = store.claim(key, request())
        store.complete(key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=SHORT_MS)
        expire()
        assert store.get(key) is None
        assert store.claim(key, request()).kind is ClaimKind.CLAIMED

    # -- release -----------------------------------------------------------------------

    def test_release_lets_the_next_call_apply(self, store: Store, key: str) -> None:
        """Released ("not applied") is claimable again, at the next attempt, with a new token."""
        first = store.claim(key, request())
        assert store.release(key, first.token, error="ValueError: no", retention_ms=RETENTION_MS)
        record = store.get(key)
        assert record is not None and record.status is Status.RELEASED
        assert "ValueError" in record.error
        second = store.claim(key, request())
        assert second.kind is ClaimKind.CLAIMED
        assert second.attempt == 2
        assert second.token > first.token

    def test_release_with_stale_token_is_refused(self, store: Store, key: str) -> None:
        """A stale token cannot release a record someone else holds."""
        claim = store.claim(key, request())
        assert not store.release(key, claim.token - 1, error="x", retention_ms=RETENTION_MS)

    # -- renew -------------------------------------------------------------------------

    def test_renew_keeps_the_holder_alive(self, store: Store, key: str) -> None:
        """A renewed lease outlives its first term; others still see the effect in flight."""
        claim = store.claim(key, request(lease_ms=SHORT_MS * 3))
        for _ in range(3):
            time.sleep(SHORT_MS / 1000)
            assert store.renew(key, claim.token, lease_ms=SHORT_MS * 3)
        assert store.claim(key, request()).kind is ClaimKind.IN_FLIGHT

    def test_renew_with_stale_token_is_refused(self, store: Store, key: str) -> None:
        """Only the holder renews."""
        claim = store.claim(key, request())
        assert not store.renew(key, claim.token + 1, lease_ms=LIVE_MS)

    # -- isolation and notifications ---------------------------------------------------

    def test_namespaces_are_isolated(self, store_factory: Callable[[str], Store], key: str) -> None:
        """The same key in two namespaces is two records."""
        a = store_factory(f"a{uuid.uuid4().hex[:10]}")
        b = store_factory(f"b{uuid.uuid4().hex[:10]}")
        claim = a.claim(key, request())
        a.complete(key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS)
        assert b.get(key) is None
        assert b.claim(key, request()).kind is ClaimKind.CLAIMED

    def test_watch_hears_completion(self, store: Store, key: str) -> None:
        """A watcher of a record in flight is called when it completes (someone having waited)."""
        claim = store.claim(key, request())
        assert store.claim(key, request()).kind is ClaimKind.IN_FLIGHT  # a waiter announces itself
        heard = threading.Event()
        unsubscribe = store.watch(key, heard.set)
        try:
            store.complete(
                key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS
            )
            assert heard.wait(5.0)
        finally:
            unsubscribe()
