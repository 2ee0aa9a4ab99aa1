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

A *tracer* (:class:`Tracer`, registered with :func:`trace`; :mod:`effectq.tracing`
is one) is asked for spans while the work is under way, where an event comes only
after it: a scope made current while the effect's function runs, so the spans the
function makes are its children, and a span around each script effectq's own Redis
wire sends, which Redis instrumentation cannot see. With no tracer registered,
this costs one tuple check at each place.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "STEPS",
    "Event",
    "EventKind",
    "Listener",
    "Scope",
    "Tracer",
    "emit",
    "listeners",
    "subscribe",
    "trace",
    "tracers",
]

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
    EventKind.FAILED: "claim",  # a failed key met by a claim; a terminal exception says "execute"
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


# -- tracers ------------------------------------------------------------------------------------


class Scope(Protocol):
    """What a tracer makes current while an effect's function runs (a span, say).

    :meth:`enter` and :meth:`exit` pair around each stretch of the function (one for a
    plain function, one per item of a stream), in its thread and context; :meth:`end`
    gets the event that reports the execute step (``executed``, ``released`` or
    ``unknown``) once the call has decided what the function's outcome means.
    """

    def enter(self) -> Any:
        """Make the scope current here; returns what :meth:`exit` gets."""

    def exit(self, token: Any) -> None:
        """Undo :meth:`enter`."""

    def end(self, event: Event) -> None:
        """The function's outcome: close the scope."""


class ScriptSpan(Protocol):
    """A span around one script sent to Redis; :meth:`end` gets what stopped it, if anything."""

    def end(self, error: BaseException | None) -> None: ...


class Tracer(Protocol):
    """Spans while the work is under way (see the module docstring)."""

    def execute(self, name: str, key: str, run_id: str, namespace: str, attempt: int) -> Scope:
        """A scope for the function of effect ``name`` about to run under ``key``."""

    def redis_script(self, script: str, peer: tuple[str, int, int] | None) -> ScriptSpan | None:
        """A span for ``script`` (``claim``, ``complete``, ...) sent to the Redis at ``peer``
        (host, port, database; None when unknown), or None for none."""


_tracers: tuple[Tracer, ...] = ()


def trace(tracer: Tracer) -> Callable[[], None]:
    """Ask ``tracer`` for spans while effects run; returns a function that stops it."""
    global _tracers
    with _lock:
        _tracers = (*_tracers, tracer)

    def untrace() -> None:
        global _tracers
        with _lock:
            _tracers = tuple(item for item in _tracers if item is not tracer)

    return untrace


def tracers() -> tuple[Tracer, ...]:
    """The registered tracers (empty: nothing is asked for)."""
    return _tracers


def open_scopes(name: str, key: str, run_id: str, namespace: str, attempt: int) -> tuple[Scope, ...]:
    """Each tracer's scope for a function about to run; one that raises is logged and left out."""
    scopes: list[Scope] = []
    for tracer in _tracers:
        try:
            scopes.append(tracer.execute(name, key, run_id, namespace, attempt))
        except Exception:
            log.exception("effectq tracer %r failed to open a scope", tracer)
    return tuple(scopes)


def enter_scopes(scopes: tuple[Scope, ...]) -> list[Any]:
    """Each scope entered, in order (what :func:`exit_scopes` gets); a failure is logged."""
    tokens: list[Any] = []
    for scope in scopes:
        try:
            tokens.append(scope.enter())
        except Exception:
            log.exception("effectq scope %r failed to enter", scope)
            tokens.append(_NOT_ENTERED)
    return tokens


def exit_scopes(scopes: tuple[Scope, ...], tokens: list[Any]) -> None:
    """Undo :func:`enter_scopes`, the last entered first."""
    for scope, token in zip(reversed(scopes), reversed(tokens), strict=True):
        if token is _NOT_ENTERED:
            continue
        try:
            scope.exit(token)
        except Exception:
            log.exception("effectq scope %r failed to exit", scope)


def end_scopes(scopes: tuple[Scope, ...], event: Event) -> None:
    """Hand each scope the event that closes it; a failure is logged."""
    for scope in scopes:
        try:
            scope.end(event)
        except Exception:
            log.exception("effectq scope %r failed to end", scope)


def script_spans(script: str, peer: tuple[str, int, int] | None) -> list[ScriptSpan]:
    """Each tracer's span for a script about to be sent; a failure is logged and left out."""
    spans: list[ScriptSpan] = []
    for tracer in _tracers:
        try:
            span = tracer.redis_script(script, peer)
        except Exception:
            log.exception("effectq tracer %r failed to open a span", tracer)
            continue
        if span is not None:
            spans.append(span)
    return spans


def end_spans(spans: list[ScriptSpan], error: BaseException | None) -> None:
    """End each of :func:`script_spans`'s spans with what stopped the script, if anything."""
    for span in spans:
        try:
            span.end(error)
        except Exception:
            log.exception("effectq span %r failed to end", span)


_NOT_ENTERED = object()
