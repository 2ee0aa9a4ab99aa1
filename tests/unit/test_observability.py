"""Metrics, spans and logs, read from their real collectors while real effects run on Redis."""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Iterator

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import effectq
import effectq.metrics
import effectq.tracing
from effectq.store import Claim, ClaimRequest
from effectq.testing import seed_records

SECRET_RESULT = "result-body-7f3a9c"
SECRET_ARG = "argument-9d2e41"


@effectq.effect(name="obs.charge")
def charge(order: str, card: str) -> str:
    if order.startswith("bad"):
        raise ValueError("card declined")
    if order.startswith("slow"):
        raise TimeoutError("gateway read timed out")
    return SECRET_RESULT


def _outcomes(store: effectq.Store) -> None:
    """One of each: executed+completed, replayed, released, unknown, then unknown met at the claim."""
    with effectq.run("obs-run", store=store):
        charge("ok-1", SECRET_ARG)
        charge("ok-1", SECRET_ARG)
        with pytest.raises(ValueError, match="declined"):
            charge("bad-1", SECRET_ARG)
        with pytest.raises(TimeoutError):
            charge("slow-1", SECRET_ARG)
        with pytest.raises(effectq.OutcomeUnknown):
            charge("slow-1", SECRET_ARG)


# -- Prometheus -----------------------------------------------------------------------------


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_counters_and_histogram(
    registry: CollectorRegistry, redis_store: effectq.RedisStore, namespace: str
) -> None:
    """Each event kind is counted per effect; each step's duration lands in the histogram."""
    metrics = effectq.metrics.install(registry)
    try:
        _outcomes(redis_store)
    finally:
        metrics.stop()

    def count(kind: str) -> float | None:
        return registry.get_sample_value(
            "effectq_events_total", {"kind": kind, "effect": "obs.charge", "namespace": namespace}
        )

    assert count("claimed") == 3
    assert count("executed") == 1
    assert count("completed") == 1
    assert count("replayed") == 1
    assert count("released") == 1
    assert count("unknown") == 2
    steps = {
        step: registry.get_sample_value(
            "effectq_step_duration_seconds_count", {"step": step, "effect": "obs.charge"}
        )
        for step in ("claim", "execute", "complete")
    }
    assert steps == {"claim": 5, "execute": 3, "complete": 1}
    total = registry.get_sample_value(
        "effectq_step_duration_seconds_sum", {"step": "execute", "effect": "obs.charge"}
    )
    assert total is not None
    assert total >= 0


def test_uninstall_stops_counting(registry: CollectorRegistry, redis_store: effectq.RedisStore) -> None:
    """After uninstall nothing is counted and the metrics leave the registry (install works again)."""
    effectq.metrics.install(registry).uninstall()
    with effectq.run("obs-run", store=redis_store):
        charge("ok-2", SECRET_ARG)
    assert (
        registry.get_sample_value(
            "effectq_events_total",
            {"kind": "claimed", "effect": "obs.charge", "namespace": redis_store.namespace},
        )
        is None
    )
    effectq.metrics.install(registry).uninstall()


def test_installing_twice_in_one_registry_is_refused(registry: CollectorRegistry) -> None:
    """A second install into the same registry says so instead of double counting."""
    metrics = effectq.metrics.install(registry)
    try:
        with pytest.raises(effectq.ConfigurationError, match="already installed"):
            effectq.metrics.install(registry)
    finally:
        metrics.uninstall()


def test_unknown_gauges_from_the_store(registry: CollectorRegistry, redis_store: effectq.RedisStore) -> None:
    """The gauges count what the indexes hold and age the oldest doubt, at scrape time."""
    seeded = seed_records(redis_store)
    metrics = effectq.metrics.install(registry, stores=[redis_store], min_interval=0)
    try:
        labels = {"namespace": redis_store.namespace}
        assert registry.get_sample_value("effectq_unknown_records", labels) == 2
        assert registry.get_sample_value("effectq_in_flight_records", labels) == 2
        assert registry.get_sample_value("effectq_store_up", labels) == 1
        age = registry.get_sample_value("effectq_oldest_unknown_age_seconds", labels)
        assert age is not None
        assert age > 0
        for key in (seeded.unknown, seeded.dead_holder):
            redis_store.resolve(key, applied=False, retention_ms=60_000)
        assert registry.get_sample_value("effectq_unknown_records", labels) == 0
        assert registry.get_sample_value("effectq_oldest_unknown_age_seconds", labels) == 0
    finally:
        metrics.uninstall()


