"""The procedure's decisions, as plain functions: each is made here once, and tests call them.

A claim's reply says what comes next (:func:`after_claim`); an effect in flight is waited
for or given up on (:func:`wait_for`); a replay's value is checked and decoded
(:func:`replayed`); a failed record is raised again (:func:`failed`); a function that raised
is recorded as unknown, released or failed (:func:`after_failure`); a completion whose reply
was never read is written again (:func:`reply_unread`). None of them does I/O:
:mod:`.procedure` yields the store operations they lead to.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, Any

from ..codec import DecodeError
from ..errors import (
    AttemptsExhausted,
    CorruptRecordError,
    InputMismatchError,
    ResultDecodeError,
    ResultNotRecordedError,
)
from ..options import OnMismatch, is_time_limit
from ..store.base import Claim, ClaimKind, ResultState
from . import failures

if TYPE_CHECKING:
    from ..options import EffectOptions
    from .calls import Call

__all__ = [
    "MAX_BLOCK",
    "Failure",
    "Next",
    "after_claim",
    "after_failure",
    "check_input",
    "exhausted",
    "failed",
    "is_crash",
    "may_have_applied",
    "replayed",
    "reply_unread",
    "wait_for",
]

log_replay = logging.getLogger("effectq.replay")
_DEBUG = logging.DEBUG

MAX_BLOCK = 2.0
"""Longest single wait for a notification before re-checking the store (a missed
notification costs at most this much latency)."""


class Next(enum.Enum):
    """What a claim's reply says to do."""

    REPLAY = "replay"  # completed: return the recorded result
    EXECUTE = "execute"  # granted: run the function
    RECONCILE = "reconcile"  # granted a reconcile lease: ask the remote system first
    WAIT = "wait"  # in flight elsewhere: wait for it, up to the effect's ``wait``
    RAISE = "raise"  # unknown, and this caller may neither reconcile nor re-run it
    FAIL = "fail"  # failed: raise the recorded terminal exception, or AttemptsExhausted


class Failure(enum.Enum):
    """What the function's exception means, as the record keeps it (the store primitive's name)."""

    RELEASE = "release"  # not applied: the next call applies the effect
    UNKNOWN = "mark_unknown"  # maybe applied
    TERMINAL = "fail"  # declared terminal: recorded, and raised again by every later call


_NEXT = {
    ClaimKind.COMPLETED: Next.REPLAY,
    ClaimKind.CLAIMED: Next.EXECUTE,
    ClaimKind.RECONCILE: Next.RECONCILE,
    ClaimKind.IN_FLIGHT: Next.WAIT,
    ClaimKind.UNKNOWN: Next.RAISE,
    ClaimKind.FAILED: Next.FAIL,
}
_NEXT_BY_ID = {id(kind): then for kind, then in _NEXT.items()}
""":data:`_NEXT` keyed by identity: an Enum member's hash is a call of Python's ``Enum.__hash__``."""

# Read on every replay (module globals: on Python 3.11 an Enum member read off its class costs
# a call of EnumType's __getattr__ hook).
_STORED, _WITHHELD = ResultState.STORED, ResultState.WITHHELD


def after_claim(claim: Claim) -> Next:
    """What to do with ``claim``, the store's reply to a claim."""
    return _NEXT_BY_ID[id(claim.kind)]


def wait_for(claim: Claim, waited: float, wait: float) -> float | None:
    """How long to block for a notification about ``claim`` (in flight elsewhere), having
    waited ``waited`` of the effect's ``wait`` seconds; None: give up (InProgress).

    Never past the holder's lease (then the record may be free), nor longer than
    :data:`MAX_BLOCK` (a missed notification costs at most that)."""
    remaining = wait - waited
    if remaining <= 0:
        return None
    return min(remaining, claim.lease_ms / 1000.0 + 0.05, MAX_BLOCK)


def is_crash(exc: BaseException) -> bool:
    """A simulated process death: no store write may follow it (see effectq.testing)."""
    return getattr(exc, "effectq_crash", False) is True


