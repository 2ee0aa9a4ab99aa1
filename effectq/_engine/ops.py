"""The operations the procedure yields (a claim, the function, a pipelined completion, a store
primitive, a watch, a wait, its reconcile hook, a pause) and how each is carried out, blocking
or in an event loop.

The two of every call are the objects they act on, so none is built for them: a
:class:`~effectq._engine.calls.Call` yielded is its claim (``call.store.claim(call.key,
call.request)``, or the same on the store's async twin), an
:class:`~effectq.context.EffectContext` the function run in it. The rest are small classes
of their own.

A pipelined completion is no operation: it never blocks, so the procedure calls the driver's
way to write one (:func:`pipeline_sync`, :func:`pipeline_async`) rather than yield it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

from .._runtime.repairs import Settle
from ..context import EffectContext
from ..events import EventKind
from .calls import Call

if TYPE_CHECKING:
    from ..store.base import AsyncStore, Store


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


class ReconcileOp:
    __slots__ = ("call", "ctx")

    def __init__(self, call: Call, ctx: EffectContext) -> None:
        self.call, self.ctx = call, ctx


class SleepOp:
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Op = Call | EffectContext | StoreOp | WatchOp | BlockOp | ReconcileOp | SleepOp


Procedure = Generator[Op, Any, tuple[Any, EventKind]]


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
    if kind is Call:
        return op.store.claim(op.key, op.request)  # type: ignore[union-attr]
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


async def run_op_async(op: Op, store: Store | None = None, astore: AsyncStore | None = None) -> Any:
    """Carry out one operation other than invoking the function, in an event loop.

    ``astore``: ``store.async_store()``, whose ``claim``, ``complete`` and ``prefetch`` are
    carried out from this loop (no thread hop; a prefetch hops only for its I/O); without it,
    store calls go to a worker thread, so a slow store never blocks the loop."""
    kind = type(op)
    if kind is Call:
        return await claim_async(op, astore)  # type: ignore[arg-type]
    if kind is StoreOp:
        fn = op.fn  # type: ignore[union-attr]
        if astore is not None and getattr(fn, "__self__", None) is store:  # not a wrapper's own
            name = fn.__name__
            if name == "claim":
                return await astore.claim(*op.args, **op.kwargs)  # type: ignore[union-attr]
            if name == "complete":
                return await astore.complete(*op.args, **op.kwargs)  # type: ignore[union-attr]
            if name == "prefetch":
                return await astore.prefetch(*op.args, **op.kwargs)  # type: ignore[union-attr]
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


def claim_async(call: Call, astore: AsyncStore | None) -> Awaitable[Any]:
    """What to await for the claim of ``call``: ``astore`` (the call's store's async twin) sends
    it from this loop; without one, the store's claim runs in a worker thread. A plain function
    (as :func:`pipeline_async` is), so a driver awaits the claim itself, no coroutine between."""
    if astore is not None:
        return astore.claim(call.key, call.request)
    return asyncio.to_thread(call.store.claim, call.key, call.request)


def pipeline_sync(settle: Settle) -> bool:
    """Write ``settle``'s completion now and read its reply later, where the store can (see
    ``Store.complete_pipelined``), from blocking code; False: not written, complete the usual
    way. Only the thread that entered the call's run pipelines: its run's end reads the
    replies still pending."""
    call = settle.call
    run, store = call.run, call.store
    if run.thread != threading.get_ident() or not _write(settle, store.complete_pipelined):
        return False
    run.pending(store)
    return True


def pipeline_async(astore: AsyncStore | None, settle: Settle) -> bool:
    """:func:`pipeline_sync` in an event loop, on ``astore`` (the store's async twin): written
    now, never awaited; only from the task that entered the call's run."""
    run = settle.call.run
    task = run.task
    if astore is None or task is None or task is not asyncio.current_task():
        return False
    if not _write(settle, astore.complete_pipelined):
        return False
    run.pending_async(astore)
    return True


def _write(settle: Settle, complete_pipelined: Callable[..., bool]) -> bool:
    """Hand ``settle``'s completion to ``complete_pipelined`` (a store's, or its async twin's)."""
    if not complete_pipelined(settle.call.key, settle.token, settle, **settle.kwargs):
        return False
    if settle.context is not None:
        settle.written = time.time_ns()
    return True


async def _reconcile_async(op: ReconcileOp) -> Any:
    hook = op.call.effect.options.reconcile
    assert hook is not None
    if inspect.iscoroutinefunction(hook):
        return await hook(op.call.key, op.call.arguments, op.ctx)
    found = await asyncio.to_thread(hook, op.call.key, op.call.arguments, op.ctx)
    if inspect.isawaitable(found):
        return await found
    return found
