"""The procedure's decisions, called directly: each is a plain function of what the store said."""

from __future__ import annotations

import asyncio

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

import effectq
from effectq._engine.decide import MAX_BLOCK, Next, after_claim, may_have_applied, reply_unread, wait_for
from effectq.store.base import Claim, ClaimKind


@pytest.mark.parametrize(
    ("kind", "then"),
    [
        (ClaimKind.COMPLETED, Next.REPLAY),
        (ClaimKind.CLAIMED, Next.EXECUTE),
        (ClaimKind.RECONCILE, Next.RECONCILE),
        (ClaimKind.IN_FLIGHT, Next.WAIT),
        (ClaimKind.UNKNOWN, Next.RAISE),
    ],
)
def test_a_claim_reply_says_what_comes_next(kind: ClaimKind, then: Next) -> None:
    assert after_claim(Claim(kind)) is then


def test_a_wait_blocks_no_longer_than_what_is_left_the_holder_s_lease_or_the_cap() -> None:
    in_flight = Claim(ClaimKind.IN_FLIGHT, lease_ms=400)
    assert wait_for(in_flight, waited=9.9, wait=10.0) == pytest.approx(0.1)
    assert wait_for(in_flight, waited=0.0, wait=10.0) == pytest.approx(0.45)
    assert wait_for(Claim(ClaimKind.IN_FLIGHT, lease_ms=60_000), waited=0.0, wait=10.0) == MAX_BLOCK
    assert wait_for(in_flight, waited=10.0, wait=10.0) is None  # given up: InProgress


def _failure(cause: BaseException | None) -> effectq.StoreError:
    failure = effectq.StoreError("effectq complete failed on Redis")
    failure.__cause__ = cause
    return failure


def test_a_reply_cut_short_by_the_caller_is_unread_not_a_failure() -> None:
    assert reply_unread(_failure(asyncio.CancelledError()))
    assert reply_unread(_failure(KeyboardInterrupt()))
    assert reply_unread(_failure(SoftTimeLimitExceeded()))
    assert not reply_unread(_failure(ConnectionError("reset")))
    assert not reply_unread(_failure(None))


def test_a_classifier_that_raises_means_maybe_applied_only_where_nothing_may_raise() -> None:
    def broken(exc: BaseException) -> bool:
        raise RuntimeError("classifier bug")

    options = effectq.effect(name="decide.broken", maybe_applied=broken)(lambda: None).options
    assert may_have_applied(options, ValueError(), classifier_fails=True)
    with pytest.raises(RuntimeError):
        may_have_applied(options, ValueError())
