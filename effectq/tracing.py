"""OpenTelemetry spans from effectq's events (``pip install 'effectq[otel]'``).

    import effectq.tracing

    effectq.tracing.install()            # the global tracer provider
    effectq.tracing.install(provider)    # or a provider of your own

Each step of an effect call becomes a span, a child of the span current where
the effect was called: ``effectq.claim NAME``, ``effectq.execute NAME``,
``effectq.complete NAME``, and ``effectq.reconcile``/``effectq.wait`` when they
happen. Spans carry the effect key, name, run id, namespace and attempt, and
the outcome (``effectq.outcome``: claimed, replayed, unknown, ...); an outcome
that is not a success (released, unknown, in progress, a store error) sets the
span's status to ERROR with the recorded reason (never a result body).

``effectq.execute`` is the current span while the function runs (its own
thread and context; a task it starts copies it), so the spans the function
makes, an HTTP call or a query, are its children. The other steps' spans are
made when each has finished, from the event's start time and duration.

The scripts effectq sends on its own Redis wire bypass ``Redis.execute_command``,
which Redis instrumentation (OpenTelemetry's, Datadog's, Elastic's) wraps: they
are spans of their own here, ``effectq.redis SCRIPT`` (a client span with
``db.system`` redis, ``db.operation`` EVALSHA, the peer's host and port), made
inside a trace only (a heartbeat's renewal, outside any, makes none). A store
built with ``via_execute_command=True`` sends them through redis-py instead,
where that instrumentation sees them; effectq then makes none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import __version__, events
from .events import EventKind

__all__ = ["FAILURES", "install"]

FAILURES = frozenset(
    {EventKind.RELEASED, EventKind.UNKNOWN, EventKind.FAILED, EventKind.IN_PROGRESS, EventKind.STORE_ERROR}
)
"""Outcomes whose span status is ERROR."""


def _otel() -> Any:
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError("effectq's tracing needs opentelemetry-api: pip install 'effectq[otel]'") from exc
    return trace


def install(tracer_provider: Any = None) -> Callable[[], None]:
    """Make a span of every step of every effect call; returns a function that stops it.

    A call whose function was already running when this was called gets no execute span.

    Args:
        tracer_provider: an OpenTelemetry ``TracerProvider`` (default: the global one).
    """
    trace = _otel()
    tracer = trace.get_tracer("effectq", __version__, tracer_provider=tracer_provider)
    status = trace.Status
    error = trace.StatusCode.ERROR

    def finish(span: Any, event: events.Event) -> None:
        """The outcome on ``span``, ended when the event's step did."""
        span.set_attribute("effectq.outcome", event.kind.value)
        if event.kind in FAILURES:
            span.set_status(status(error, event.error[:500] or event.kind.value))
            if event.error:
                span.set_attribute("effectq.error", event.error[:500])
        span.end(end_time=event.started_ns + int(event.duration * 1e9))

    def on_event(event: events.Event) -> None:
        if event.step == "execute":  # made current while the function ran: ended by its scope
            return
        span = tracer.start_span(
            f"effectq.{event.step} {event.name}",
            start_time=event.started_ns,
            attributes=_attributes(event.name, event.key, event.run_id, event.namespace, event.attempt),
        )
        finish(span, event)

    untrace = events.trace(_Tracer(trace, tracer, finish))
    unsubscribe = events.subscribe(on_event)

    def uninstall() -> None:
        unsubscribe()
        untrace()

    return uninstall


def _attributes(name: str, key: str, run_id: str, namespace: str, attempt: int) -> dict[str, Any]:
    return {
        "effectq.key": key,
        "effectq.effect": name,
        "effectq.run_id": run_id,
        "effectq.namespace": namespace,
        "effectq.attempt": attempt,
    }


class _Tracer:
    """The spans made while the work is under way (:class:`effectq.events.Tracer`)."""

    def __init__(self, trace: Any, tracer: Any, finish: Callable[[Any, events.Event], None]) -> None:
        from opentelemetry import context

        self._trace, self._tracer, self._finish = trace, tracer, finish
        self._context = context
        self._client = trace.SpanKind.CLIENT
        self._error = trace.StatusCode.ERROR

    def execute(self, name: str, key: str, run_id: str, namespace: str, attempt: int) -> _Execute:
        span = self._tracer.start_span(
            f"effectq.execute {name}", attributes=_attributes(name, key, run_id, namespace, attempt)
        )
        return _Execute(self, span)

    def redis_script(self, script: str, peer: tuple[str, int, int] | None) -> _ScriptSpan | None:
        if not self._trace.get_current_span().get_span_context().is_valid:
            return None  # outside any trace (a heartbeat's renewal): no root span of its own
        attributes: dict[str, Any] = {
            "db.system": "redis",
            "db.operation": "EVALSHA",
            "db.statement": f"EVALSHA {script}",  # never the arguments: they hold results
            "effectq.script": script,
        }
        if peer is not None:
            host, port, db = peer
            attributes["net.peer.name"] = attributes["server.address"] = host
            if port:
                attributes["net.peer.port"] = attributes["server.port"] = port
            attributes["db.redis.database_index"] = db
        span = self._tracer.start_span(f"effectq.redis {script}", kind=self._client, attributes=attributes)
        return _ScriptSpan(span, self._trace.Status, self._error)


class _Execute:
    """``effectq.execute``: current while the function runs, ended with its outcome."""

    __slots__ = ("_span", "_tracer")

    def __init__(self, tracer: _Tracer, span: Any) -> None:
        self._tracer, self._span = tracer, span

    def enter(self) -> Any:
        context = self._tracer._context
        return context.attach(self._tracer._trace.set_span_in_context(self._span))

    def exit(self, token: Any) -> None:
        self._tracer._context.detach(token)

    def end(self, event: events.Event) -> None:
        self._tracer._finish(self._span, event)


class _ScriptSpan:
    __slots__ = ("_error", "_span", "_status")

    def __init__(self, span: Any, status: Any, error: Any) -> None:
        self._span, self._status, self._error = span, status, error

    def end(self, error: BaseException | None) -> None:
        if error is not None:
            self._span.set_status(self._status(self._error, f"{type(error).__name__}: {error}"[:500]))
        self._span.end()
