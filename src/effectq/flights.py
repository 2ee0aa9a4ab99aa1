"""Single flight inside one process: concurrent calls of one key share one execution.

The first caller of a key (the leader) runs the whole procedure, store round
trips included; callers that arrive while it runs (followers, in other threads
or asyncio tasks) wait for its outcome instead of asking the store. Across
processes the store's claim does the same job; this only saves round trips and
gives asyncio tasks a wait that never blocks their loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

__all__ = ["Flight", "flights"]


class Flight:
    """The outcome of one in-process execution, for its followers."""

    __slots__ = ("_callbacks", "_done", "_lock", "error", "input_hash", "value")

    def __init__(self, input_hash: str) -> None:
        self._done = threading.Event()
        self._callbacks: list[Any] = []
        self._lock = threading.Lock()
        self.value: Any = None
        self.error: BaseException | None = None
        self.input_hash = input_hash

    def land(self, value: Any = None, error: BaseException | None = None) -> None:
        """Publish the leader's outcome to every follower."""
        with self._lock:
            self.value, self.error = value, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for loop, future in callbacks:
            loop.call_soon_threadsafe(_settle, future)

    def wait(self, timeout: float) -> bool:
        """Block until landed (True) or ``timeout`` passes (False)."""
        return self._done.wait(timeout)

    async def wait_async(self, timeout: float) -> bool:
        """Await the landing without blocking the event loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._done.is_set():
                return True
            self._callbacks.append((loop, future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return False
        return True

    def outcome(self) -> Any:
        """The leader's value, or raise its exception."""
        if self.error is not None:
            raise self.error
        return self.value


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Flights:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[tuple[int, str], Flight] = {}
        self._pid = os.getpid()

    def join(self, store: object, key: str, input_hash: str) -> tuple[Flight, bool]:
        """(the flight of ``key``, whether this caller leads it)."""
        ident = (id(store), key)
        with self._lock:
            if self._pid != os.getpid():
                self._flights.clear()
                self._pid = os.getpid()
            flight = self._flights.get(ident)
            if flight is not None:
                return flight, False
            flight = self._flights[ident] = Flight(input_hash)
            return flight, True

    def finish(self, store: object, key: str, flight: Flight) -> None:
        """Forget the flight: later callers go to the store (which has the record)."""
        with self._lock:
            if self._flights.get((id(store), key)) is flight:
                del self._flights[(id(store), key)]


flights = _Flights()
