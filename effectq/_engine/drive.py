"""The drivers: the only loops over a procedure, for sync, async and streaming effects.

Each sends the procedure the result of the operation it yielded (or throws in what
that raised) until it returns. Every decision is the procedure's: a driver only says
how an operation is carried out here, blocking or awaited, and, for a stream, how the
function's items reach the consumer. An exception raised into the driver itself (a
time limit, from a signal handler) between two of the procedure's steps is thrown
into the procedure where it waits, as if the operation it waits for had raised it:
its step records what is true.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from .._exceptions import describe_exception
from ..context import EffectContext, bind_effect, unbind_effect
from .calls import Call
from .ops import claim_async, pipeline_async, pipeline_sync, run_op_async, run_op_sync
from .procedure import procedure

if TYPE_CHECKING:
    from .._runtime.singleflight import Flight
    from ..events import EventKind

__all__ = [
    "StreamClosed",
    "drive_async_generator",
    "drive_generator",
    "run_async",
    "run_sync",
]


def run_sync(call: Call, invoke: Callable[[EffectContext], Any]) -> tuple[Any, EventKind]:
    """Carry out a synchronous call: the procedure, driven blocking, calling store primitives
    and the function directly. Returns (value, how it came)."""
    proc = procedure(call, pipeline_sync)
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            while True:
                op = proc.send(value) if error is None else proc.throw(error)
                value = error = None
                kind = type(op)
                try:  # the commonest carried out here: no call of run_op_sync between
                    if kind is Call:
                        value = op.store.claim(op.key, op.request)  # type: ignore[union-attr]
                    elif kind is EffectContext:
                        value = invoke(op)  # type: ignore[arg-type]
                    else:
                        value = run_op_sync(op)
                except BaseException as exc:
                    error = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except BaseException as exc:
            if inspect.getgeneratorstate(proc) == inspect.GEN_CLOSED:  # the procedure's own outcome
                raise
            value, error = None, exc


async def run_async(call: Call, invoke: Callable[[EffectContext], Awaitable[Any]]) -> tuple[Any, EventKind]:
    """Carry out an async call: the procedure, driven in the event loop, store calls on the
    store's async twin (or in a worker thread), waits as awaits. Returns (value, how it came)."""
    store = call.store
    astore = store.async_store()
    proc = procedure(call, functools.partial(pipeline_async, astore))
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            while True:
                op = proc.send(value) if error is None else proc.throw(error)
                value = error = None
                kind = type(op)
                try:  # the commonest carried out here: no coroutine of run_op_async between
                    if kind is Call:
                        value = await claim_async(op, astore)  # type: ignore[arg-type]
                    elif kind is EffectContext:
                        value = await invoke(op)  # type: ignore[arg-type]
                    else:
                        value = await run_op_async(op, store, astore)
                except BaseException as exc:
                    error = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except BaseException as exc:
            if inspect.getgeneratorstate(proc) == inspect.GEN_CLOSED:  # the procedure's own outcome
                raise
            value, error = None, exc


# -- streams --------------------------------------------------------------------------------


class StreamClosed(BaseException):
    """A stream's consumer closed it before its end; what the driver tells the procedure.

    Not the function's exception: the stream may have partly applied, so it is recorded
    as unknown whatever ``maybe_applied`` says. Never raised to the caller.
    """

    def __init__(self, count: int, detail: str = "") -> None:
        items = "1 item" if count == 1 else f"{count} items"
        super().__init__(f"the consumer closed the stream after {items}, before its end{detail}")


def drive_generator(
    call: Call,
    source: Callable[[], Iterator[Any]],
    flight: Flight,
    me: object,
) -> Generator[Any, None, tuple[Any, EventKind]]:
    """Run the procedure of a generator effect's call: its items stream through to the consumer,
    the last one is what the procedure records. Returns the procedure's (value, how it came).

    ``source()`` starts the function; while the consumer holds an item, ``flight`` (this
    key's in this process) is not ``me``'s: the consumer may call the effect again. A
    consumer that closes the stream early closes the source inside the effect, and the
    procedure records :class:`StreamClosed` (unknown).
    """
    proc = procedure(call, pipeline_sync)
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = proc.send(value) if error is None else proc.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = error = None
        if type(op) is not EffectContext:
            try:
                value = run_op_sync(op)
            except BaseException as exc:
                error = exc
            continue
        ctx = op
        last: Any = None
        count = 0
        try:
            items = source()
            while True:
                token = bind_effect(ctx)
                try:
                    item = next(items)
                except StopIteration:
                    break
                finally:
                    unbind_effect(token)
                last = item
                count += 1
                flight.owner = None  # the consumer's now, outside the effect
                try:
                    yield item
                except GeneratorExit:
                    raise _close(items, ctx, count) from None
                flight.owner = me
            value = last
        except BaseException as exc:
            error = exc


async def drive_async_generator(
    call: Call,
    source: Callable[[], AsyncIterator[Any]],
    flight: Flight,
    me: object,
    end: list[Any],
) -> AsyncGenerator[Any, None]:
    """:func:`drive_generator` for an async generator effect; the procedure's (value,
    how it came) is appended to ``end`` (an async generator returns nothing)."""
    store = call.store
    astore = store.async_store()
    proc = procedure(call, functools.partial(pipeline_async, astore))
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = proc.send(value) if error is None else proc.throw(error)
        except StopIteration as stop:
            end.extend(stop.value)
            return
        value = error = None
        if type(op) is not EffectContext:
            try:
                value = await run_op_async(op, store, astore)
            except BaseException as exc:
                error = exc
            continue
        ctx = op
        last: Any = None
        count = 0
        try:
            items = source()
            while True:
                token = bind_effect(ctx)
                try:
                    item = await items.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    unbind_effect(token)
                last = item
                count += 1
                flight.owner = None  # the consumer's now, outside the effect
                try:
                    yield item
                except GeneratorExit:
                    raise await _aclose(items, ctx, count) from None
                flight.owner = me
            value = last
        except BaseException as exc:
            error = exc


def _close(source: Iterator[Any], ctx: EffectContext, count: int) -> StreamClosed:
    """Close the source of a stream closed early, inside the effect (its cleanup may call
    ``current_effect()``); a cleanup that raises goes into the record's reason."""
    token = bind_effect(ctx)
    try:
        source.close()  # type: ignore[attr-defined]
    except Exception as exc:
        return StreamClosed(count, f"; closing its source raised {describe_exception(exc, 200)}")
    finally:
        unbind_effect(token)
    return StreamClosed(count)


async def _aclose(source: AsyncIterator[Any], ctx: EffectContext, count: int) -> StreamClosed:
    """:func:`_close` for an async stream."""
    token = bind_effect(ctx)
    try:
        await source.aclose()  # type: ignore[attr-defined]
    except Exception as exc:
        return StreamClosed(count, f"; closing its source raised {describe_exception(exc, 200)}")
    finally:
        unbind_effect(token)
    return StreamClosed(count)
