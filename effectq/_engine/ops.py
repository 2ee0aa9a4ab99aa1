"""The operations the procedure yields (a store primitive, a watch, a wait, the function,
its reconcile hook, a pause) and how each is carried out, blocking or in an event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from ..context import EffectContext
from .calls import Call

if TYPE_CHECKING:
    from ..store.base import Store


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


async def _reconcile_async(op: ReconcileOp) -> Any:
    hook = op.call.effect.options.reconcile
    assert hook is not None
    if inspect.iscoroutinefunction(hook):
        return await hook(op.call.key, op.call.arguments, op.ctx)
    found = await asyncio.to_thread(hook, op.call.key, op.call.arguments, op.ctx)
    if inspect.isawaitable(found):
        return await found
    return found
