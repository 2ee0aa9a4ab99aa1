"""The store contract's part on FAILED records: ``fail``, the attempts cap of ``claim`` and
``dispatch``, and ``resolve`` and ``purge`` of a failed record. Part of
:class:`~effectq.testing.StoreContract` (which inherits it).
"""

from __future__ import annotations

import pytest

from ..store.base import ClaimKind, ClaimRequest, ResultState, Status, Store
from ..store.operators import OperatorStore
from .contract_requests import RETENTION_MS, request

__all__ = ["FailedContract"]

KEEP = RETENTION_MS
"""A lease and a retention no test outlasts."""


def _capped(
    owner: str, cap: int = 0, *, replay_safe: bool = False, can_reconcile: bool = False
) -> ClaimRequest:
    """The contract's request (:func:`request`), with a lease no test outlasts and at most ``cap``
    attempts (0: no cap)."""
    return request(owner, KEEP, can_reconcile=can_reconcile, replay_safe=replay_safe, max_attempts=cap)


def _released_times(store: Store, key: str, times: int) -> int:
    """Claim and release ``times`` times (no cap); the last token."""
    token = 0
    for n in range(times):
        claim = store.claim(key, _capped(f"o{n}"))
        assert claim.kind is ClaimKind.CLAIMED and claim.attempt == n + 1
        token = claim.token
        assert store.release(key, token, error=f"declined #{n + 1}", retention_ms=KEEP)
    return token