def may_have_applied(options: EffectOptions, exc: BaseException, *, classifier_fails: bool = False) -> bool:
    """Whether the function's exception ``exc`` may mean it applied: recorded as unknown
    rather than released. ``classifier_fails``: what a classifier that raises says (only
    where nothing may raise any more, as in a background write)."""
    if not classifier_fails:
        return options.maybe_applied(exc)
    try:
        return options.maybe_applied(exc)
    except Exception:  # a classifier that raises: maybe applied
        return True


def after_failure(options: EffectOptions, exc: BaseException, *, classifier_fails: bool = False) -> Failure:
    """How the function's exception ``exc`` is recorded. A terminal one (``terminal=``; never a
    ``BaseException`` that is no ``Exception``, nor one a signal handler raised) is failed, before
    ``maybe_applied`` is asked; then as :func:`may_have_applied` says."""
    terminal = options.terminal
    if terminal is not None and terminal(exc):
        return Failure.TERMINAL
    if may_have_applied(options, exc, classifier_fails=classifier_fails):
        return Failure.UNKNOWN
    return Failure.RELEASE


def failed(call: Call, claim: Claim) -> BaseException:
    """What a FAILED claim raises: the recorded terminal exception, rebuilt (or
    :class:`~effectq.errors.RecordedFailure`), or, for a key parked after its attempts ran
    out, :class:`~effectq.errors.AttemptsExhausted`."""
    name, namespace = call.effect.name, call.store.namespace
    if claim.failure:
        return failures.rebuilt(claim.failure, key=call.key, name=name, namespace=namespace)
    return exhausted(call, claim.attempt, claim.error)


def exhausted(call: Call, attempts: int, last_error: str) -> AttemptsExhausted:
    """The error of a key parked after ``attempts`` executions (the claim or the dispatch parked it)."""
    return AttemptsExhausted(call.key, call.effect.name, attempts, last_error, call.store.namespace)


def reply_unread(outcome: BaseException) -> bool:
    """Whether a pipelined completion's failure ``outcome`` means only that its reply was not
    read (the caller was cancelled, interrupted or hit a time limit while it waited): Redis
    most likely ran it, and writing it again (the same token) only makes sure."""
    cause = outcome.__cause__
    return isinstance(cause, asyncio.CancelledError | KeyboardInterrupt) or (
        cause is not None and is_time_limit(cause)
    )


def check_input(call: Call, recorded_hash: str) -> None:
    """A key recorded with another input than this call's: raise, or warn (``on_mismatch``)."""
    effect = call.effect
    if call.input_hash and recorded_hash and call.input_hash != recorded_hash:
        if effect.options.on_mismatch is OnMismatch.RAISE:
            raise InputMismatchError(
                call.key, name=effect.name, recorded_hash=recorded_hash, input_hash=call.input_hash
            )
        log_replay.warning(
            "effectq %s key %s was recorded with a different input (%s, now %s); returning the "
            "recorded result",
            effect.name,
            call.key,
            recorded_hash[:12],
            call.input_hash[:12],
        )


def replayed(call: Call, claim: Claim) -> Any:
    """The recorded result ``claim`` (completed) replays, decoded; or what it raises instead."""
    effect = call.effect
    check_input(call, claim.input_hash)
    call.run.stats.replayed += 1
    if log_replay.isEnabledFor(_DEBUG):  # what debug() asks first, without its call
        log_replay.debug("effectq replay %s", call.key)
    if claim.result_state is not _STORED:
        if claim.result_state is _WITHHELD:
            return None  # applied, its result kept out of the store on purpose
        raise ResultNotRecordedError(call.key, name=effect.name, reason=claim.result_state.value)
    if claim.result is None:
        raise CorruptRecordError(call.key, "completed without a result")
    try:
        return effect.codec.decode(claim.result)
    except DecodeError as exc:
        raise ResultDecodeError(call.key, name=effect.name, detail=str(exc).splitlines()[0]) from exc
