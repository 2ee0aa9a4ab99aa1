"""The calls of a generator effect (sync or async): its items stream through, the last is recorded.

A mixin of :class:`~effectq.Effect`, beside its plain calls there: a stream is driven by
:func:`~effectq._engine.drive.drive_generator` (or its async twin) and hands its items to the
consumer while the effect runs, so what a plain call does in one step is spread over the
consumer's iteration here, and an early close is the consumer's (:class:`StreamClosed`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ._engine.calls import Call
from ._engine.drive import StreamClosed, drive_async_generator, drive_generator
from ._runtime.singleflight import flights, follow, follow_async
from .events import EventKind
from .outcome import Seen, waited

__all__ = ["StreamCalls"]


class StreamCalls:
    """``_stream`` and ``_stream_async``: how :class:`~effectq.Effect` runs a generator function."""

    fn: Callable[..., Any]

    def _stream(
        self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen = None
    ) -> Iterator[Any]:
        """A generator effect: items stream through; the last one is recorded.

        A consumer that closes the stream before its end (``close()``, or a ``break`` and
        the generator collected) stops an effect that may have partly applied: its source
        is closed inside the effect and the record turns unknown.
        """
        me = threading.get_ident()
        flight, leader = flights.join(call.store, call.key, call.input_hash, me)
        if not leader:
            flight = follow(flight, call, me)
            if flight.done:
                yield waited(flight.outcome(), seen)
                return
        try:
            source = functools.partial(_items, self.fn, args, kwargs)
            value, came = yield from drive_generator(call, source, flight, me)
        except BaseException as exc:
            flights.land(flight, error=exc)
            if isinstance(exc, StreamClosed):
                return  # closed as asked, and recorded as unknown
            raise
        flights.land(flight, value)
        if seen is not None:
            seen.append((value, came))
        if came is not EventKind.EXECUTED:
            yield value

    async def _stream_async(
        self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen = None
    ) -> AsyncIterator[Any]:
        """An async generator effect: items stream through; the last one is recorded.

        Closed before its end (``aclose()``, or a ``break`` and the generator collected),
        it is recorded as unknown, its source closed, as :meth:`_stream` says.
        """
        me = asyncio.current_task()
        flight, leader = flights.join(call.store, call.key, call.input_hash, me)
        if not leader:
            flight = await follow_async(flight, call, me)
            if flight.done:
                yield waited(flight.outcome(), seen)
                return
        end: list[Any] = []
        try:
            source = functools.partial(_async_items, self.fn, args, kwargs)
            driven = drive_async_generator(call, source, flight, me, end)
            async for item in driven:
                try:
                    yield item
                except BaseException as exc:  # GeneratorExit (closed early): on to the driver, as
                    await driven.athrow(exc)  # yield from would; it raises what the procedure recorded
                    raise
            value, came = end
        except BaseException as exc:
            flights.land(flight, error=exc)
            if isinstance(exc, StreamClosed):
                return  # closed as asked, and recorded as unknown
            raise
        flights.land(flight, value)
        if seen is not None:
            seen.append((value, came))
        if came is not EventKind.EXECUTED:
            yield value


def _items(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Any]:
    return iter(fn(*args, **kwargs))


def _async_items(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncIterator[Any]:
    return fn(*args, **kwargs).__aiter__()  # type: ignore[no-any-return]
