"""The effect procedure: claim, then replay, wait, reconcile or execute, then record.

The procedure is written once, as a generator that *yields operations* (a store
primitive, a wait, the function itself) and receives their results. Drivers
run it: :func:`drive_sync` calls everything directly, :func:`drive_async`
awaits (store calls go to a worker thread, so a slow Redis never blocks the
event loop), and the streaming drivers in :mod:`effectq.effect` iterate
generator effects. One state machine serves sync, async and generator effects;
:func:`run_sync` writes out a synchronous call's two common outcomes (a replay,
a first run that succeeds) without its generator frames and hands anything else
to the procedure's own step (``tests/test_paths_agree.py`` holds the two alike).

Round trips on a store where each primitive is one: a first-time effect costs
two (claim, complete), a replay one (claim). A store that waits for replicas
(``RedisStore(wait_replicas=N)``) pipelines the wait with the claim and the
completion, and raises when too few acknowledged: a claim is then given back
without running the function; a completion reaches the caller as
:class:`~effectq.errors.CompletionNotReplicatedError` carrying the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from . import events
from .codec import DecodeError
from .context import EffectContext
from .errors import (
    ClaimNotReplicatedError,
    CompletionNotReplicatedError,
    CorruptRecordError,
    EffectqError,
    InProgress,
    InputMismatchError,
    OutcomeUnknown,
    ReconcileError,
    ResultDecodeError,
    ResultNotRecordedError,
    StoreError,
    describe_exception,
)
from .events import EventKind
from .heartbeat import Lease, heartbeat
from .options import OnMismatch
from .store.base import Claim, ClaimKind, ClaimRequest, ResultState, Status

if TYPE_CHECKING:
    from .effect import Effect
    from .runs import Run
    from .store.base import Store

__all__ = [
    "Applied",
    "Call",
    "InvokeOp",
    "drive_async",
    "drive_sync",
    "new_owner",
    "procedure",
    "run_op_async",
    "run_op_sync",
    "run_sync",
]

log_claim = logging.getLogger("effectq.claim")
log_replay = logging.getLogger("effectq.replay")
log_wait = logging.getLogger("effectq.wait")
log_complete = logging.getLogger("effectq.complete")
log_release = logging.getLogger("effectq.release")
log_unknown = logging.getLogger("effectq.unknown")
log_reconcile = logging.getLogger("effectq.reconcile")

MAX_BLOCK = 2.0
"""Longest single wait for a notification before re-checking the store (a missed
notification costs at most this much latency)."""

COMPLETE_RETRIES = (0.05, 0.2, 0.5)
"""Pauses between inline retries of a completion the store failed to take."""
_COMPLETE_PAUSES = (*COMPLETE_RETRIES, None)

CLAIM_RETRIES = (0.05, 0.25, None)
"""Pauses between tries of a claim whose round trip failed (None: give up)."""

_owners = itertools.count(1)
_owner_prefix = ""


def _name_process() -> None:
    global _owner_prefix
    _owner_prefix = f"{socket.gethostname()}:{os.getpid()}:"


_name_process()
os.register_at_fork(after_in_child=_name_process)


def new_owner() -> str:
    """A unique id of one call: ``host:pid:n``."""
    return f"{_owner_prefix}{next(_owners)}"


class Applied:
    """What a reconcile hook returns to say "applied" for an effect whose result is ``None``.

    A hook returns the found result, or ``None`` for "not applied". When the
    result itself is ``None`` (or when the found value is not the result), return
    ``effectq.Applied(value)``.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Applied({self.value!r})"


class Call:
    """Everything one call of an effect needs, computed before anything is claimed."""

    __slots__ = ("arguments", "effect", "input_hash", "key", "ordinal", "request", "run", "store")

    def __init__(
        self,
        effect: Effect[..., Any],
        run: Run,
        store: Store,
        key: str,
        input_hash: str,
        arguments: dict[str, Any],
        ordinal: int,
        request: ClaimRequest,
    ) -> None:
        self.effect = effect
        self.run = run
        self.store = store
        self.key = key
        self.input_hash = input_hash
        self.arguments = arguments
        self.ordinal = ordinal
        self.request = request

    def context(self, token: int, attempt: int, lease: Any = None) -> EffectContext:
        # Positional, in EffectContext's field order (keywords cost a dict per call).
        return EffectContext(
            self.key,  # key
            self.run.id,  # run_id
            self.effect.name,  # name
            attempt,  # attempt
            self.store.namespace,  # namespace
            token,  # token
            self.ordinal,  # ordinal
            self.arguments,  # args
            lease,  # _lease
        )


# -- operations the procedure yields ------------------------------------------------------


