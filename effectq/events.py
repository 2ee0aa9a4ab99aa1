"""Events: what effects do, for metrics, tracing and audit.

Subscribe a listener; the engine calls it synchronously, in the calling
thread and context (so a tracing listener sees the caller's current span),
after each phase of an effect call. A completion written without waiting for
its reply (inside a run; see docs/protocol.md) is reported when the reply is
read: with the next effect's claim, or at the run's end, still in the
context of the call it belongs to. A listener that raises is logged and
ignored: observability never changes what an effect does. With no listener
subscribed, emitting costs one tuple check.

    def on_event(event: effectq.events.Event) -> None:
        print(event.kind, event.name, f"{event.duration * 1000:.1f} ms")

    unsubscribe = effectq.events.subscribe(on_event)
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["STEPS", "Event", "EventKind", "Listener", "emit", "listeners", "subscribe"]

log = logging.getLogger("effectq.events")


class EventKind(enum.StrEnum):
    """The phase an event reports."""

    CLAIMED = "claimed"
    """This call holds the claim and runs the function; duration: the claim."""
    REPLAYED = "replayed"
    """A recorded result came back without running; duration: the claim."""
    EXECUTED = "executed"
    """The function ran and returned; duration: the function."""
    COMPLETED = "completed"
    """The result was recorded; duration: the write (the round trip, when its reply was waited for)."""
    RELEASED = "released"
    """The function raised an exception that means "not applied"; duration: the function."""
    UNKNOWN = "unknown"
    """Maybe applied: recorded as unknown by this call, or met by this call (OutcomeUnknown)."""
    FAILED = "failed"
    """Failed for good: a terminal exception recorded by this call (duration: the function), or a
    failed key met by this call (a recorded terminal exception raised again, or AttemptsExhausted)."""
    RECONCILED = "reconciled"
    """A reconcile hook found the effect applied and it was recorded; duration: the hook."""
    WAITED = "waited"
    """This call waited for the same effect in flight elsewhere; duration: the wait."""
    IN_PROGRESS = "in_progress"
    """The wait ran out (InProgress raised); duration: the wait."""
    STORE_ERROR = "store_error"
    """The store failed; error says how."""


@dataclass(frozen=True, slots=True)
class Event:
    """One phase of one effect call.

    Attributes:
        kind: the phase.
        name: the effect name.
        key: the effect key.
        run_id: the run id.
        namespace: the store's namespace.
        attempt: the dispatch attempt (0 when the call did not dispatch).
        started_ns: wall-clock start of the phase (``time.time_ns()``).
        duration: seconds the phase took.
        error: the exception or reason, when there is one (never a result body).
        step: the step that reported: ``claim``, ``execute``, ``complete``,
            ``reconcile``, ``wait``, or for ``store_error`` the store primitive
            that failed. It tells an ``unknown`` met at the claim (an earlier
            attempt's) from one this call's function caused.
    """

    kind: EventKind
    name: str
    key: str
    run_id: str
    namespace: str
    attempt: int = 0
    started_ns: int = 0
    duration: float = 0.0
    error: str = ""
    step: str = ""


STEPS: dict[EventKind, str] = {
    EventKind.CLAIMED: "claim",
    EventKind.REPLAYED: "claim",
    EventKind.UNKNOWN: "claim",
    EventKind.EXECUTED: "execute",
    EventKind.RELEASED: "execute",
    EventKind.COMPLETED: "complete",
    EventKind.RECONCILED: "reconcile",
    EventKind.WAITED: "wait",
    EventKind.IN_PROGRESS: "wait",
    EventKind.STORE_ERROR: "store",
}
"""The step each kind reports from, unless the event says otherwise."""


Listener = Callable[[Event], None]

_lock = threading.Lock()
_listeners: tuple[Listener, ...] = ()


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener(event)`` for every event; returns a function that unsubscribes it."""
    global _listeners
    with _lock:
        _listeners = (*_listeners, listener)

    def unsubscribe() -> None:
        global _listeners
        with _lock:
            _listeners = tuple(item for item in _listeners if item is not listener)

    return unsubscribe


def listeners() -> tuple[Listener, ...]:
    """The subscribed listeners (empty: events are not even built)."""
    return _listeners


def emit(event: Event) -> None:
    """Hand ``event`` to every listener; a listener that raises is logged and skipped."""
    for listener in _listeners:
        try:
            listener(event)
        except Exception:
            log.exception("effectq event listener %r failed on %s", listener, event.kind)
