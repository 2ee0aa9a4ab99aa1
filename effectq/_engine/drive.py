"""The drivers: the loops that run a procedure, for sync, async and streaming effects."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

from .._runtime.leases import Lease, heartbeat
from .._runtime.repairs import _cut_after_return, _failed_later, _give_back_unrun, _Settle
from ..context import EffectContext
from ..errors import (
    EffectqError,
)
from ..events import EventKind
from ..store.base import Claim, ClaimKind, ResultState
from .calls import Call, First, _emit
from .ops import _T, InvokeOp, Op, run_op_async, run_op_sync
from .procedure import _failed, _prefetch, _record, _replay, procedure

if TYPE_CHECKING:
    pass


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
