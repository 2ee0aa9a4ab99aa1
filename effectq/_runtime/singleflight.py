"""Single flight inside one process: concurrent calls of one key share one execution.

The first caller of a key (the leader) runs the whole procedure, store round
trips included; callers that arrive while it runs (followers, in other threads
or asyncio tasks) wait for its outcome instead of asking the store. Across
processes the store's claim does the same job; this only saves round trips and
gives asyncio tasks a wait that never blocks their loop.

A follower takes the leader's outcome only where it is the follower's too (see
``effectq.effect``): otherwise it waits for the landing, then asks the store as a
caller after the leader would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from .._engine.decide import is_crash
from ..errors import InProgress, ReentrantEffectError

if TYPE_CHECKING:
    from .._engine.calls import Call

__all__ = ["Flight", "flights", "follow", "follow_async"]


class Flight:
    """The outcome of one in-process execution, for its followers.

    A flight nobody follows costs a dict entry: the event a follower blocks on, or
    the list of the futures tasks await, is made only when a follower arrives.
    """

    __slots__ = ("_callbacks", "_event", "_ident", "done", "error", "input_hash", "owner", "value")

    def __init__(self, ident: tuple[int, str], input_hash: str, owner: object) -> None:
        self._ident = ident
        self._event: threading.Event | None = None
        self._callbacks: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None = None
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.input_hash = input_hash
        self.owner = owner
        """Who is inside the leader's call, blocked until it lands: its thread's id (a
        synchronous call) or its asyncio task; None while a stream waits for its consumer.
        A caller of the key that is the owner would wait for itself."""

    def wait(self, timeout: float) -> bool:
        """Block until landed (True) or ``timeout`` passes (False)."""
        with flights.lock:  # among followers: one event, made once
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self.done:  # looked at once the event is there: a landing sets it, or came before
            return True
        return event.wait(timeout)

    async def wait_async(self, timeout: float) -> bool:
        """Await the landing without blocking the event loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with flights.lock:
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append((loop, future))
        if self.done:  # as in wait(): looked at once the future is there for a landing to settle
            return True
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
        self.lock = threading.Lock()
        self._flights: dict[tuple[int, str], Flight] = {}
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:  # a forked child has none of its parent's flights
        self.lock = threading.Lock()
        self._flights = {}

    def join(self, store: object, key: str, input_hash: str, owner: object) -> tuple[Flight, bool]:
        """(the flight of ``key``, whether this caller leads it: then ``owner`` owns it).

        No lock: the dict's ``setdefault`` finds or registers the flight in one step (its
        keys hash and compare in C). A landing removes only its own flight, so a caller
        finds the flight that still runs or registers a new one."""
        ident = (id(store), key)
        flight = Flight(ident, input_hash, owner)
        found = self._flights.setdefault(ident, flight)
        return found, found is flight

    def land(self, flight: Flight, value: Any = None, error: BaseException | None = None) -> None:
        """Publish the leader's outcome and forget the flight (later callers ask the store).

        Once landed, no follower waits on it any more: they find it done. No lock: a follower
        puts its event (or future) on the flight before it looks at ``done``, and this looks
        at them after setting it, so each follower finds it done or is woken. Nothing here
        calls out before ``done`` is set, so no signal handler's exception can land between
        the flight's removal and its outcome.
        """
        ident, registered = flight._ident, self._flights
        if ident in registered and registered[ident] is flight:  # not after a fork, which forgets them
            del registered[ident]
        flight.value, flight.error = value, error
        flight.done = True
        event, callbacks = flight._event, flight._callbacks
        if event is not None:
            event.set()
        if callbacks is not None:
            for loop, future in callbacks:
                with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                    loop.call_soon_threadsafe(_settle, future)


flights = _Flights()


def _shares(flight: Flight, call: Call) -> bool:
    """Whether the leader's landed outcome is ``call``'s too: what a caller after it would get.

    Not when the leader had another input (that caller's replay would be checked against
    the record), nor when a control-flow exception aimed at the leader alone stopped it (a
    cancellation, ^C, a worker's time limit): that says nothing of the effect, which the
    record tells. A simulated crash (``effectq.testing``) stands for the whole process.
    """
    error = flight.error
    if error is not None and not isinstance(error, Exception) and not is_crash(error):
        return False
    mine, theirs = call.input_hash, flight.input_hash
    return not (mine and theirs and mine != theirs)


def follow(flight: Flight, call: Call, me: int) -> Flight:
    """Wait for the leader of ``call``'s key in this process.

    Returns the landed flight when its outcome is ``call``'s too (see :func:`_shares`),
    or else a flight ``call`` leads: it then asks the store, as a caller after the leader
    does. The thread inside the leader's call cannot wait for it.
    """
    deadline = time.monotonic() + call.effect.options.wait
    while True:
        if flight.owner == me:
            raise ReentrantEffectError(call.key, name=call.effect.name)
        if not flight.wait(deadline - time.monotonic()):
            raise InProgress(call.key, name=call.effect.name, waited=call.effect.options.wait)
        flight, settled = _landed(flight, call, me)
        if settled:
            return flight


async def follow_async(flight: Flight, call: Call, me: asyncio.Task[Any] | None) -> Flight:
    """:func:`follow` for a task: neither the task inside the leader's call, nor one on a
    loop a synchronous leader on this thread runs inside its call, can wait for it."""
    deadline = time.monotonic() + call.effect.options.wait
    while True:
        if (me is not None and flight.owner is me) or flight.owner == threading.get_ident():
            raise ReentrantEffectError(call.key, name=call.effect.name)
        if not await flight.wait_async(deadline - time.monotonic()):
            raise InProgress(call.key, name=call.effect.name, waited=call.effect.options.wait)
        flight, settled = _landed(flight, call, me)
        if settled:
            return flight


def _landed(flight: Flight, call: Call, me: object) -> tuple[Flight, bool]:
    """After the leader landed: (its flight, True) when its outcome is ``call``'s; else
    (a flight ``call`` leads, True), or (another caller's new flight to follow, False)."""
    if _shares(flight, call):
        call.run.stats.waited += 1
        return flight, True
    flight, leader = flights.join(call.store, call.key, call.input_hash, me)
    if leader:
        call.run.stats.waited += 1
    return flight, leader
