"""Prometheus metrics from effectq's events (``pip install 'effectq[prometheus]'``).

    import effectq.metrics
    from prometheus_client import start_http_server

    effectq.metrics.install(stores=[store])   # once per process, before effects run
    start_http_server(9108)

What is exported:

- ``effectq_events_total{kind, effect, namespace}``: every event (claimed,
  replayed, executed, completed, released, unknown, failed, reconciled, waited,
  in_progress, store_error) per effect name.
- ``effectq_step_duration_seconds{step, effect}``: a histogram of how long each
  step took: ``claim`` and ``complete`` are store round trips, ``execute`` is
  the function, ``wait`` a wait for the same effect elsewhere.
- for each store passed in ``stores``, read from its indexes at scrape time
  (cached ``min_interval`` seconds): ``effectq_unknown_records{namespace}``,
  ``effectq_oldest_unknown_age_seconds{namespace}`` (0 when nothing is in
  doubt), ``effectq_in_flight_records{namespace}`` and ``effectq_store_up{namespace}``.

Alert on ``effectq_oldest_unknown_age_seconds > 900`` (someone must settle an
effect) and on ``rate(effectq_events_total{kind="store_error"}[5m]) > 0``;
docs/operations.md has the rules.

Workers that fork (Celery's prefork pool, gunicorn) use prometheus_client's
multiprocess mode: every process counts into ``PROMETHEUS_MULTIPROC_DIR``, and the
one process that serves ``/metrics`` serves :func:`multiprocess_registry`, which
reads those files and the stores' gauges (docs/metrics.md)::

    effectq.metrics.install()                 # in every process (or once before forking)
    start_http_server(9108, registry=effectq.metrics.multiprocess_registry(stores=[store]))
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from . import events
from .errors import ConfigurationError
from .store.operators import OperatorStore, Summary

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = ["DURATION_BUCKETS", "Metrics", "install", "multiprocess_registry"]

log = logging.getLogger("effectq.metrics")

DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
"""Seconds: from a sub-millisecond claim to a five-minute function."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(
            "effectq's Prometheus metrics need prometheus_client: pip install 'effectq[prometheus]'"
        ) from exc
    return prometheus_client


class Metrics:
    """The installed metrics, subscribed to events; :meth:`uninstall` stops and unregisters them."""

    def __init__(
        self, registry: CollectorRegistry, counter: Any, histogram: Any, gauges: _IndexCollector | None
    ) -> None:
        self.registry = registry
        self.events = counter
        self.durations = histogram
        self.index = gauges
        self._unsubscribe = events.subscribe(self.on_event)

    def on_event(self, event: events.Event) -> None:
        """The listener: count the event and time its step."""
        self.events.labels(event.kind.value, event.name, event.namespace).inc()
        self.durations.labels(event.step, event.name).observe(event.duration)

    def stop(self) -> None:
        """Stop counting; what was counted stays in the registry."""
        self._unsubscribe()

    def uninstall(self) -> None:
        """Stop counting and unregister every metric."""
        self._unsubscribe()
        for collector in (self.events, self.durations, self.index):
            if collector is not None:
                self.registry.unregister(collector)


def install(
    registry: CollectorRegistry | None = None,
    *,
    stores: Iterable[OperatorStore] = (),
    min_interval: float = 5.0,
    buckets: Sequence[float] = DURATION_BUCKETS,
) -> Metrics:
    """Count every event and export the gauges of ``stores``.

    Args:
        registry: where to register (default: prometheus_client's global registry).
        stores: stores whose unknown and in-flight records are exported as gauges.
        min_interval: read each store's indexes at most this often (seconds), however
            often Prometheus scrapes.
        buckets: the duration histogram's buckets, in seconds.

    Raises:
        ConfigurationError: effectq's metrics are already installed in ``registry``.
    """
    prometheus = _prometheus()
    registry = registry if registry is not None else prometheus.REGISTRY
    try:
        counter = prometheus.Counter(
            "effectq_events",
            "effectq events by kind and effect.",
            ["kind", "effect", "namespace"],
            registry=registry,
        )
    except ValueError as exc:
        raise ConfigurationError(f"effectq's metrics are already installed in this registry ({exc})") from exc
    histogram = prometheus.Histogram(
        "effectq_step_duration_seconds",
        "How long each step of an effect call took.",
        ["step", "effect"],
        buckets=tuple(buckets),
        registry=registry,
    )
    watched = list(stores)
    if watched and _multiprocess_dir() is not None:
        log.warning(
            "effectq metrics: PROMETHEUS_MULTIPROC_DIR is set, so this process's registry is not what "
            "/metrics serves; pass stores= to effectq.metrics.multiprocess_registry() in the process "
            "that serves it, where one collector reads the gauges for all workers"
        )
    gauges = _IndexCollector(watched, min_interval) if watched else None
    if gauges is not None:
        registry.register(gauges)
    return Metrics(registry, counter, histogram, gauges)


