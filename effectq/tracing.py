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

The spans are made when each step has finished, from the event's start time
and duration, so the function's own spans (an HTTP call it makes) are siblings
of ``effectq.execute``, not its children.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import __version__, events
from .events import EventKind

__all__ = ["FAILURES", "install"]

FAILURES = frozenset({EventKind.RELEASED, EventKind.UNKNOWN, EventKind.IN_PROGRESS, EventKind.STORE_ERROR})
"""Outcomes whose span status is ERROR."""


def _otel() -> Any:
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError("effectq's tracing needs opentelemetry-api: pip install 'effectq[otel]'") from exc
    return trace


def install(tracer_provider: Any = None) -> Callable[[], None]:
    """Make a span of every step of every effect call; returns a function that stops it.

    Args:
        tracer_provider: an OpenTelemetry ``TracerProvider`` (default: the global one).
    """
    trace = _otel()
    tracer = trace.get_tracer("effectq", __version__, tracer_provider=tracer_provider)
    status = trace.Status
    error = trace.StatusCode.ERROR

    def on_event(event: events.Event) -> None:
        start = event.started_ns
        span = tracer.start_span(
            f"effectq.{event.step} {event.name}",
            start_time=start,
            attributes={
                "effectq.key": event.key,
                "effectq.effect": event.name,
                "effectq.run_id": event.run_id,
                "effectq.namespace": event.namespace,
                "effectq.attempt": event.attempt,
                "effectq.outcome": event.kind.value,
            },
        )
        if event.kind in FAILURES:
            span.set_status(status(error, event.error[:500] or event.kind.value))
            if event.error:
                span.set_attribute("effectq.error", event.error[:500])
        span.end(end_time=start + int(event.duration * 1e9))

    return events.subscribe(on_event)