class StoreOp:
    __slots__ = ("args", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs


class WatchOp:
    __slots__ = ("key", "store")

    def __init__(self, store: Store, key: str) -> None:
        self.store, self.key = store, key


class BlockOp:
    __slots__ = ("timeout", "watch")

    def __init__(self, watch: Any, timeout: float) -> None:
        self.watch, self.timeout = watch, timeout


class InvokeOp:
    __slots__ = ("ctx",)

    def __init__(self, ctx: EffectContext) -> None:
        self.ctx = ctx


class ReconcileOp:
    __slots__ = ("call", "ctx")

    def __init__(self, call: Call, ctx: EffectContext) -> None:
        self.call, self.ctx = call, ctx


class SleepOp:
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Op = StoreOp | WatchOp | BlockOp | InvokeOp | ReconcileOp | SleepOp
_T = TypeVar("_T")
Procedure = Generator[Op, Any, tuple[Any, bool]]
_NOT_FOUND = object()


class First:
    """What the first store operation of a step gave before the procedure took over.

    :func:`run_sync` makes the first claim (or completion) itself and hands it on, so
    the procedure carries on from there instead of sending it again.
    """

    __slots__ = ("error", "started", "value")

    def __init__(self, started: int, value: Any = None, error: BaseException | None = None) -> None:
        self.started, self.value, self.error = started, value, error

    def take(self) -> Any:
        """The value, or raise the error (as the yield of its operation would have)."""
        if self.error is not None:
            raise self.error
        return self.value


def is_crash(exc: BaseException) -> bool:
    """A simulated process death: no store write may follow it (see effectq.testing)."""
    return getattr(exc, "effectq_crash", False) is True


# -- the procedure ----------------------------------------------------------------------


def _emit(
    call: Call,
    kind: EventKind,
    started_ns: int,
    *,
    attempt: int = 0,
    error: str = "",
    step: str = "",
    ended_ns: int | None = None,
) -> None:
    if not events.listeners():
        return
    events.emit(
        events.Event(  # positional, in Event's field order (keywords cost a dict per event)
            kind,  # kind
            call.effect.name,  # name
            call.key,  # key
            call.run.id,  # run_id
            call.store.namespace,  # namespace
            attempt,  # attempt
            started_ns,  # started_ns
            ((ended_ns or time.time_ns()) - started_ns) / 1e9,  # duration
            error,  # error
            step or events.STEPS[kind],  # step
        )
    )


def _store(
    call: Call, fn: Callable[..., Any], *args: Any, first: First | None = None, **kwargs: Any
) -> Generator[Op, Any, Any]:
    """One store primitive (or ``first``, its outcome in hand already); a failure is
    reported as a store_error event and raised."""
    started = time.time_ns() if first is None else first.started
    try:
        if first is not None:
            return first.take()
        return (yield StoreOp(fn, *args, **kwargs))
    except StoreError as exc:
        _emit(call, EventKind.STORE_ERROR, started, error=str(exc), step=getattr(fn, "__name__", "store"))
        raise


def _claim(call: Call, first: First | None = None) -> Generator[Op, Any, tuple[Claim, int]]:
    """Claim, retrying a failed round trip with the same owner (the grant comes back, not a conflict).

    When every try fails, or the wait for its reply is interrupted (a cancelled task,
    a time limit), the claim may still have landed: nothing ran under it, so the
    heartbeat keeps trying to take it back and release it, rather than leave a
    dispatched record to turn into a false unknown; unless no try was sent at all (a
    connection refused): then no claim can exist. ``first``: the first try, made already.
    """
    store, key = call.store, call.key
    unanswered = False  # whether a failed try may have reached the store
    for pause in CLAIM_RETRIES:
        taken, first = first, None
        started = time.time_ns() if taken is None else taken.started
        try:
            claim = yield from _store(call, store.claim, key, call.request, first=taken)
        except CorruptRecordError:
            raise
        except ClaimNotReplicatedError as exc:
            yield from _give_back(call, exc)
            raise
        except StoreError as exc:
            unanswered = unanswered or exc.sent
            if pause is None:
                if unanswered:
                    _take_back_later(call, "unanswered")
                raise
            yield SleepOp(pause)
            continue
        except BaseException as exc:
            if not isinstance(exc, EffectqError | GeneratorExit) and not is_crash(exc):
                # Interrupted while its reply was awaited (a cancelled task, a time limit, ^C):
                # the claim may land all the same, with nothing to run under it.
                _take_back_later(call, "interrupted", after=0.0)
            raise
        return claim, started
    raise AssertionError("unreachable")  # pragma: no cover


def _give_back(call: Call, exc: ClaimNotReplicatedError) -> Generator[Op, Any, None]:
    """Hand back a claim too few replicas acknowledged: the function never ran under it.

    Released, so the next call applies the effect rather than meet a false unknown
    once the lease runs out; a replay-safe re-dispatch of an unknown goes back to
    unknown. Neither write is waited for: if a failover loses it, the replica has
    the claim (its lease runs out: unknown) or nothing (the next call applies).
    """
    claim = exc.claim
    log_claim.error("%s; the claim is given back", exc)
    if claim.error:
        yield from _write(
            "mark_unknown", call, call.store.mark_unknown, call.key, claim.token, error=claim.error
        )
        return
    yield from _write(
        "release",
        call,
        call.store.release,
        call.key,
        claim.token,
        error="claim not acknowledged by enough replicas; never run",
        retention_ms=call.effect.options.retention_ms,
    )


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
            )

    return abandon