def test_a_store_that_does_not_answer_is_down_not_a_failed_scrape(registry: CollectorRegistry) -> None:
    """An unreachable store reports effectq_store_up 0; the scrape itself still succeeds."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = effectq.RedisStore.from_url(
        f"redis://127.0.0.1:{port}/0", namespace="gone", socket_connect_timeout=1
    )
    metrics = effectq.metrics.install(registry, stores=[dead], min_interval=0)
    try:
        assert registry.get_sample_value("effectq_store_up", {"namespace": "gone"}) == 0
        assert registry.get_sample_value("effectq_unknown_records", {"namespace": "gone"}) is None
    finally:
        metrics.uninstall()
        dead.client.close()


def test_missing_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prometheus_client / opentelemetry, install names the extra to add."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"effectq\[prometheus\]"):
        effectq.metrics.install()
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"effectq\[otel\]"):
        effectq.tracing.install()


# -- OpenTelemetry ----------------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    uninstall = effectq.tracing.install(provider)
    yield provider, exporter
    uninstall()
    provider.shutdown()


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        found.setdefault(span.name, []).append(span)
    return found


def test_spans_for_claim_execute_complete_under_the_callers_span(
    spans: tuple[TracerProvider, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """A first call makes claim, execute and complete spans, children of the caller's span, with the key."""
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("task") as parent, effectq.run("obs-run", store=redis_store):
        charge("ok-3", SECRET_ARG)
        key = charge.key("ok-3", SECRET_ARG)
    found = _by_name(exporter.get_finished_spans())
    claim, execute, complete = (
        found[f"effectq.{step} obs.charge"][0] for step in ("claim", "execute", "complete")
    )
    for span in (claim, execute, complete):
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.attributes is not None
        assert span.attributes["effectq.key"] == key
        assert span.attributes["effectq.run_id"] == "obs-run"
        assert span.attributes["effectq.namespace"] == redis_store.namespace
        assert span.status.status_code is trace.StatusCode.UNSET
        assert span.start_time is not None
        assert span.end_time is not None
        assert span.start_time <= span.end_time
    assert claim.start_time <= execute.start_time <= complete.start_time  # type: ignore[operator]
    assert execute.attributes["effectq.attempt"] == 1  # type: ignore[index]
    assert claim.attributes["effectq.outcome"] == "claimed"  # type: ignore[index]


