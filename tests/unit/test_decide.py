"""The procedure's decisions, called directly: each is a plain function of what the store said."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

import effectq
from effectq._engine import failures
from effectq._engine.decide import (
    MAX_BLOCK,
    Failure,
    Next,
    after_claim,
    after_failure,
    failed,
    may_have_applied,
    reply_unread,
    wait_for,
)
from effectq.store.base import Claim, ClaimKind


@pytest.mark.parametrize(
    ("kind", "then"),
    [
        (ClaimKind.COMPLETED, Next.REPLAY),
        (ClaimKind.CLAIMED, Next.EXECUTE),
        (ClaimKind.RECONCILE, Next.RECONCILE),
        (ClaimKind.IN_FLIGHT, Next.WAIT),
        (ClaimKind.UNKNOWN, Next.RAISE),
        (ClaimKind.FAILED, Next.FAIL),
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


class Declined(Exception):
    pass


def test_a_terminal_exception_is_failed_before_maybe_applied_is_asked() -> None:
    """Declared terminal: failed, even if maybe_applied names it too; anything else as before."""
    terminal = [Declined, "builtins.LookupError"]
    options = effectq.effect(
        name="decide.terminal", terminal=terminal, maybe_applied=[Declined, TimeoutError]
    )(lambda: None).options
    assert after_failure(options, Declined("no")) is Failure.TERMINAL
    assert after_failure(options, KeyError("k")) is Failure.TERMINAL  # a subclass of a named type
    assert after_failure(options, TimeoutError()) is Failure.UNKNOWN
    assert after_failure(options, ValueError()) is Failure.RELEASE
    plain = effectq.effect(name="decide.plain")(lambda: None).options
    assert after_failure(plain, Declined("no")) is Failure.RELEASE


class _Call:
    """What :func:`failed` reads of a call."""

    key = "run:decide.failed:ab"

    class effect:
        name = "decide.failed"

    class store:
        namespace = "shop"


def test_a_failed_claim_raises_the_recorded_exception_or_attempts_exhausted() -> None:
    call: Any = _Call()
    recorded = Claim(ClaimKind.FAILED, attempt=1, failure=failures.record(Declined("card declined")))
    again = failed(call, recorded)
    assert type(again) is Declined and str(again) == "card declined"
    assert isinstance(again.__cause__, effectq.RecordedFailure) and again.__cause__.key == call.key
    parked = failed(call, Claim(ClaimKind.FAILED, attempt=3, error="builtins.MemoryError: "))
    assert isinstance(parked, effectq.AttemptsExhausted)
    assert (parked.key, parked.attempts, parked.last_error, parked.namespace) == (
        call.key, 3, "builtins.MemoryError: ", "shop",
    )  # fmt: skip
    unreadable = failed(call, Claim(ClaimKind.FAILED, failure="{not json"))
    assert isinstance(unreadable, effectq.RecordedFailure) and "not readable" in unreadable.detail


def test_a_terminal_exception_s_record_is_bounded_json() -> None:
    """The message is cut at MAX_MESSAGE (the arguments still rebuild it whole); arguments that
    are not JSON, or too large, are recorded as null."""
    long = failures.record(Declined("x" * 5000))
    assert len(json.loads(long)["message"]) == failures.MAX_MESSAGE
    assert str(failures.rebuilt(long, key="k", name="n", namespace="")) == "x" * 5000
    huge = json.loads(failures.record(Declined("y" * failures.MAX_ARGS_BYTES)))
    assert huge["args"] is None
    odd = json.loads(failures.record(Declined(object())))
    assert odd["args"] is None and odd["type"] == f"{__name__}.Declined"
