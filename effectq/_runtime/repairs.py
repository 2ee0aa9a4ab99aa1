"""Deferred writes: what a call hands to the background thread when it cannot finish a
write itself (a store error, an exception raised into the call), and what a refused one
means for an operator.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import events
from .._engine.calls import Call, _emit
from .._engine.decide import Failure, after_failure, is_crash, reply_unread
from .._engine.failures import fail_kwargs
from .._exceptions import describe_exception
from ..errors import (
    ClaimNotReplicatedError,
    StoreError,
)
from ..events import EventKind
from ..store.base import ClaimKind
from .leases import Lease, heartbeat

log_complete = logging.getLogger("effectq.complete")
log_release = logging.getLogger("effectq.release")

if TYPE_CHECKING:
    pass


def _take_back_later(call: Call, what: str, after: float | None = None) -> None:
    """A claim that may have landed with nothing run under it: the heartbeat takes it back
    (the same owner gets its grant again) and releases it, unless someone else holds the key.
    ``after``: seconds before the first try (default: a short random pause)."""
    heartbeat.defer(
        _abandon(call),
        f"release of the {what} claim of {call.key}",
        for_seconds=600.0,
        store=call.store,
        advice=_advice(call, "The effect did not run", "--not-applied"),
        after=after,
    )


def _abandon(call: Call) -> Callable[[], None]:
    def abandon() -> None:
        try:
            claim = call.store.claim(call.key, call.request)  # our grant back, or a new one: nothing ran
        except ClaimNotReplicatedError as exc:  # it landed on the primary all the same
            claim = exc.claim
        if claim.kind in (ClaimKind.CLAIMED, ClaimKind.RECONCILE):
            call.store.release(
                call.key,
                claim.token,
                error="claim reply lost; never run",
                retention_ms=call.effect.options.retention_ms,
                ran=False,
            )

    return abandon


def _give_back_later(call: Call, token: int) -> None:
    """A dispatch that may have landed with nothing run under it: the heartbeat releases it."""
    store, key = call.store, call.key
    retention_ms = call.effect.options.retention_ms
    heartbeat.defer(
        lambda: store.release(
            key, token, error="dispatch reply lost; never run", retention_ms=retention_ms, ran=False
        ),
        f"release of the unanswered dispatch of {key}",
        for_seconds=600.0,
        store=store,
        advice=_advice(call, "The effect did not run", "--not-applied"),
    )


def _failed_later(
    call: Call, token: int, lease: Lease | None, exc: BaseException, cut: BaseException
) -> None:
    """The function raised ``exc``, and ``cut`` (a time limit) landed before :func:`_failed` had
    written what it means: the write goes to the heartbeat, tried at once. (If it had landed
    already, writing it again changes nothing.)"""
    if lease is not None:
        heartbeat.drop(lease)
    if is_crash(exc) or is_crash(cut):
        return
    effect, store, key = call.effect, call.store, call.key
    outcome = after_failure(effect.options, exc, classifier_fails=True)
    error = describe_exception(exc)
    if outcome is Failure.TERMINAL:
        kwargs = fail_kwargs(exc, effect.options.retention_ms)
        _write_later("fail", call, store.fail, (key, token), kwargs, cut)
    elif outcome is Failure.UNKNOWN:
        _write_later("mark_unknown", call, store.mark_unknown, (key, token), {"error": error}, cut)
    else:
        kwargs = {"error": error, "retention_ms": effect.options.retention_ms}
        _write_later("release", call, store.release, (key, token), kwargs, cut)


def _completion(call: Call, value: Any) -> dict[str, Any]:
    """``complete``'s keyword arguments for ``value``."""
    options = call.effect.options
    data, state, _ = call.effect.codec.encode(value, options.max_result_bytes)
    return {"result": data, "result_state": state, "retention_ms": options.retention_ms}


def _give_back_unrun(
    call: Call, token: int, lease: Lease | None, exc: BaseException, *, unknown: str = ""
) -> None:
    """Granted, then an exception raised into the call before the function ran (a time limit):
    nothing ran under the claim, so it is released, by the heartbeat at once (no round trip
    here, where another interruption could cut it), and the next call applies the effect.
    ``unknown``: the grant re-dispatched an unknown (its error), which goes back to unknown."""
    if lease is not None:
        heartbeat.drop(lease)
    if is_crash(exc):
        return
    store, key = call.store, call.key
    if unknown:
        kwargs = {"error": unknown, "ran": False}
        _write_later("mark_unknown", call, store.mark_unknown, (key, token), kwargs, exc)
        return
    log_release.info(
        "effectq %s: %s before it ran; its claim is given back (key %s)",
        call.effect.name,
        describe_exception(exc),
        key,
    )
    kwargs = {
        "error": f"{describe_exception(exc, 200)} before it ran; never run",
        "retention_ms": call.effect.options.retention_ms,
        "ran": False,
    }
    _write_later("release", call, store.release, (key, token), kwargs, exc)