class FailedContract:
    """Tests every store must pass on failed records (the ``store`` and ``key`` fixtures are
    :class:`~effectq.testing.StoreContract`'s)."""

    def test_fail_records_a_terminal_exception_that_every_claim_replies(self, store: Store, key: str) -> None:
        claim = store.claim(key, _capped("o1"))
        failure = '{"type": "shop.CardDeclined", "message": "no", "args": ["no"]}'
        assert store.fail(key, claim.token, error="shop.CardDeclined: no", failure=failure, retention_ms=KEEP)
        assert store.fail(key, claim.token, error="shop.CardDeclined: no", failure=failure, retention_ms=KEEP)
        assert not store.fail(key, claim.token + 1, error="x", failure=failure, retention_ms=KEEP)
        for owner in ("o2", "o3"):
            again = store.claim(key, _capped(owner, cap=3, replay_safe=True, can_reconcile=True))
            assert (again.kind, again.failure) == (ClaimKind.FAILED, failure)
            assert again.error == "shop.CardDeclined: no"
        # the holder's other writes are refused: the record is settled
        stored = ResultState.STORED
        assert not store.complete(key, claim.token, result=b"1", result_state=stored, retention_ms=KEEP)
        assert not store.release(key, claim.token, error="x", retention_ms=KEEP)
        assert not store.mark_unknown(key, claim.token, error="x")
        assert not store.renew(key, claim.token, lease_ms=KEEP)
        record = store.get(key)
        assert record is not None
        assert (record.status, record.failure, record.attempt) == (Status.FAILED, failure, 1)
        assert record.expires_at is not None and record.lease_expires_at is None

    def test_a_claim_past_max_attempts_parks_the_record(self, store: Store, key: str) -> None:
        """Three releases: a fourth claim with max_attempts=3 is refused and the record parked (the
        token bumped, the last error kept); without a cap it would have run."""
        token = _released_times(store, key, 3)
        parked = store.claim(key, _capped("o4", cap=3))
        assert (parked.kind, parked.attempt, parked.error) == (ClaimKind.FAILED, 3, "declined #3")
        assert (parked.token, parked.failure) == (token + 1, "")
        assert store.claim(key, _capped("o5", cap=10)).kind is ClaimKind.FAILED  # parked stays parked
        record = store.get(key)
        assert record is not None
        assert (record.status, record.error, record.owner) == (Status.FAILED, "declined #3", "")

    def test_a_grant_given_back_before_it_ran_does_not_count(self, store: Store, key: str) -> None:
        """``ran=False`` (a claim given back: its reply was lost, a time limit cut in before the
        function): the attempts go back down, so a key is parked after executions only."""
        for n in range(4):
            claim = store.claim(key, _capped(f"o{n}", cap=1))
            assert (claim.kind, claim.attempt) == (ClaimKind.CLAIMED, 1)
            assert store.release(key, claim.token, error="never run", retention_ms=KEEP, ran=False)
        claim = store.claim(key, _capped("o5", cap=1))
        assert store.mark_unknown(key, claim.token, error="timed out")
        again = store.claim(key, _capped("o6", cap=2, replay_safe=True))
        assert (again.kind, again.attempt) == (ClaimKind.CLAIMED, 2)
        assert store.mark_unknown(key, again.token, error="timed out", ran=False)  # given back
        record = store.get(key)
        assert record is not None and (record.status, record.attempt) == (Status.UNKNOWN, 1)

    def test_a_claim_under_the_cap_runs(self, store: Store, key: str) -> None:
        _released_times(store, key, 2)
        claim = store.claim(key, _capped("o3", cap=3))
        assert (claim.kind, claim.attempt) == (ClaimKind.CLAIMED, 3)

    def test_a_replay_safe_re_run_past_the_cap_parks(self, store: Store, key: str) -> None:
        claim = store.claim(key, _capped("o1"))
        assert store.mark_unknown(key, claim.token, error="timed out")
        parked = store.claim(key, _capped("o2", cap=1, replay_safe=True))
        assert (parked.kind, parked.error) == (ClaimKind.FAILED, "timed out")
        if isinstance(store, OperatorStore):  # no longer in doubt: not listed as unknown
            assert list(store.in_doubt()) == []

    def test_a_dispatch_past_the_cap_parks(self, store: Store, key: str) -> None:
        """After a reconcile that found nothing, the dispatch would start attempt 2 of 1: parked (-1)."""
        claim = store.claim(key, _capped("o1"))
        assert store.mark_unknown(key, claim.token, error="timed out")
        lease = store.claim(key, _capped("o2", cap=1, can_reconcile=True))
        assert lease.kind is ClaimKind.RECONCILE
        assert store.dispatch(key, lease.token, lease_ms=KEEP, max_attempts=1, retention_ms=KEEP) == -1
        record = store.get(key)
        assert record is not None and (record.status, record.attempt) == (Status.FAILED, 1)
        assert store.dispatch(key, lease.token, lease_ms=KEEP, max_attempts=1, retention_ms=KEEP) == 0

    def test_resolve_not_applied_resets_a_failed_record_and_its_attempts(
        self, store: Store, key: str
    ) -> None:
        _released_times(store, key, 2)
        assert store.claim(key, _capped("o3", cap=2)).kind is ClaimKind.FAILED
        record = store.resolve(key, applied=False, note="fixed the relay", retention_ms=KEEP)
        assert (record.status, record.attempt, record.error) == (Status.RELEASED, 0, "fixed the relay")
        claim = store.claim(key, _capped("o4", cap=2))
        assert (claim.kind, claim.attempt) == (ClaimKind.CLAIMED, 1)

    def test_resolve_applied_settles_a_failed_record(self, store: Store, key: str) -> None:
        claim = store.claim(key, _capped("o1"))
        failure = '{"type": "x.Y", "message": "m"}'
        assert store.fail(key, claim.token, error="e", failure=failure, retention_ms=KEEP)
        record = store.resolve(key, applied=True, result=b'"found"', note="it did apply", retention_ms=KEEP)
        assert record.status is Status.COMPLETED
        assert store.claim(key, _capped("o2")).result == b'"found"'

    def test_purge_deletes_a_failed_record(self, store: Store, key: str) -> None:
        if not isinstance(store, OperatorStore):
            pytest.skip("not an operator store")
        _released_times(store, key, 1)
        store.claim(key, _capped("o2", cap=1))
        record = store.get(key)
        assert record is not None and record.status is Status.FAILED
        assert store.purge(record)
        assert store.get(key) is None
