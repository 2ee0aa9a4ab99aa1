"""The procedure: claim, then replay, wait, reconcile or execute, then record.

Written once, as a generator that yields operations (see :mod:`.ops`) and receives
their results; :mod:`.drive` runs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import Any

from .. import events
from .._exceptions import describe_exception
from .._runtime.leases import Lease, heartbeat
from .._runtime.repairs import (
    Settle,
    _failed_later,
    _give_back_later,
    _give_back_unrun,
    _take_back_later,
)
from ..codec import DecodeError
from ..errors import (
    ClaimNotReplicatedError,
    CorruptRecordError,
    EffectqError,
    InProgress,
    OutcomeUnknown,
    ReconcileError,
    StoreError,
)
from ..events import EventKind
from ..store.base import Claim, ClaimKind, Status
from .calls import Applied, Call, _emit
from .decide import Next, after_claim, check_input, exhausted, failed, is_crash, replayed, wait_for
from .ops import BlockOp, Op, Procedure, ReconcileOp, SleepOp, StoreOp, WatchOp
from .record import _complete, _cut, _encoded, _failed, _record, _store, _store_failed, _write

log_claim = logging.getLogger("effectq.claim")
log_replay = logging.getLogger("effectq.replay")
log_wait = logging.getLogger("effectq.wait")
log_complete = logging.getLogger("effectq.complete")
log_release = logging.getLogger("effectq.release")
log_unknown = logging.getLogger("effectq.unknown")
log_reconcile = logging.getLogger("effectq.reconcile")


CLAIM_RETRIES = (0.05, 0.25, None)
"""Pauses between tries of a claim whose round trip failed (None: give up)."""


_NOT_FOUND = object()

# The Enum members a call's common path reads, as module globals: on Python 3.11 reading a
# member off its class goes through EnumType's __getattr__ hook, about 1,000 instructions each;
# a global is a dict read. How the value came, as procedure() returns it:
_EXECUTED, _REPLAYED, _RECONCILED, _WAITED = (
    EventKind.EXECUTED,
    EventKind.REPLAYED,
    EventKind.RECONCILED,
    EventKind.WAITED,
)
_CLAIMED_EVENT = EventKind.CLAIMED
_GRANTED = ClaimKind.CLAIMED
_EXECUTE, _REPLAY, _WAIT = Next.EXECUTE, Next.REPLAY, Next.WAIT


def _claim_failed(call: Call, exc: BaseException, started: int) -> Generator[Op, Any, tuple[Claim, int]]:
    """A claim whose try (sent at ``started``) raised ``exc``: tried again with the same owner
    (the grant comes back, not a conflict), or raised. Returns the claim and when its try began.

    When every try fails, or the wait for its reply is interrupted (a cancelled task,
    a time limit), the claim may still have landed: nothing ran under it, so the
    heartbeat keeps trying to take it back and release it, rather than leave a
    dispatched record to turn into a false unknown; unless no try was sent at all (a
    connection refused): then no claim can exist.
    """
    store = call.store
    unanswered = False  # whether a failed try may have reached the store
    for pause in CLAIM_RETRIES:
        if not isinstance(exc, StoreError):
            if not isinstance(exc, EffectqError | GeneratorExit) and not is_crash(exc):
                # Interrupted while its reply was awaited (a cancelled task, a time limit, ^C):
                # the claim may land all the same, with nothing to run under it.
                _take_back_later(call, "interrupted", after=0.0)
            raise exc
        _store_failed(call, store.claim, started, exc)
        if isinstance(exc, CorruptRecordError):
            raise exc
        if isinstance(exc, ClaimNotReplicatedError):
            yield from _give_back(call, exc)
            raise exc
        unanswered = unanswered or exc.sent
        if pause is None:
            if unanswered:
                _take_back_later(call, "unanswered")
            raise exc
        yield SleepOp(pause)
        started = time.time_ns()
        try:
            claim = yield call
        except BaseException as again:
            exc = again
            continue
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
            "mark_unknown", call, call.store.mark_unknown, call.key, claim.token, error=claim.error, ran=False
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
        ran=False,
    )


def procedure(call: Call, pipeline: Callable[[Settle], bool]) -> Procedure:
    """Claim the effect and do what the claim says (see :func:`.decide.after_claim`).
    Returns (value, how it came: ``EXECUTED``, ``REPLAYED``, ``RECONCILED`` or ``WAITED``).

    ``pipeline``: the driver's way to write the function's completion without waiting for its
    reply (see :mod:`.ops`); False: not written, it is completed the usual way."""
    effect, store, key = call.effect, call.store, call.key
    prefetched = call.run.prefetched
    if prefetched is not None:
        started = time.time_ns()
        found = prefetched.get(key)
        if found is not None:
            value = replayed(call, found)
            _emit(call, _REPLAYED, started, attempt=found.attempt)
            return value, _REPLAYED
    waiting_since: int | None = None
    came = _REPLAYED  # WAITED once this call waited for the effect in flight elsewhere
    watch: Any = None
    granted: int | None = None  # the token of a grant nothing has run under yet
    lease: Lease | None = None
    invoked = False
    try:
        try:
            while True:
                started = time.time_ns()
                retries: Generator[Op, Any, tuple[Claim, int]] | None = None
                try:  # the first try here; the retries only once one fails
                    claim = yield call
                except BaseException as exc:
                    retries = _claim_failed(call, exc, started)
                if retries is not None:
                    claim, started = yield from retries
                if claim.kind is _GRANTED:  # before any call: an exception raised into
                    granted = claim.token  # the call from here on gives the grant back
                then = after_claim(claim)
                if then is not _WAIT and waiting_since is not None:
                    _emit(call, _WAITED, waiting_since)
                    waiting_since = None
                    came = _WAITED
                if then is _EXECUTE:
                    token, attempt = claim.token, claim.attempt
                    _emit(call, _CLAIMED_EVENT, started, attempt)
                    break
                if then is _REPLAY:
                    value = replayed(call, claim)
                    _emit(call, _REPLAYED, started, claim.attempt)
                    if claim.prefetch_hint is not None:
                        yield from _prefetch(call, claim.prefetch_hint)
                    return value, came
                if then is Next.RECONCILE:
                    found = yield from _reconcile(call, claim)
                    if found is not _NOT_FOUND:
                        return found, _RECONCILED
                    attempt = yield from _dispatch(call, claim.token)
                    if attempt < 0:  # parked: this execution would be past max_attempts
                        call.run.stats.failed += 1
                        _emit(call, EventKind.FAILED, started, attempt=claim.attempt, error=claim.error)
                        raise exhausted(call, claim.attempt, claim.error)
                    if not attempt:
                        log_reconcile.warning(
                            "effectq lost the claim of %s after reconcile; looking again", key
                        )
                        continue
                    token = granted = claim.token
                    _emit(call, _CLAIMED_EVENT, started, attempt)
                    break
                if then is _WAIT:
                    if waiting_since is None:
                        waiting_since = started
                        call.run.stats.waited += 1
                        log_wait.debug("effectq %s in flight (holder %s); waiting", key, claim.owner)
                    waited = (time.time_ns() - waiting_since) / 1e9
                    block = wait_for(claim, waited, effect.options.wait)
                    if block is None:
                        call.run.stats.failed += 1
                        _emit(call, EventKind.IN_PROGRESS, waiting_since, error=claim.owner)
                        raise InProgress(key, name=effect.name, waited=waited, owner=claim.owner)
                    if watch is None:  # subscribe, then look again: no notification is missed
                        watch = yield WatchOp(store, key)
                        continue
                    yield BlockOp(watch, block)
                    continue
                if then is Next.FAIL:
                    call.run.stats.failed += 1
                    _emit(call, EventKind.FAILED, started, attempt=claim.attempt, error=claim.error)
                    raise failed(call, claim)
                # RAISE: may have applied, and this caller may neither reconcile nor replay.
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
        if claim.error and claim.status is Status.DISPATCHED and claim.kind is _GRANTED:
            log_unknown.warning(
                "effectq re-executing %s after an unknown outcome (%s): it is declared replay-safe "
                "(safe to repeat, or deduped by its idempotency key)",
                key,
                claim.error,
            )
        lease = Lease(store, key, token, effect.options.lease_ms)
        heartbeat.keep(lease)
        ctx = call.context(token, attempt, lease)
        if events._tracers:  # a tracer's span, current while the function runs (read as _emit does)
            call.open_scopes(ctx)
        started = time.time_ns()
        invoked = True
        value = yield ctx
    except BaseException as exc:
        if granted is None:
            raise
        if not invoked:
            # Cut between the grant and the function (a time limit): nothing ran under it. A
            # re-dispatched unknown goes back to unknown (as _give_back does); any other is released.
            _give_back_unrun(call, granted, lease, exc, unknown=claim.error)
            raise
        try:
            yield from _failed(call, token, attempt, lease, started, exc)
        except BaseException as cut:
            if cut is not exc:
                _failed_later(call, token, lease, exc, cut)
            raise
        raise  # pragma: no cover - _failed raises
    kwargs: dict[str, Any] | None = None
    try:  # the function returned: its completion, written now and its reply read later if it can be
        heartbeat.drop(lease)
        call.run.stats.executed += 1
        _emit(call, _EXECUTED, started, attempt)
        kwargs, why, pipelinable = _encoded(call, value)
        if pipelinable and pipeline(Settle(call, token, attempt, kwargs, why)):
            return (
                value,
                _EXECUTED,
            )  # its reply is read by the next script on that connection, or the run's end
        yield from _complete(call, token, value, attempt, kwargs, why)
    except BaseException as cut:
        _cut(call, token, value, cut, kwargs, lease)
        raise
    return value, _EXECUTED


def _prefetch(call: Call, hint: Any) -> Generator[Op, Any, None]:
    """A replay means a redelivery: fetch the run's other completed effects at once.

    The claim that found the replay also brought the run's other completed records
    (``hint``, up to claim.lua's bound), so this is no round trip within the bound and
    one past it. Later
    calls of the run then replay without a round trip each. Best effort: a failure
    only means the calls claim as usual.
    """
    run = call.run
    if run.prefetch_tried or hint is None:
        return
    run.prefetch_tried = True
    try:  # a store that does not prefetch returns None
        run.prefetched = yield StoreOp(call.store.prefetch, run.id, hint)
    except StoreError as exc:
        log_replay.debug("effectq prefetch of run %s failed (%s); claiming one by one", run.id, exc)


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
    check_input(call, claim.input_hash)
    return value


def _dispatch(call: Call, token: int) -> Generator[Op, Any, int]:
    """After a reconcile found nothing: dispatch under its token. Returns the attempt (0: lost;
    -1: parked, the attempt would be past ``max_attempts``).

    A failed round trip is tried again with the same token (a retried dispatch gets its attempt
    back, with a lease from the retry). When every try fails, or the wait for its reply is
    interrupted, the dispatch may have landed with nothing run under it: the heartbeat gives it
    back (a release), rather than leave a dispatched record nobody runs to turn unknown.
    """
    store, key, options = call.store, call.key, call.effect.options
    limits = {"max_attempts": options.max_attempts, "retention_ms": options.retention_ms}
    for pause in CLAIM_RETRIES:
        try:
            attempt: int = yield from _store(
                call, store.dispatch, key, token, lease_ms=options.lease_ms, **limits
            )
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
