"""Recording what a claim's holder did: the result, or what the function's exception means.

A completion the store fails to take is retried inline, then handed to the background
(:mod:`effectq._runtime.repairs`); so is any write an exception raised into the call cuts
short. ``_store`` and ``_write`` are the procedure's way to call a store primitive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import Any

from .._exceptions import describe_exception
from .._runtime.leases import heartbeat
from .._runtime.repairs import _complete_later, _completion, _log_taken_over, _refusal, _write_later
from ..errors import CompletionNotReplicatedError, EffectqError, StoreError
from ..events import EventKind
from ..store.base import ResultState
from . import failures
from .calls import Call, _emit
from .decide import Failure, after_failure, is_crash
from .ops import Op, SleepOp, StoreOp

log_complete = logging.getLogger("effectq.complete")
log_release = logging.getLogger("effectq.release")
log_unknown = logging.getLogger("effectq.unknown")
log_fail = logging.getLogger("effectq.fail")


COMPLETE_RETRIES = (0.05, 0.2, 0.5)
"""Pauses between inline retries of a completion the store failed to take."""


_COMPLETE_PAUSES = (*COMPLETE_RETRIES, None)

# Read on every completion (module globals: on Python 3.11 an Enum member read off its class
# costs a call of EnumType's __getattr__ hook).
_STORED, _WITHHELD = ResultState.STORED, ResultState.WITHHELD


def _store(call: Call, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Generator[Op, Any, Any]:
    """One store primitive; a failure is reported as a store_error event and raised."""
    started = time.time_ns()
    try:
        return (yield StoreOp(fn, *args, **kwargs))
    except StoreError as exc:
        _store_failed(call, fn, started, exc)
        raise


def _store_failed(call: Call, fn: Callable[..., Any], started: int, exc: StoreError) -> None:
    _emit(call, EventKind.STORE_ERROR, started, error=str(exc), step=getattr(fn, "__name__", "store"))


def _failed(
    call: Call, token: int, attempt: int, lease: Any, started: int, exc: BaseException
) -> Generator[Op, Any, None]:
    """The function raised: record unknown, released or failed (as its exception says), then raise it.

    Its callers hand the write to the heartbeat when another exception (a time limit)
    cuts this short: see :func:`_failed_later`.
    """
    effect, store, key = call.effect, call.store, call.key
    options = effect.options
    heartbeat.drop(lease)
    call.run.stats.failed += 1
    if is_crash(exc):
        raise exc
    outcome = after_failure(options, exc)
    _emit(call, _EVENTS[outcome], started, attempt=attempt, error=describe_exception(exc), step="execute")
    if outcome is Failure.TERMINAL:
        log_fail.info(
            "effectq %s raised %s, declared terminal: recorded; later calls raise it again (key %s)",
            effect.name,
            type(exc).__name__,
            key,
        )
        kwargs = failures.fail_kwargs(exc, options.retention_ms)
        yield from _write("fail", call, store.fail, key, token, **kwargs)
    elif outcome is Failure.UNKNOWN:
        log_unknown.error(
            "effectq %s raised %s, which may mean it applied: recorded as unknown (key %s)",
            effect.name,
            describe_exception(exc),
            key,
        )
        yield from _write("mark_unknown", call, store.mark_unknown, key, token, error=describe_exception(exc))
    else:
        log_release.info(
            "effectq %s raised %s: not applied, released (key %s)", effect.name, type(exc).__name__, key
        )
        yield from _write(
            "release",
            call,
            store.release,
            key,
            token,
            error=describe_exception(exc),
            retention_ms=options.retention_ms,
        )
    raise exc


_EVENTS = {
    Failure.TERMINAL: EventKind.FAILED,
    Failure.UNKNOWN: EventKind.UNKNOWN,
    Failure.RELEASE: EventKind.RELEASED,
}


def _record(call: Call, token: int, value: Any, attempt: int = 0) -> Generator[Op, Any, None]:
    """Record the result (one a reconcile found; the function's own is :func:`procedure`'s to
    record, pipelined where it can be).

    An exception raised into this (a time limit, a cancellation) before the completion
    is known to have landed hands it to the heartbeat, tried at once, and is raised.
    """
    kwargs: dict[str, Any] | None = None
    try:
        kwargs, why, _ = _encoded(call, value)
        yield from _complete(call, token, value, attempt, kwargs, why)
    except BaseException as cut:
        _cut(call, token, value, cut, kwargs)
        raise


def _encoded(call: Call, value: Any) -> tuple[dict[str, Any], str, bool]:
    """``complete``'s keyword arguments for ``value``, why its result is not stored (if not:
    then logged, as a replay will raise ResultNotRecordedError), and whether the completion
    may be pipelined (written without waiting for its reply): not one that records no result."""
    effect = call.effect
    options = effect.options
    data, state, why = effect.codec.encode(value, options.max_result_bytes)
    kwargs = {"result": data, "result_state": state, "retention_ms": options.retention_ms}
    if state is _STORED or state is _WITHHELD:
        return kwargs, why, True
    log_complete.warning(
        "effectq %s applied but its result is not recorded (%s); a replay will raise "
        "ResultNotRecordedError (key %s)",
        effect.name,
        why,
        call.key,
    )
    return kwargs, why, False


def _complete(
    call: Call, token: int, value: Any, attempt: int, kwargs: dict[str, Any], why: str
) -> Generator[Op, Any, None]:
    """Write the completion ``kwargs`` (of ``value``) and wait for its reply; a store error is
    tried again inline, then handed to the heartbeat. A cut is the caller's (see :func:`_cut`)."""
    effect, store, key = call.effect, call.store, call.key
    for pause in _COMPLETE_PAUSES:
        started = time.time_ns()
        try:
            recorded = yield StoreOp(store.complete, key, token, **kwargs)
        except CompletionNotReplicatedError as exc:
            _emit(call, EventKind.COMPLETED, started, attempt=attempt, error=str(exc))
            log_complete.error("effectq %s: %s", effect.name, exc)
            raise CompletionNotReplicatedError(
                key, acknowledged=exc.acknowledged, required=exc.required, name=effect.name, result=value
            ) from None
        except StoreError as exc:
            _store_failed(call, store.complete, started, exc)
            if pause is not None:
                yield SleepOp(pause)
                continue
            _complete_later(call, token, exc, kwargs)
            return
        if not recorded:
            _log_taken_over(call, token)
        else:
            _emit(call, EventKind.COMPLETED, started, attempt=attempt, error=why)
        return


def _cut(
    call: Call, token: int, value: Any, cut: BaseException, kwargs: dict[str, Any] | None, lease: Any = None
) -> None:
    """An exception raised into the call (a time limit, a cancellation) after ``value`` was
    returned, before its completion is known to have landed: the completion (``kwargs``, or
    ``value`` encoded) goes to the heartbeat, tried at once; ``lease`` is dropped. Not after a
    simulated crash, nor for effectq's own error (a completion not replicated: it landed)."""
    if lease is not None:
        heartbeat.drop(lease)
    if is_crash(cut) or isinstance(cut, EffectqError):
        return
    _complete_later(call, token, cut, kwargs or _completion(call, value))


def _write(
    what: str, call: Call, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Generator[Op, Any, None]:
    """A transition after a failure: a store error is logged and retried in the background."""
    try:
        done = yield from _store(call, fn, *args, **kwargs)
    except StoreError as exc:
        log_release.error("effectq %s of %s failed (%s); retrying in the background", what, call.key, exc)
        _write_later(what, call, fn, args, kwargs, exc)
        return
    if not done:
        refused, level = _refusal(call, args[1], what)
        log_release.log(level, "effectq %s of %s was refused: %s", what, call.key, refused)