def procedure(call: Call, first: First | None = None) -> Procedure:
    """Claim the effect and do what the claim says. Returns (value, executed).

    ``first``: the first claim, made already (see :func:`run_sync`).
    """
    effect, store, key = call.effect, call.store, call.key
    options = effect.options
    waiting_since: int | None = None
    watch: Any = None
    prefetched = call.run.prefetched
    if prefetched is not None:
        started = time.time_ns()
        found = prefetched.get(key)
        if found is not None:
            value = _replay(call, found)
            _emit(call, EventKind.REPLAYED, started, attempt=found.attempt)
            return value, False
    granted: int | None = None  # the token of a grant nothing has run under yet
    try:
        try:
            while True:
                claim, started = yield from _claim(call, first)
                if claim.kind is ClaimKind.CLAIMED:
                    granted = claim.token
                first = None
                kind = claim.kind
                if kind is not ClaimKind.IN_FLIGHT and waiting_since is not None:
                    _emit(call, EventKind.WAITED, waiting_since)
                    waiting_since = None
                if kind is ClaimKind.COMPLETED:
                    value = _replay(call, claim)
                    _emit(call, EventKind.REPLAYED, started, attempt=claim.attempt)
                    if claim.prefetch_hint is not None:
                        yield from _prefetch(call, claim.prefetch_hint)
                    return value, False
                if kind is ClaimKind.CLAIMED:
                    token, attempt = claim.token, claim.attempt
                    _emit(call, EventKind.CLAIMED, started, attempt=attempt)
                    break
                if kind is ClaimKind.RECONCILE:
                    found = yield from _reconcile(call, claim)
                    if found is not _NOT_FOUND:
                        return found, False
                    attempt = yield from _dispatch(call, claim.token)
                    if not attempt:
                        log_reconcile.warning(
                            "effectq lost the claim of %s after reconcile; looking again", key
                        )
                        continue
                    token = granted = claim.token
                    _emit(call, EventKind.CLAIMED, started, attempt=attempt)
                    break
                if kind is ClaimKind.IN_FLIGHT:
                    if waiting_since is None:
                        waiting_since = started
                        call.run.stats.waited += 1
                        log_wait.debug("effectq %s in flight (holder %s); waiting", key, claim.owner)
                    waited = (time.time_ns() - waiting_since) / 1e9
                    remaining = options.wait - waited
                    if remaining <= 0:
                        call.run.stats.failed += 1
                        _emit(call, EventKind.IN_PROGRESS, waiting_since, error=claim.owner)
                        raise InProgress(key, name=effect.name, waited=waited, owner=claim.owner)
                    if watch is None:  # subscribe, then look again: no notification is missed
                        watch = yield WatchOp(store, key)
                        continue
                    yield BlockOp(watch, min(remaining, claim.lease_ms / 1000.0 + 0.05, MAX_BLOCK))
                    continue
                # UNKNOWN: may have applied, and this caller may neither reconcile nor replay.
                call.run.stats.failed += 1
                _emit(call, EventKind.UNKNOWN, started, attempt=claim.attempt, error=claim.error)
                raise OutcomeUnknown(
                    key,
                    name=effect.name,
                    reason=claim.error,
                    record=None,
                    namespace=store.namespace,
                )
        finally:
            if watch is not None:
                watch.close()
        if claim.status is Status.DISPATCHED and claim.kind is ClaimKind.CLAIMED and claim.error:
            log_unknown.warning(
                "effectq re-executing %s after an unknown outcome (%s): it is declared replay-safe "
                "(safe to repeat, or deduped by its idempotency key)",
                key,
                claim.error,
            )
    except BaseException as exc:
        if granted is None:
            raise
        # Cut between the grant and the function (a time limit): nothing ran under it. A
        # re-dispatched unknown goes back to unknown (as _give_back does); any other is released.
        if claim.error and not is_crash(exc):
            error = {"error": claim.error}
            _write_later("mark_unknown", call, store.mark_unknown, (key, granted), error, exc)
        else:
            _give_back_unrun(call, granted, None, exc)
        raise
    return (yield from _execute(call, token, attempt)), True


def _prefetch(call: Call, hint: Any) -> Generator[Op, Any, None]:
    """A replay means a redelivery: fetch the run's other completed effects at once.

    The claim that found the replay also brought the run's index (``hint``), so this
    is one round trip, and none when the run has no other completed effect. Later
    calls of the run then replay without a round trip each. Best effort: a failure
    only means the calls claim as usual.
    """
    run, store = call.run, call.store
    fetch = getattr(store, "prefetch", None)
    if run.prefetch_tried or fetch is None or hint is None:
        return
    run.prefetch_tried = True
    try:
        run.prefetched = yield StoreOp(fetch, run.id, hint)
    except StoreError as exc:
        log_replay.debug("effectq prefetch of run %s failed (%s); claiming one by one", run.id, exc)


def _check_input(call: Call, recorded_hash: str) -> None:
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


def _replay(call: Call, claim: Claim) -> Any:
    effect = call.effect
    _check_input(call, claim.input_hash)
    call.run.stats.replayed += 1
    log_replay.debug("effectq replay %s", call.key)
    if claim.result_state is not ResultState.STORED:
        raise ResultNotRecordedError(call.key, name=effect.name, reason=claim.result_state.value)
    if claim.result is None:
        raise CorruptRecordError(call.key, "completed without a result")
    try:
        return effect.codec.decode(claim.result)
    except DecodeError as exc:
        raise ResultDecodeError(call.key, name=effect.name, detail=str(exc).splitlines()[0]) from exc