class Settle:
    """What to do with a pipelined completion's outcome once its reply is read (the
    ``on_reply`` of ``Store.complete_pipelined``).

    The same as the engine's wait for a completion's reply, but for the retries: a store
    error goes straight to the heartbeat's, as the caller has moved on. The
    completed event reaches listeners when the reply confirms it, in the context
    the effect was called in (a tracing listener parents its span there), and
    its duration is the write's: what the call waited for.
    """

    __slots__ = ("attempt", "call", "context", "kwargs", "started", "token", "why", "written")

    def __init__(self, call: Call, token: int, attempt: int, kwargs: dict[str, Any], why: str) -> None:
        self.call, self.token, self.attempt, self.kwargs, self.why = call, token, attempt, kwargs, why
        self.context = contextvars.copy_context() if events._listeners else None  # as _emit reads it
        self.started = time.time_ns() if self.context is not None else 0  # for the event only
        self.written = 0  # when the write went out: set by the caller once it has, for the event

    def __call__(self, outcome: bool | Exception) -> None:
        call = self.call
        if outcome is True:
            if self.context is not None:
                self.context.run(self._completed)
        elif outcome is False:
            _log_taken_over(call, self.token)
        else:
            _complete_later(call, self.token, outcome, self.kwargs, unread=reply_unread(outcome))

    def _completed(self) -> None:
        _emit(
            self.call,
            EventKind.COMPLETED,
            self.started,
            attempt=self.attempt,
            error=self.why,
            ended_ns=self.written or None,
        )


def _complete_later(
    call: Call, token: int, exc: BaseException, kwargs: dict[str, Any], *, unread: bool = False
) -> None:
    """A completion that did not land: written by the heartbeat thread, retried until it lands.

    ``exc``: a :class:`StoreError` (the store failed: retried after a short random
    pause), or an exception raised into the call before the completion was known to
    have landed (a time limit, a cancellation: tried at once). ``unread``: the
    completion was written, but its reply was not read because the caller was
    cancelled or hit a time limit meanwhile; Redis most likely ran it, and writing it again (the same
    token) only makes sure. Logged at INFO, not as a failure.
    """
    store, key = call.store, call.key
    failed = isinstance(exc, StoreError)
    if unread:
        log_complete.info(
            "effectq %s applied; its completion was written but its reply not read (the caller "
            "was cancelled or cut short); writing it again in the background to be sure (key %s)",
            call.effect.name,
            key,
        )
    elif failed:
        log_complete.error(
            "effectq %s applied but recording it failed (%s); retrying in the background. "
            "Until it lands, the next call of %s sees it in flight, then unknown.",
            call.effect.name,
            exc,
            key,
        )
    else:  # a cancellation is routine in an event loop; a time limit is worth a warning
        log_complete.log(
            logging.INFO if isinstance(exc, asyncio.CancelledError) else logging.WARNING,
            "effectq %s applied; %s cut in before its completion was known to be recorded: "
            "writing it in the background (key %s)",
            call.effect.name,
            describe_exception(exc, 200),
            key,
        )
    refused, level = _refusal(call, token, "complete")
    heartbeat.defer(
        lambda: store.complete(key, token, **kwargs),
        f"complete of {key}",
        for_seconds=max(3600.0, call.effect.options.lease),
        store=store,
        advice=_advice(call, "The effect applied", "--applied"),
        refused=refused,
        refused_level=level,
        after=None if failed and not unread else 0.0,
    )


def _advice(call: Call, what: str, *settle: str) -> str:
    """What an operator must do about a background write to ``call``'s record that never landed:
    ``settle``, the ``effectq resolve`` flags that may apply."""
    command = f"effectq resolve --namespace {call.store.namespace} '{call.key}'"
    commands = " or ".join(f"`{command} {flag}`" for flag in settle)
    return (
        f"{what}; its record reads as in flight until the lease runs out, then as unknown: "
        f"settle it with {commands}"
    )


def _log_taken_over(call: Call, token: int) -> None:
    log_complete.error(
        "effectq %s applied, but its claim of %s (token %s) was taken over or settled by "
        "someone else meanwhile; their record stands. If it says 'not applied', the effect "
        "may now apply twice: check the remote system.",
        call.effect.name,
        call.key,
        token,
    )


def _refusal(call: Call, token: int, what: str) -> tuple[str, int]:
    """What it means when the store refuses ``what`` (complete, mark_unknown, release) by
    ``token`` of ``call``'s record, and the level to log it at."""
    name = call.effect.name
    if what == "complete":
        return (
            f"{name} applied, but its claim (token {token}) was taken over or settled by someone "
            "else meanwhile; their record stands. If it says 'not applied', or another attempt "
            "ran the effect since, it may have applied twice: check the remote system.",
            logging.ERROR,
        )
    if what == "mark_unknown":
        return (
            f"{name} may have applied, but its claim (token {token}) was taken over or settled by "
            "someone else meanwhile; their record stands. If it says 'not applied', or another "
            "attempt ran the effect since, it may have applied twice: check the remote system.",
            logging.ERROR,
        )
    return (
        f"the claim (token {token}) of {name} was released already or taken over by someone else "
        "meanwhile; their record stands. This attempt did not apply the effect: nothing to check.",
        logging.WARNING,
    )


def _write_later(
    what: str,
    call: Call,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: BaseException,
) -> None:
    """``fn(*args, **kwargs)`` (``what``: mark_unknown or release), by the heartbeat: after a
    short random pause when the store failed (``exc`` a StoreError), at once when an exception
    raised into the call (a time limit) cut it short."""
    refused, level = _refusal(call, args[1], what)
    heartbeat.defer(
        lambda: fn(*args, **kwargs),
        f"{what} of {call.key}",
        store=call.store,
        advice=_advice(call, "Check the remote system", "--applied", "--not-applied"),
        refused=refused,
        refused_level=level,
        after=None if isinstance(exc, StoreError) else 0.0,
    )