def test_a_complete_span_is_a_child_of_the_span_its_call_was_made_under(
    spans: tuple[TracerProvider, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """A completion's reply is read with the next call's claim; its span still has the first
    call's span as parent, and ends when its write did, before the next claim began."""
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    with effectq.run("obs-run", store=redis_store):
        with tracer.start_as_current_span("first") as first:
            charge("ok-5", SECRET_ARG)
        with tracer.start_as_current_span("second") as second:
            charge("ok-6", SECRET_ARG)
    found = _by_name(exporter.get_finished_spans())
    claims, completes = found["effectq.claim obs.charge"], found["effectq.complete obs.charge"]
    assert len(claims) == len(completes) == 2
    for parent, claim, complete in zip((first, second), claims, completes, strict=True):
        for span in (claim, complete):
            assert span.parent is not None
            assert span.parent.span_id == parent.get_span_context().span_id
    assert completes[0].end_time <= claims[1].start_time  # type: ignore[operator]


def test_failed_outcomes_are_error_spans_on_the_right_step(
    spans: tuple[TracerProvider, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """Released and unknown at execute, unknown met at the claim, a replay: each on its own step."""
    _, exporter = spans
    _outcomes(redis_store)
    finished = exporter.get_finished_spans()
    execute = [s for s in finished if s.name == "effectq.execute obs.charge"]
    outcomes = sorted(str(s.attributes["effectq.outcome"]) for s in execute)  # type: ignore[index]
    assert outcomes == ["executed", "released", "unknown"]
    for span in execute:
        failed = span.attributes["effectq.outcome"] != "executed"  # type: ignore[index]
        assert (span.status.status_code is trace.StatusCode.ERROR) is failed
    released = next(s for s in execute if s.attributes["effectq.outcome"] == "released")  # type: ignore[index]
    assert "card declined" in (released.status.description or "")
    claims = [s for s in finished if s.name == "effectq.claim obs.charge"]
    claim_outcomes = sorted(str(s.attributes["effectq.outcome"]) for s in claims)  # type: ignore[index]
    assert claim_outcomes == ["claimed", "claimed", "claimed", "replayed", "unknown"]
    met = next(s for s in claims if s.attributes["effectq.outcome"] == "unknown")  # type: ignore[index]
    assert met.status.status_code is trace.StatusCode.ERROR
    assert "TimeoutError" in str(met.attributes["effectq.error"])  # type: ignore[index]
    assert not any(SECRET_RESULT in str(s.attributes) + str(s.status.description) for s in finished)


class _ClaimFailsThrice(effectq.RedisStore):
    """Redis whose first three claims fail (every try the engine makes), then recovers, so the
    engine's background release of the unanswered claim succeeds and nothing keeps retrying."""

    failures = 3

    def claim(self, key: str, request: ClaimRequest) -> Claim:
        if self.failures:
            self.failures -= 1
            raise effectq.StoreError("effectq claim failed on Redis: ConnectionError: simulated")
        return super().claim(key, request)


def charge_key(store: effectq.Store) -> str:
    with effectq.run("obs-run", store=store):
        return charge.key("ok-4", SECRET_ARG)


def test_a_store_error_is_a_span_naming_the_primitive(
    spans: tuple[TracerProvider, InMemorySpanExporter], redis_client: redis.Redis, namespace: str
) -> None:
    """When the store fails, the span says which primitive failed."""
    _, exporter = spans
    store = _ClaimFailsThrice(redis_client, namespace=namespace)
    with effectq.run("obs-run", store=store), pytest.raises(effectq.StoreError):
        charge("ok-4", SECRET_ARG)
    failed = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes is not None and s.attributes["effectq.outcome"] == "store_error"
    ]
    assert len(failed) == 3
    assert {s.name for s in failed} == {"effectq.claim obs.charge"}
    assert all(s.status.status_code is trace.StatusCode.ERROR for s in failed)
    assert all("simulated" in (s.status.description or "") for s in failed)
    key = charge_key(store)
    deadline = time.monotonic() + 60  # the background release of the unanswered claim lands

    def released() -> bool:
        record = store.get(key)
        return record is not None and record.status is effectq.Status.RELEASED

    while not released() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert released()


# -- logging ----------------------------------------------------------------------------------

PER_OPERATION = {
    "effectq.claim",
    "effectq.replay",
    "effectq.wait",
    "effectq.complete",
    "effectq.release",
    "effectq.unknown",
    "effectq.reconcile",
    "effectq.resolve",
    "effectq.purge",
    "effectq.list",
}


def test_logs_come_from_one_logger_per_operation_without_results(
    caplog: pytest.LogCaptureFixture, redis_store: effectq.RedisStore
) -> None:
    """Every log line names its operation's logger, uses %-style arguments, and never holds a result."""
    from effectq import admin

    caplog.set_level(logging.DEBUG, logger="effectq")
    _outcomes(redis_store)
    with effectq.run("obs-run", store=redis_store):
        key = charge.key("slow-1", SECRET_ARG)
    admin.resolve(redis_store, key, applied=True, result=f'"{SECRET_RESULT}"', note="ops")
    admin.purge(redis_store, run_id="obs-run")
    records = [r for r in caplog.records if r.name.startswith("effectq")]
    names = {r.name for r in records}
    assert {
        "effectq.release",
        "effectq.unknown",
        "effectq.replay",
        "effectq.resolve",
        "effectq.purge",
    } <= names
    assert names <= PER_OPERATION, names - PER_OPERATION
    for record in records:
        assert SECRET_RESULT not in record.getMessage(), record.name
        assert SECRET_ARG not in record.getMessage(), record.name
        if record.args:
            assert "%" in str(record.msg), record.msg