def _reconcile(call: Call, claim: Claim) -> Generator[Op, Any, Any]:
    """Ask the remote system (the caller holds a reconcile lease). Returns the found value or _NOT_FOUND."""
    effect, store, key = call.effect, call.store, call.key
    options = effect.options
    lease = heartbeat.hold(store, key, claim.token, options.lease_ms)
    ctx = call.context(claim.token, claim.attempt, lease)
    started = time.time_ns()
    try:
        found = yield ReconcileOp(call, ctx)
    except BaseException as exc:
        heartbeat.drop(lease)
        if is_crash(exc) or not isinstance(exc, Exception):
            raise
        yield from _write(
            "release",
            call,
            store.release,
            key,
            claim.token,
            error=f"reconcile raised {describe_exception(exc)}",
            retention_ms=options.retention_ms,
        )
        log_reconcile.warning("effectq reconcile of %s raised %s", key, describe_exception(exc))
        call.run.stats.failed += 1
        if claim.status is Status.UNKNOWN:
            raise OutcomeUnknown(
                key,
                name=effect.name,
                reason=f"{claim.error}; reconcile raised {describe_exception(exc, 200)}",
                namespace=store.namespace,
            ) from exc
        raise ReconcileError(key, name=effect.name) from exc
    heartbeat.drop(lease)
    if found is None:
        log_reconcile.info("effectq reconcile of %s: not applied; executing", key)
        return _NOT_FOUND
    if isinstance(found, Applied):
        found = found.value
    try:
        value = effect.codec.coerce(found)
    except DecodeError as exc:
        log_reconcile.warning(
            "effectq reconcile of %s found a value that does not validate as the return type (%s); "
            "recording it as found",
            key,
            str(exc).splitlines()[0],
        )
        value = found
    yield from _record(call, claim.token, value)
    call.run.stats.reconciled += 1
    _emit(call, EventKind.RECONCILED, started, attempt=claim.attempt)
    log_reconcile.info("effectq reconcile of %s: already applied; recorded", key)
    # What applied is the attempt recorded under the key, whose identity the record keeps: a
    # caller whose input differs is told so, as it would be by a replay of that attempt.
    _check_input(call, claim.input_hash)
    return value


def _dispatch(call: Call, token: int) -> Generator[Op, Any, int]:
    """After a reconcile found nothing: dispatch under its token. Returns the attempt (0: lost).

    A failed round trip is tried again with the same token (a retried dispatch gets its attempt
    back, with a lease from the retry). When every try fails, or the wait for its reply is
    interrupted, the dispatch may have landed with nothing run under it: the heartbeat gives it
    back (a release), rather than leave a dispatched record nobody runs to turn unknown.
    """
    store, key, lease_ms = call.store, call.key, call.effect.options.lease_ms
    for pause in CLAIM_RETRIES:
        try:
            attempt: int = yield from _store(call, store.dispatch, key, token, lease_ms=lease_ms)
            return attempt
        except ClaimNotReplicatedError as exc:
            yield from _give_back(call, exc)
            raise
        except CorruptRecordError:
            raise
        except StoreError:
            if pause is None:
                _give_back_later(call, token)
                raise
            yield SleepOp(pause)
        except BaseException as exc:
            if not isinstance(exc, EffectqError | GeneratorExit) and not is_crash(exc):
                _give_back_later(call, token)  # interrupted while its reply was awaited
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _give_back_later(call: Call, token: int) -> None:
    """A dispatch that may have landed with nothing run under it: the heartbeat releases it."""
    store, key = call.store, call.key
    retention_ms = call.effect.options.retention_ms
    heartbeat.defer(
        lambda: store.release(key, token, error="dispatch reply lost; never run", retention_ms=retention_ms),
        f"release of the unanswered dispatch of {key}",
        for_seconds=600.0,
        store=store,
        advice=_advice(call, "The effect did not run", "--not-applied"),
    )


def _execute(call: Call, token: int, attempt: int) -> Generator[Op, Any, Any]:
    """Run the function under the claim ``token`` holds, then record what it did.

    An exception raised into the call (a time limit) records what is true of where it
    landed: before the function ran, the claim is given back; in the function, it is
    the function's; after it returned, the completion is recorded all the same.
    """
    lease: Lease | None = None
    invoked = False
    try:
        lease = Lease(call.store, call.key, token, call.effect.options.lease_ms)
        heartbeat.keep(lease)
        ctx = call.context(token, attempt, lease)
        started = time.time_ns()
        invoked = True
        value = yield InvokeOp(ctx)
    except BaseException as exc:
        if not invoked:
            _give_back_unrun(call, token, lease, exc)
            raise
        try:
            yield from _failed(call, token, attempt, lease, started, exc)
        except BaseException as cut:
            if cut is not exc:
                _failed_later(call, token, lease, exc, cut)
            raise
        raise  # pragma: no cover - _failed raises
    try:
        heartbeat.drop(lease)
        call.run.stats.executed += 1
        _emit(call, EventKind.EXECUTED, started, attempt=attempt)
    except BaseException as exc:
        _cut_after_return(call, token, lease, value, exc)
        raise
    yield from _record(call, token, value, attempt)
    return value


