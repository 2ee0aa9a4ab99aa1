"""The store contract's part on unknown outcomes: ``mark_unknown``, a lease that runs out
while dispatched, reconcile leases and their ``dispatch``, replay-safe re-runs, and an
operator's ``resolve``. Part of :class:`~effectq.testing.StoreContract` (which inherits it).
"""

from __future__ import annotations

import threading

import pytest

from ..errors import ResolveRefusedError
from ..store.base import Claim, ClaimKind, ResultState, Status, Store
from .contract_requests import LIVE_MS, RETENTION_MS, SHORT_MS, expire, request

__all__ = ["UnknownContract"]


class UnknownContract:
    """Tests every store must pass on unknown outcomes (the ``store`` and ``key`` fixtures are
    :class:`~effectq.testing.StoreContract`'s)."""

    # -- unknown -----------------------------------------------------------------------

    def test_mark_unknown_is_never_replayed(self, store: Store, key: str) -> None:
        """Unknown answers UNKNOWN, with why, to a caller that can neither reconcile nor replay."""
        claim = store.claim(key, request())
        assert store.mark_unknown(key, claim.token, error="TimeoutError: read timed out")
        again = store.claim(key, request())
        assert again.kind is ClaimKind.UNKNOWN
        assert "TimeoutError" in again.error
        record = store.get(key)
        assert record is not None and record.status is Status.UNKNOWN
        assert record.expires_at is None
        assert record.unknown_since is not None and record.updated_at is not None
        assert record.unknown_since <= record.updated_at

    def test_lease_running_out_while_dispatched_means_unknown(self, store: Store, key: str) -> None:
        """A dispatched record whose holder went silent is unknown, never re-dispatched."""
        first = store.claim(key, request(owner="dead-holder", lease_ms=SHORT_MS))
        lease_end = store.get(key).lease_expires_at  # type: ignore[union-attr]
        expire()
        again = store.claim(key, request())
        assert again.kind is ClaimKind.UNKNOWN
        assert "lease expired" in again.error
        assert "dead-holder" in again.error
        record = store.get(key)
        assert record is not None and record.token == first.token
        assert record.unknown_since == lease_end, "unknown since the lease ran out, not since noticed"

    def test_reconcile_lease_is_exclusive(self, store: Store, key: str) -> None:
        """One caller at a time reconciles an unknown; the others wait."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        first = store.claim(key, request(can_reconcile=True))
        assert first.kind is ClaimKind.RECONCILE
        assert first.token > claim.token
        assert first.status is Status.UNKNOWN
        second = store.claim(key, request(can_reconcile=True))
        assert second.kind is ClaimKind.IN_FLIGHT

    def test_reconcile_found_completes(self, store: Store, key: str) -> None:
        """A reconciler that found the effect records it as completed with its token."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        rec = store.claim(key, request(can_reconcile=True))
        assert store.complete(
            key, rec.token, result=b"5", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        assert store.claim(key, request()).kind is ClaimKind.COMPLETED

    def test_reconcile_failure_keeps_unknown(self, store: Store, key: str) -> None:
        """Giving back a reconcile lease leaves the record unknown, for the next reconciler."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        rec = store.claim(key, request(can_reconcile=True))
        assert store.release(key, rec.token, error="lookup failed", retention_ms=RETENTION_MS)
        record = store.get(key)
        assert record is not None and record.status is Status.UNKNOWN
        assert store.claim(key, request()).kind is ClaimKind.UNKNOWN
        assert store.claim(key, request(can_reconcile=True)).kind is ClaimKind.RECONCILE

    def test_reconcile_not_found_dispatches_under_new_token(self, store: Store, key: str) -> None:
        """Reconcile found nothing: the reconciler executes, and the old holder is fenced out."""
        old = store.claim(key, request(lease_ms=SHORT_MS))
        expire()
        rec = store.claim(key, request(can_reconcile=True))
        assert rec.kind is ClaimKind.RECONCILE
        attempt = store.dispatch(key, rec.token, lease_ms=LIVE_MS)
        assert attempt == 2
        record = store.get(key)
        assert record is not None and record.status is Status.DISPATCHED
        assert not store.renew(key, old.token, lease_ms=LIVE_MS)
        assert not store.complete(
            key, old.token, result=b"old", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        assert store.complete(
            key, rec.token, result=b"new", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        assert store.claim(key, request()).result == b"new"

    def test_holder_of_an_unknown_cannot_redispatch_it(self, store: Store, key: str) -> None:
        """Only a reconcile lease turns an unknown back into a dispatch, not the old token."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        assert store.dispatch(key, claim.token, lease_ms=LIVE_MS) == 0
        record = store.get(key)
        assert record is not None and record.status is Status.UNKNOWN

    def test_late_holder_may_settle_its_own_unknown(self, store: Store, key: str) -> None:
        """A slow holder whose lease ran out, with nobody taking over, can still record the truth."""
        old = store.claim(key, request(lease_ms=SHORT_MS))
        expire()
        assert store.claim(key, request()).kind is ClaimKind.UNKNOWN
        assert store.complete(
            key, old.token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        assert store.claim(key, request()).kind is ClaimKind.COMPLETED

    def test_replay_safe_redispatches_unknown(self, store: Store, key: str) -> None:
        """A replay-safe caller re-executes an unknown under a new token (the remote dedupes)."""
        first = store.claim(key, request())
        store.mark_unknown(key, first.token, error="x")
        again = store.claim(key, request(replay_safe=True))
        assert again.kind is ClaimKind.CLAIMED
        assert again.attempt == 2
        assert again.token > first.token

    @staticmethod
    def _rerun_unknown(
        store: Store, key: str, *, replay_safe: bool = False, can_reconcile: bool = False
    ) -> Claim:
        """An unknown recorded by run-1 with input h100, claimed again by run-2 with input h250."""
        first = store.claim(key, request(input_hash="h100"))
        store.mark_unknown(key, first.token, error="x")
        again = request(
            input_hash="h250", run_id="run-2", replay_safe=replay_safe, can_reconcile=can_reconcile
        )
        return store.claim(key, again)

    @staticmethod
    def _identities(store: Store, key: str, token: int) -> tuple[tuple[str, str], str]:
        """(run id, input hash) of the record now, and the input hash a replay reports once
        ``token`` completed it."""
        record = store.get(key)
        assert record is not None
        store.complete(key, token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS)
        return (record.run_id, record.input_hash), store.claim(key, request()).input_hash

    def test_replay_safe_rerun_owns_the_record(self, store: Store, key: str) -> None:
        """The re-run of an unknown is what executes: the record takes its run id and input hash."""
        again = self._rerun_unknown(store, key, replay_safe=True)
        assert again.kind is ClaimKind.CLAIMED
        assert self._identities(store, key, again.token) == (("run-2", "h250"), "h250")

    def test_reconcile_asks_about_the_recorded_attempt(self, store: Store, key: str) -> None:
        """A reconcile lease on an unknown keeps the recorded attempt's identity, and the claim
        says which input that attempt had; a reconciler that found it completes it as recorded."""
        rec = self._rerun_unknown(store, key, can_reconcile=True)
        assert (rec.kind, rec.input_hash) == (ClaimKind.RECONCILE, "h100")
        assert self._identities(store, key, rec.token) == (("run-1", "h100"), "h100")

    def test_dispatch_after_reconcile_owns_the_record(self, store: Store, key: str) -> None:
        """A reconciler that found nothing and dispatches is what executes: the record takes its
        run id and input hash."""
        rec = self._rerun_unknown(store, key, can_reconcile=True)
        assert store.dispatch(key, rec.token, lease_ms=LIVE_MS) == 2
        assert self._identities(store, key, rec.token) == (("run-2", "h250"), "h250")

    def test_reconcile_first_starts_pending(self, store: Store, key: str) -> None:
        """reconcile_first claims PENDING (nothing runs yet); dispatch makes it the first attempt."""
        claim = store.claim(key, request(can_reconcile=True, reconcile_first=True))
        assert claim.kind is ClaimKind.RECONCILE
        assert claim.status is Status.PENDING
        assert store.claim(key, request()).kind is ClaimKind.IN_FLIGHT
        assert store.dispatch(key, claim.token, lease_ms=LIVE_MS) == 1

    def test_retried_dispatch_takes_a_fresh_lease(self, store: Store, key: str) -> None:
        """A dispatch retried with the same token (its reply was lost) gets the same attempt back,
        with a lease from the retry, though the first try's ran out meanwhile."""
        claim = store.claim(key, request(lease_ms=SHORT_MS, can_reconcile=True, reconcile_first=True))
        assert store.dispatch(key, claim.token, lease_ms=SHORT_MS) == 1
        expire()
        assert store.dispatch(key, claim.token, lease_ms=LIVE_MS) == 1
        record = store.get(key)
        assert record is not None and record.status is Status.DISPATCHED and record.lease_live
        assert store.claim(key, request(can_reconcile=True)).kind is ClaimKind.IN_FLIGHT

    def test_pending_holder_dying_frees_the_key(self, store: Store, key: str) -> None:
        """A pending record whose lease ran out never ran: the next caller claims it afresh."""
        store.claim(key, request(lease_ms=SHORT_MS, can_reconcile=True, reconcile_first=True))
        expire()
        claim = store.claim(key, request())
        assert claim.kind is ClaimKind.CLAIMED
        assert claim.attempt == 1

    # -- resolve -----------------------------------------------------------------------

    def test_resolve_applied(self, store: Store, key: str) -> None:
        """An operator settles an unknown as applied, with a result; later calls replay it."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        record = store.resolve(
            key, applied=True, result=b'"ok"', note="alice: seen in the CRM", retention_ms=RETENTION_MS
        )
        assert record.status is Status.COMPLETED
        again = store.claim(key, request())
        assert again.kind is ClaimKind.COMPLETED
        assert again.result == b'"ok"'
        assert not store.complete(
            key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )

    def test_resolve_applied_without_result(self, store: Store, key: str) -> None:
        """Settled as applied with no result known: later claims replay "applied, result not recorded"."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        record = store.resolve(
            key, applied=True, result_state=ResultState.RESOLVED_WITHOUT_RESULT, retention_ms=RETENTION_MS
        )
        assert record.status is Status.COMPLETED
        assert record.result is None
        again = store.claim(key, request())
        assert again.kind is ClaimKind.COMPLETED
        assert again.result_state is ResultState.RESOLVED_WITHOUT_RESULT
        assert not again.result

    def test_resolve_applied_without_a_result_says_so(self, store: Store, key: str) -> None:
        """Settled as applied with no result given: a replay is told there is none to return."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        store.resolve(key, applied=True, retention_ms=RETENTION_MS)
        again = store.claim(key, request())
        assert again.kind is ClaimKind.COMPLETED
        assert again.result_state is ResultState.RESOLVED_WITHOUT_RESULT

    def test_resolve_not_applied(self, store: Store, key: str) -> None:
        """Settled as not applied, the next call applies the effect."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        assert store.resolve(key, applied=False, retention_ms=RETENTION_MS).status is Status.RELEASED
        assert store.claim(key, request()).kind is ClaimKind.CLAIMED

    def test_resolve_refuses_what_is_not_in_doubt(self, store: Store, key: str) -> None:
        """Completed, released, live in-flight and missing records are never resolved."""
        with pytest.raises(ResolveRefusedError) as missing:
            store.resolve(key, applied=True, retention_ms=RETENTION_MS)
        assert missing.value.status is None
        claim = store.claim(key, request())
        with pytest.raises(ResolveRefusedError) as live:
            store.resolve(key, applied=False, retention_ms=RETENTION_MS)
        assert live.value.status == "dispatched"
        store.complete(
            key, claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=RETENTION_MS
        )
        with pytest.raises(ResolveRefusedError) as done:
            store.resolve(key, applied=False, retention_ms=RETENTION_MS)
        assert done.value.status == "completed"

    def test_resolve_race_has_one_winner(self, store: Store, key: str) -> None:
        """Two operators settling the same unknown at once: exactly one succeeds."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        outcomes: list[str] = []
        barrier = threading.Barrier(2)

        def settle(applied: bool) -> None:
            barrier.wait()
            try:
                store.resolve(key, applied=applied, retention_ms=RETENTION_MS)
                outcomes.append("won")
            except ResolveRefusedError:
                outcomes.append("refused")

        threads = [threading.Thread(target=settle, args=(flag,)) for flag in (True, False)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["refused", "won"]

    @pytest.mark.parametrize("applied", [True, False])
    def test_resolve_repeated_as_settled_reports_it(self, store: Store, key: str, applied: bool) -> None:
        """A resolve finding the record settled exactly as it asks (the same outcome, result and
        note: its own first try, resent after a lost reply) reports it settled, unchanged; any
        other decision is refused."""
        claim = store.claim(key, request())
        store.mark_unknown(key, claim.token, error="x")
        asked = {"applied": applied, "result": b"1" if applied else None, "note": "ops"}
        first = store.resolve(key, retention_ms=RETENTION_MS, **asked)  # type: ignore[arg-type]
        again = store.resolve(key, retention_ms=RETENTION_MS, **asked)  # type: ignore[arg-type]
        assert (again.status, again.token, again.result) == (first.status, first.token, first.result)
        others = [{**asked, "note": "someone else"}, {**asked, "applied": not applied, "result": None}]
        if applied:
            others += [{**asked, "result": b"2"}, {**asked, "result": None}]
        for other in others:
            with pytest.raises(ResolveRefusedError):
                store.resolve(key, retention_ms=RETENTION_MS, **other)  # type: ignore[arg-type]

    def test_resolve_never_takes_an_effects_own_outcome_for_its_own(self, store: Store, key: str) -> None:
        """A record the effect completed or released itself is refused, whatever the resolve asks."""
        claim = store.claim(key, request())
        kept = {"result_state": ResultState.STORED, "retention_ms": RETENTION_MS}
        store.complete(key, claim.token, result=b"1", **kept)  # type: ignore[arg-type]
        with pytest.raises(ResolveRefusedError):
            store.resolve(key, applied=True, result=b"1", note="ops", retention_ms=RETENTION_MS)
        other = f"{key}-released"
        claim = store.claim(other, request())
        store.release(other, claim.token, error="ValueError: no", retention_ms=RETENTION_MS)
        with pytest.raises(ResolveRefusedError):
            store.resolve(other, applied=False, note="ops", retention_ms=RETENTION_MS)

    def test_resolve_dispatched_with_dead_holder(self, store: Store, key: str) -> None:
        """A dispatched record whose lease ran out is in doubt, so an operator may settle it."""
        store.claim(key, request(lease_ms=SHORT_MS))
        expire()
        assert (
            store.resolve(key, applied=True, result=b"1", retention_ms=RETENTION_MS).status
            is Status.COMPLETED
        )