def _multiprocess_dir() -> str | None:
    # the lowercase name is prometheus_client's older spelling, still read by it
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")  # noqa: SIM112


def multiprocess_registry(
    *,
    stores: Iterable[OperatorStore] = (),
    min_interval: float = 5.0,
    path: str | None = None,
) -> CollectorRegistry:
    """The registry to serve ``/metrics`` from when workers fork: all processes' counts, one set of gauges.

    Every process that runs effects calls :func:`install` (its counters and
    histograms then write to files in ``PROMETHEUS_MULTIPROC_DIR``, prometheus_client's
    multiprocess mode, which must be set before prometheus_client is first imported).
    The serving process (Celery's main process, gunicorn's arbiter, or a process of
    its own) serves this registry: prometheus_client's ``MultiProcessCollector``
    sums the files, and the stores' gauges, which come from Redis and not from any
    one worker, are read here once per scrape (at most every ``min_interval`` seconds).

    Args:
        stores: stores whose unknown and in-flight records are exported as gauges.
        min_interval: read each store's indexes at most this often (seconds).
        path: the multiprocess directory (default: ``$PROMETHEUS_MULTIPROC_DIR``).

    Raises:
        ConfigurationError: no multiprocess directory is set, or it is not a directory.
    """
    prometheus = _prometheus()
    from prometheus_client import multiprocess

    registry: CollectorRegistry = prometheus.CollectorRegistry()
    try:
        multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ConfigurationError(
            f"Prometheus multiprocess mode needs a directory ({exc}): set PROMETHEUS_MULTIPROC_DIR to an "
            f"empty directory before any process imports prometheus_client (docs/metrics.md)"
        ) from exc
    watched = list(stores)
    if watched:
        registry.register(_IndexCollector(watched, min_interval))
    return registry


class _IndexCollector:
    """Gauges read from the stores' indexes when Prometheus scrapes (cached ``min_interval``)."""

    def __init__(self, stores: list[OperatorStore], min_interval: float) -> None:
        self._stores = stores
        self._min_interval = min_interval
        self._lock = threading.Lock()
        self._cache: dict[int, tuple[float, Summary | None, datetime]] = {}

    def _read(self, store: OperatorStore) -> tuple[Summary | None, datetime]:
        with self._lock:
            cached = self._cache.get(id(store))
            if cached is not None and time.monotonic() - cached[0] < self._min_interval:
                return cached[1], cached[2]
            try:
                summary: Summary | None = store.summary()
                now = store.clock()
            except Exception as exc:
                log.warning("effectq metrics could not read namespace %s: %s", store.namespace, exc)
                summary, now = None, datetime.now(UTC)
            self._cache[id(store)] = (time.monotonic(), summary, now)
            return summary, now

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        unknown, oldest, flight, up = families = self._families()
        for store in self._stores:
            summary, now = self._read(store)
            ns = [store.namespace]
            up.add_metric(ns, 0.0 if summary is None else 1.0)
            if summary is None:
                continue
            unknown.add_metric(ns, summary.in_doubt)
            flight.add_metric(ns, summary.in_flight)
            age = 0.0
            if summary.oldest_in_doubt is not None:
                age = max(0.0, (now - summary.oldest_in_doubt).total_seconds())
            oldest.add_metric(ns, age)
        yield from families

    @staticmethod
    def _families() -> tuple[Any, Any, Any, Any]:
        from prometheus_client.core import GaugeMetricFamily as Gauge

        return (
            Gauge(
                "effectq_unknown_records",
                "Records in doubt (unknown, or dispatched by a dead holder).",
                labels=["namespace"],
            ),
            Gauge(
                "effectq_oldest_unknown_age_seconds",
                "How long the oldest record has been in doubt (0: none).",
                labels=["namespace"],
            ),
            Gauge("effectq_in_flight_records", "Records held by a live lease.", labels=["namespace"]),
            Gauge(
                "effectq_store_up",
                "Whether the store's indexes could be read at the last scrape.",
                labels=["namespace"],
            ),
        )