def _failed(
    call: Call, token: int, attempt: int, lease: Any, started: int, exc: BaseException
) -> Generator[Op, Any, None]:
    """The function raised: record unknown or released (as its exception says), then raise it.

    Its callers hand the write to the heartbeat when another exception (a time limit)
    cuts this short: see :func:`_failed_later`.
    """
    effect, store, key = call.effect, call.store, call.key
    options = effect.options
    heartbeat.drop(lease)
    call.run.stats.failed += 1
    if is_crash(exc):
        raise exc
    maybe = options.maybe_applied(exc)
    _emit(
        call,
        EventKind.UNKNOWN if maybe else EventKind.RELEASED,
        started,
        attempt=attempt,
        error=describe_exception(exc),
        step="execute",
    )
    if maybe:
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
    try:
        maybe = effect.options.maybe_applied(exc)
    except Exception:  # a classifier that raises: maybe applied
        maybe = True
    error = describe_exception(exc)
    if maybe:
        _write_later("mark_unknown", call, store.mark_unknown, (key, token), {"error": error}, cut)
    else:
        kwargs = {"error": error, "retention_ms": effect.options.retention_ms}
        _write_later("release", call, store.release, (key, token), kwargs, cut)


def _record(
    call: Call,
    token: int,
    value: Any,
    attempt: int = 0,
    first: First | None = None,
    encoded: tuple[bytes | None, ResultState, str] | None = None,
) -> Generator[Op, Any, None]:
    """Record the result. :func:`run_sync` hands on what it did already: ``encoded``, the
    result as the codec encoded it, and ``first``, the first completion's outcome.

    An exception raised into this (a time limit, a cancellation) before the completion
    is known to have landed hands it to the heartbeat, tried at once, and is raised.
    """
    effect, store, key = call.effect, call.store, call.key
    options = effect.options
    kwargs: dict[str, Any] | None = None
    try:
        data, state, why = encoded or effect.codec.encode(value, options.max_result_bytes)
        if state is not ResultState.STORED:
            log_complete.warning(
                "effectq %s applied but its result is not recorded (%s); a replay will raise "
                "ResultNotRecordedError (key %s)",
                effect.name,
                why,
                key,
            )
        kwargs = {"result": data, "result_state": state, "retention_ms": options.retention_ms}
        for pause in _COMPLETE_PAUSES:
            taken, first = first, None
            started = time.time_ns() if taken is None else taken.started
            try:
                recorded = yield from _store(call, store.complete, key, token, first=taken, **kwargs)
            except CompletionNotReplicatedError as exc:
                _emit(call, EventKind.COMPLETED, started, attempt=attempt, error=str(exc))
                log_complete.error("effectq %s: %s", effect.name, exc)
                raise CompletionNotReplicatedError(
                    key, acknowledged=exc.acknowledged, required=exc.required, name=effect.name, result=value
                ) from None
            except StoreError as exc:
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
    except BaseException as cut:
        if is_crash(cut) or isinstance(cut, EffectqError):
            raise
        _complete_later(call, token, cut, kwargs or _completion(call, value))
        raise


def _completion(call: Call, value: Any) -> dict[str, Any]:
    """``complete``'s keyword arguments for ``value``."""
    options = call.effect.options
    data, state, _ = call.effect.codec.encode(value, options.max_result_bytes)
    return {"result": data, "result_state": state, "retention_ms": options.retention_ms}


def _give_back_unrun(call: Call, token: int, lease: Lease | None, exc: BaseException) -> None:
    """Granted, then an exception raised into the call before the function ran (a time limit):
    nothing ran under the claim, so it is released, by the heartbeat at once (no round trip
    here, where another interruption could cut it), and the next call applies the effect."""
    if lease is not None:
        heartbeat.drop(lease)
    if is_crash(exc):
        return
    store, key = call.store, call.key
    log_release.info(
        "effectq %s: %s before it ran; its claim is given back (key %s)",
        call.effect.name,
        describe_exception(exc),
        key,
    )
    kwargs = {
        "error": f"{describe_exception(exc, 200)} before it ran; never run",
        "retention_ms": call.effect.options.retention_ms,
    }
    _write_later("release", call, store.release, (key, token), kwargs, exc)


def _cut_after_return(call: Call, token: int, lease: Lease | None, value: Any, exc: BaseException) -> None:
    """The function returned, then an exception raised into the call (a time limit) before its
    completion was written: the completion goes to the heartbeat, tried at once."""
    if lease is not None:
        heartbeat.drop(lease)
    if not is_crash(exc):
        _complete_later(call, token, exc, _completion(call, value))


class _Settle:
    """What to do with a posted completion's outcome once its reply is read (see
    ``RedisStore.complete_soon``).

    The same as :func:`_record` after a completion, but for the retries: a store
    error goes straight to the heartbeat's, as the caller has moved on. The
    completed event reaches listeners when the reply confirms it, in the context
    the effect was called in (a tracing listener parents its span there), and
    its duration is the write's: what the call waited for.
    """

    __slots__ = ("attempt", "call", "context", "encoded", "started", "token", "written")

    def __init__(self, call: Call, token: int, attempt: int, encoded: tuple[bytes | None, ResultState, str]):
        self.call, self.token, self.attempt, self.encoded = call, token, attempt, encoded
        self.context = contextvars.copy_context() if events.listeners() else None
        self.started = time.time_ns() if self.context is not None else 0  # for the event only
        self.written = 0  # when the write went out: set by the caller once it has, for the event

    def __call__(self, outcome: bool | StoreError) -> None:
        call = self.call
        if outcome is True:
            if self.context is not None:
                self.context.run(self._completed)
        elif outcome is False:
            _log_taken_over(call, self.token)
        else:
            data, state, _ = self.encoded
            kwargs = {"result": data, "result_state": state, "retention_ms": call.effect.options.retention_ms}
            unread = isinstance(outcome.__cause__, asyncio.CancelledError | KeyboardInterrupt)
            _complete_later(call, self.token, outcome, kwargs, unread=unread)

    def _completed(self) -> None:
        _emit(
            self.call,
            EventKind.COMPLETED,
            self.started,
            attempt=self.attempt,
            error=self.encoded[2],
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
    cancelled meanwhile; Redis most likely ran it, and writing it again (the same
    token) only makes sure. Logged at INFO, not as a failure.
    """
    store, key = call.store, call.key
    failed = isinstance(exc, StoreError)
    if unread:
        log_complete.info(
            "effectq %s applied; its completion was written but its reply not read (the caller "
            "was cancelled); writing it again in the background to be sure (key %s)",
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


# -- drivers ----------------------------------------------------------------------------


class _SyncWatch:
    """A subscription whose notifications wake a blocked thread."""

    __slots__ = ("_event", "_unsubscribe")

    def __init__(self, store: Store, key: str) -> None:
        self._event = threading.Event()
        self._unsubscribe = store.watch(key, self._event.set)

    def block(self, timeout: float) -> None:
        self._event.wait(timeout)
        self._event.clear()

    def close(self) -> None:
        self._unsubscribe()


class _AsyncWatch:
    """A subscription whose notifications wake an awaiting task, never blocking the loop."""

    __slots__ = ("_event", "_loop", "_unsubscribe")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._unsubscribe: Callable[[], None] = lambda: None

    def _notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._event.set)

    async def open(self, store: Store, key: str) -> _AsyncWatch:
        self._unsubscribe = await asyncio.to_thread(store.watch, key, self._notify)
        return self

    async def block(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()

    def close(self) -> None:
        self._unsubscribe()


def run_op_sync(op: Op) -> Any:
    """Carry out one operation other than invoking the function, blocking."""
    kind = type(op)
    if kind is StoreOp:
        return op.fn(*op.args, **op.kwargs)  # type: ignore[union-attr]
    if kind is WatchOp:
        return _SyncWatch(op.store, op.key)  # type: ignore[union-attr]
    if kind is BlockOp:
        return op.watch.block(op.timeout)  # type: ignore[union-attr]
    if kind is ReconcileOp:
        return _reconcile_sync(op)  # type: ignore[arg-type]
    if kind is SleepOp:
        return time.sleep(op.seconds)  # type: ignore[union-attr]
    raise TypeError(f"not an operation: {op!r}")  # pragma: no cover


def run_sync(call: Call, invoke: Callable[[EffectContext], Any]) -> Any:
    """Carry out a synchronous call: its two common outcomes straight through, the rest by the procedure.

    A replay, and a first run whose claim, function and completion all succeed, take
    the procedure's steps with its events, stats and logs, written out here without
    its generator frames: between two round trips those cost more than the rest of
    the call. Anything else (a run's prefetch, in flight, unknown, reconcile, a store
    error, a function that raises, a result that is not recorded or a claim taken
    over) hands what it has to the procedure's own step, which carries on from there.

    An exception raised into the call wherever it is (a worker's time limit, from a
    signal handler) records what is true of where it landed, then is raised: during
    the claim, the claim is taken back; once granted, before the function ran, it is
    given back; in the function, it is the function's; after the function returned,
    the completion is recorded all the same. ``stage`` says where the call is.
    """
    if call.run.prefetched is not None:
        return drive_sync(procedure(call), invoke)[0]
    store, key = call.store, call.key
    started = time.time_ns()
    claim: Claim | None = None
    lease: Lease | None = None
    stage = 0  # 0 claiming, 1 granted, 2 invoked, 3 returned, 4 its completion's fate in hand
    try:
        claim = store.claim(key, call.request)
        if claim.kind is ClaimKind.CLAIMED and not claim.error:
            stage = 1
            token, attempt = claim.token, claim.attempt
            options = call.effect.options
            lease = Lease(store, key, token, options.lease_ms)
            heartbeat.keep(lease)
            _emit(call, EventKind.CLAIMED, started, attempt=attempt)
            ctx = call.context(token, attempt, lease)
            started = time.time_ns()
            stage = 2
            value = invoke(ctx)
            stage = 3
            heartbeat.drop(lease)
            call.run.stats.executed += 1
            _emit(call, EventKind.EXECUTED, started, attempt=attempt)
            encoded = data, state, why = call.effect.codec.encode(value, options.max_result_bytes)
            if state is not ResultState.STORED:  # stage 3 still: _record may be cut before its guard
                drive_sync(_record(call, token, value, attempt, encoded=encoded), invoke)
                return value
            complete_soon = getattr(type(store), "complete_soon", None)
            if complete_soon is not None and call.run.thread == threading.get_ident():
                settle = _Settle(call, token, attempt, encoded)
                if complete_soon(
                    store,
                    key,
                    token,
                    settle,
                    result=data,
                    result_state=state,
                    retention_ms=options.retention_ms,
                ):
                    stage = 4
                    if settle.context is not None:
                        settle.written = time.time_ns()
                    # its reply is read by the next script on that connection, or at the run's end
                    return value
            started = time.time_ns()
            stage = 4
            try:
                recorded = store.complete(
                    key, token, result=data, result_state=state, retention_ms=options.retention_ms
                )
            except BaseException as exc:
                drive_sync(_record(call, token, value, attempt, First(started, error=exc), encoded), invoke)
                return value
            if not recorded:
                drive_sync(_record(call, token, value, attempt, First(started, recorded), encoded), invoke)
                return value
            _emit(call, EventKind.COMPLETED, started, attempt=attempt, error=why)
            return value
    except BaseException as exc:
        if claim is None:  # the claim's round trip failed, or was cut short
            return drive_sync(procedure(call, First(started, error=exc)), invoke)[0]
        try:
            _interrupted(call, claim, stage, lease, exc, value if stage == 3 else None)
            if stage == 2:
                drive_sync(_failed(call, claim.token, claim.attempt, lease, started, exc), invoke)
        except BaseException as cut:
            if cut is not exc and stage == 2:  # a time limit, as the function's exception is recorded
                _failed_later(call, claim.token, lease, exc, cut)
            raise
        raise
    kind = claim.kind
    if kind is ClaimKind.COMPLETED:
        value = _replay(call, claim)
        _emit(call, EventKind.REPLAYED, started, attempt=claim.attempt)
        if claim.prefetch_hint is not None:
            drive_sync(_prefetch(call, claim.prefetch_hint), invoke)
        return value
    return drive_sync(procedure(call, First(started, claim)), invoke)[0]


def _interrupted(
    call: Call, claim: Claim, stage: int, lease: Lease | None, exc: BaseException, value: Any
) -> None:
    """What an exception raised into :func:`run_sync` or :func:`run_async` at ``stage`` leaves
    to record, the function's own exception (stage 2) aside: see :func:`run_sync`."""
    if stage == 1 or (stage == 0 and claim.kind is ClaimKind.CLAIMED and not claim.error):
        _give_back_unrun(call, claim.token, lease, exc)
    elif stage == 3 and not isinstance(exc, EffectqError):  # not _record's own (not replicated)
        _cut_after_return(call, claim.token, lease, value, exc)


def drive_sync(proc: Generator[Op, Any, _T], invoke: Callable[[EffectContext], Any]) -> _T:
    """Run the procedure, calling store primitives and the function directly.

    An exception raised into the driver itself (a time limit, from a signal handler),
    between two of the procedure's steps, is thrown into the procedure where it waits,
    as if the operation it waits for had raised it: its step records what is true.
    """
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            while True:
                op = proc.send(value) if error is None else proc.throw(error)
                value = error = None
                try:
                    value = invoke(op.ctx) if isinstance(op, InvokeOp) else run_op_sync(op)
                except BaseException as exc:
                    error = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except BaseException as exc:
            if inspect.getgeneratorstate(proc) == inspect.GEN_CLOSED:  # the procedure's own outcome
                raise
            value, error = None, exc


def _reconcile_sync(op: ReconcileOp) -> Any:
    hook = op.call.effect.options.reconcile
    assert hook is not None
    found = hook(op.call.key, op.call.arguments, op.ctx)
    if inspect.isawaitable(found):
        raise TypeError(
            f"effect {op.call.effect.name} is synchronous but its reconcile hook is async; "
            f"give it a synchronous hook"
        )
    return found


async def run_op_async(op: Op) -> Any:
    """Carry out one operation other than invoking the function, in an event loop."""
    kind = type(op)
    if kind is StoreOp:
        fn = op.fn  # type: ignore[union-attr]
        owner = getattr(fn, "__self__", None)
        # the store's own twins, never a wrapper's that hands attributes on (FaultyStore)
        twins = getattr(owner, "async_twins", None) if hasattr(type(owner), "async_twins") else None
        twin = twins.get(fn.__name__) if twins else None
        if twin is not None:  # sent from this loop: no thread hop
            return await twin(*op.args, **op.kwargs)  # type: ignore[union-attr]
        return await asyncio.to_thread(fn, *op.args, **op.kwargs)  # type: ignore[union-attr]
    if kind is WatchOp:
        return await _AsyncWatch().open(op.store, op.key)  # type: ignore[union-attr]
    if kind is BlockOp:
        return await op.watch.block(op.timeout)  # type: ignore[union-attr]
    if kind is ReconcileOp:
        return await _reconcile_async(op)  # type: ignore[arg-type]
    if kind is SleepOp:
        return await asyncio.sleep(op.seconds)  # type: ignore[union-attr]
    raise TypeError(f"not an operation: {op!r}")  # pragma: no cover


async def run_async(call: Call, invoke: Callable[[EffectContext], Awaitable[Any]]) -> Any:
    """Carry out an async call: its two common outcomes straight through, as :func:`run_sync` does.

    On a store with async twins (scripts sent from the loop), a replay and a first
    run whose claim, function and completion all succeed skip the procedure's
    generator frames. Inside a run its task entered (``async with``), the
    completion is written and not waited for: its reply is read by the task's
    next script on the store, or when the run ends. Anything else carries on in
    the procedure, as every call on a store without twins does. An exception raised
    into the call (a cancellation, a signal handler's) records what is true of where
    it landed, as in :func:`run_sync`.
    """
    store, key = call.store, call.key
    twins = getattr(store, "async_twins", None) if hasattr(type(store), "async_twins") else None
    claim_twin = twins.get("claim") if twins else None
    if claim_twin is None or call.run.prefetched is not None:
        return (await drive_async(procedure(call), invoke))[0]
    started = time.time_ns()
    claim: Claim | None = None
    lease: Lease | None = None
    stage = 0  # 0 claiming, 1 granted, 2 invoked, 3 returned, 4 its completion's fate in hand
    try:
        claim = await claim_twin(key, call.request)
        if claim.kind is ClaimKind.CLAIMED and not claim.error:
            stage = 1
            token, attempt = claim.token, claim.attempt
            options = call.effect.options
            lease = Lease(store, key, token, options.lease_ms)
            heartbeat.keep(lease)
            _emit(call, EventKind.CLAIMED, started, attempt=attempt)
            ctx = call.context(token, attempt, lease)
            started = time.time_ns()
            stage = 2
            value = await invoke(ctx)
            stage = 3
            heartbeat.drop(lease)
            call.run.stats.executed += 1
            _emit(call, EventKind.EXECUTED, started, attempt=attempt)
            encoded = data, state, why = call.effect.codec.encode(value, options.max_result_bytes)
            complete_twin = twins.get("complete") if twins else None
            if state is not ResultState.STORED or complete_twin is None:  # stage 3 still, as above
                await drive_async(_record(call, token, value, attempt, encoded=encoded), invoke)
                return value
            post = twins.get("complete_soon") if twins else None
            if post is not None and call.run.task is not None and call.run.task is asyncio.current_task():
                settle = _Settle(call, token, attempt, encoded)
                if post(
                    key, token, settle, result=data, result_state=state, retention_ms=options.retention_ms
                ):
                    stage = 4
                    if settle.context is not None:
                        settle.written = time.time_ns()
                    # its reply is read by the task's next script on the store, or at the run's end
                    return value
            started = time.time_ns()
            stage = 4
            try:
                recorded = await complete_twin(
                    key, token, result=data, result_state=state, retention_ms=options.retention_ms
                )
            except BaseException as exc:
                first = First(started, error=exc)
                await drive_async(_record(call, token, value, attempt, first, encoded), invoke)
                return value
            if not recorded:
                await drive_async(
                    _record(call, token, value, attempt, First(started, recorded), encoded), invoke
                )
                return value
            _emit(call, EventKind.COMPLETED, started, attempt=attempt, error=why)
            return value
    except BaseException as exc:
        if claim is None:  # the claim's round trip failed, or was cut short
            return (await drive_async(procedure(call, First(started, error=exc)), invoke))[0]
        try:
            _interrupted(call, claim, stage, lease, exc, value if stage == 3 else None)
            if stage == 2:
                await drive_async(_failed(call, claim.token, claim.attempt, lease, started, exc), invoke)
        except BaseException as cut:
            if cut is not exc and stage == 2:  # cancelled, as the function's exception is recorded
                _failed_later(call, claim.token, lease, exc, cut)
            raise
        raise
    kind = claim.kind
    if kind is ClaimKind.COMPLETED:
        value = _replay(call, claim)
        _emit(call, EventKind.REPLAYED, started, attempt=claim.attempt)
        if claim.prefetch_hint is not None:
            await drive_async(_prefetch(call, claim.prefetch_hint), invoke)
        return value
    return (await drive_async(procedure(call, First(started, claim)), invoke))[0]


async def drive_async(proc: Generator[Op, Any, _T], invoke: Callable[[EffectContext], Any]) -> _T:
    """Run the procedure in an event loop: store calls in a worker thread, waits as awaits.

    An exception raised into the driver itself between two of the procedure's steps is
    thrown into the procedure where it waits, as :func:`drive_sync` does.
    """
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            while True:
                op = proc.send(value) if error is None else proc.throw(error)
                value = error = None
                try:
                    if isinstance(op, InvokeOp):
                        value = await invoke(op.ctx)
                    else:
                        value = await run_op_async(op)
                except BaseException as exc:
                    error = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except BaseException as exc:
            if inspect.getgeneratorstate(proc) == inspect.GEN_CLOSED:  # the procedure's own outcome
                raise
            value, error = None, exc


async def _reconcile_async(op: ReconcileOp) -> Any:
    hook = op.call.effect.options.reconcile
    assert hook is not None
    if inspect.iscoroutinefunction(hook):
        return await hook(op.call.key, op.call.arguments, op.ctx)
    found = await asyncio.to_thread(hook, op.call.key, op.call.arguments, op.ctx)
    if inspect.isawaitable(found):
        return await found
    return found
