"""Spans that nest: ``effectq.execute`` is current while the function runs, and the scripts
effectq's own wire sends are spans of their own, read from OpenTelemetry's in-memory exporter
while real effects run on Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import effectq
import effectq.tracing
from effectq import events

_providers: list[TracerProvider] = []


def inner() -> trace.Tracer:
    """The function's own instrumentation (an HTTP client, say), on the test's provider."""
    return _providers[-1].get_tracer("test.inner")


@effectq.effect(name="tr.charge")
def charge(order: str) -> str:
    with inner().start_as_current_span("http POST /charges"):
        if order.startswith("bad"):
            raise ValueError("card declined")
        return f"ch_{order}"


@effectq.effect(name="tr.acharge")
async def acharge(order: str) -> str:
    async def query() -> None:
        with inner().start_as_current_span("db query"):
            await asyncio.sleep(0)

    with inner().start_as_current_span("http POST /charges"):
        await asyncio.create_task(query())  # a task the function starts copies its context
    return f"ch_{order}"


@effectq.effect(name="tr.stream")
def stream(n: int) -> Iterator[str]:
    for i in range(n):
        with inner().start_as_current_span(f"chunk {i}"):
            yield f"part-{i}"


@effectq.effect(name="tr.astream")
async def astream(n: int) -> AsyncIterator[str]:
    for i in range(n):
        with inner().start_as_current_span(f"chunk {i}"):
            await asyncio.sleep(0)
            yield f"part-{i}"


@pytest.fixture
def exporter() -> Iterator[tuple[trace.Tracer, InMemorySpanExporter]]:
    """effectq's tracing on a provider of the test's own, which the function's spans use too."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    uninstall = effectq.tracing.install(provider)
    _providers.append(provider)
    yield provider.get_tracer("test"), exported
    _providers.remove(provider)
    uninstall()
    provider.shutdown()


def _one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def _parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


def _id(span: ReadableSpan | trace.Span) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def test_a_span_the_function_starts_is_a_child_of_execute(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """Sync: the function's span has execute as parent; execute, claim and complete have the
    caller's span, and carry the key, effect name, outcome and attempt."""
    tracer, exported = exporter
    with tracer.start_as_current_span("task") as task, effectq.run("tr-run", store=redis_store):
        assert charge("o-1") == "ch_o-1"
        key = charge.key("o-1")
    spans = exported.get_finished_spans()
    execute = _one(spans, "effectq.execute tr.charge")
    assert _parent_of(_one(spans, "http POST /charges")) == _id(execute)
    for step, outcome in (("claim", "claimed"), ("execute", "executed"), ("complete", "completed")):
        span = _one(spans, f"effectq.{step} tr.charge")
        assert _parent_of(span) == _id(task)
        assert span.attributes is not None
        assert span.attributes["effectq.key"] == key
        assert span.attributes["effectq.effect"] == "tr.charge"
        assert span.attributes["effectq.outcome"] == outcome
        assert span.attributes["effectq.attempt"] == 1
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached


def test_a_released_call_ends_its_execute_span_with_the_outcome(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """The function raised: execute still parents its span, and ends as released (ERROR)."""
    tracer, exported = exporter
    with (
        tracer.start_as_current_span("task"),
        effectq.run("tr-run", store=redis_store),
        pytest.raises(ValueError, match="declined"),
    ):
        charge("bad-1")
    spans = exported.get_finished_spans()
    execute = _one(spans, "effectq.execute tr.charge")
    assert _parent_of(_one(spans, "http POST /charges")) == _id(execute)
    assert execute.attributes is not None
    assert execute.attributes["effectq.outcome"] == "released"
    assert execute.status.status_code is trace.StatusCode.ERROR
    assert "card declined" in (execute.status.description or "")


def _acharge_in_a_task(tracer: trace.Tracer, store: effectq.Store, order: str) -> str:
    """``acharge(order)`` in an event loop, in a run, under a span named ``task``."""

    async def main() -> str:
        with tracer.start_as_current_span("task"):
            async with effectq.run("tr-run", store=store):
                return await acharge(order)

    return asyncio.run(main())


def test_an_async_function_s_spans_and_its_tasks_are_children_of_execute(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """Asyncio: the context carries execute into the coroutine and into a task it starts."""
    tracer, exported = exporter
    assert _acharge_in_a_task(tracer, redis_store, "o-2") == "ch_o-2"
    spans = exported.get_finished_spans()
    execute = _one(spans, "effectq.execute tr.acharge")
    http = _one(spans, "http POST /charges")
    assert _parent_of(http) == _id(execute)
    assert _parent_of(_one(spans, "db query")) == _id(http)
    assert _parent_of(execute) == _id(_one(spans, "task"))
    assert execute.attributes is not None
    assert execute.attributes["effectq.outcome"] == "executed"


def test_a_stream_s_items_are_made_under_execute_and_consumed_outside_it(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """A generator effect: each item's span is a child of execute; what the consumer does between
    items is not (it runs outside the effect)."""
    tracer, exported = exporter
    with tracer.start_as_current_span("task") as task, effectq.run("tr-run", store=redis_store):
        for item in stream(2):
            with tracer.start_as_current_span(f"consume {item}"):
                pass
    spans = exported.get_finished_spans()
    execute = _one(spans, "effectq.execute tr.stream")
    assert [_parent_of(_one(spans, f"chunk {i}")) for i in range(2)] == [_id(execute)] * 2
    assert [_parent_of(_one(spans, f"consume part-{i}")) for i in range(2)] == [_id(task)] * 2


def test_an_async_stream_s_items_are_made_under_execute(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    tracer, exported = exporter

    async def main() -> list[str]:
        with tracer.start_as_current_span("task"):
            async with effectq.run("tr-run", store=redis_store):
                return [item async for item in astream(2)]

    assert asyncio.run(main()) == ["part-0", "part-1"]
    spans = exported.get_finished_spans()
    execute = _one(spans, "effectq.execute tr.astream")
    assert [_parent_of(_one(spans, f"chunk {i}")) for i in range(2)] == [_id(execute)] * 2


def _redis_spans(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        if span.name.startswith("effectq.redis "):
            found.setdefault(span.name.removeprefix("effectq.redis "), []).append(span)
    return found


def test_the_wire_s_scripts_are_client_spans_naming_the_redis(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore, redis_url: str
) -> None:
    """Inside a trace, the claim and the (pipelined) completion effectq's wire sends are spans of
    their own: db.system redis, the script, the peer; under the span they were sent in."""
    tracer, exported = exporter
    with tracer.start_as_current_span("task") as task, effectq.run("tr-run", store=redis_store):
        charge("o-3")
    found = _redis_spans(exported.get_finished_spans())
    assert sorted(found) == ["claim", "complete"]
    url = urlsplit(redis_url)  # the peer is the suite's server, wherever EFFECTQ_TEST_REDIS_URL puts it
    for script, (span,) in found.items():
        assert span.kind is trace.SpanKind.CLIENT
        assert _parent_of(span) == _id(task)
        assert span.attributes is not None
        assert span.attributes["db.system"] == "redis"
        assert span.attributes["db.operation"] == "EVALSHA"
        assert span.attributes["effectq.script"] == script
        assert span.attributes["net.peer.name"] == url.hostname
        assert span.attributes["net.peer.port"] == (url.port or 6379)  # 6379: the scheme's default
        assert span.status.status_code is trace.StatusCode.UNSET
        assert "ch_o-3" not in str(span.attributes)  # never the arguments (they hold results)


def test_the_async_wire_s_scripts_are_spans_too(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    tracer, exported = exporter
    _acharge_in_a_task(tracer, redis_store, "o-4")
    assert sorted(_redis_spans(exported.get_finished_spans())) == ["claim", "complete"]


def test_no_redis_span_outside_a_trace_and_none_without_a_tracer(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """A script sent with no span current (a heartbeat's renewal) makes no root span; with
    tracing off, none at all."""
    _, exported = exporter
    with effectq.run("tr-run", store=redis_store):
        charge("o-5")
    assert _redis_spans(exported.get_finished_spans()) == {}
    assert len(events.tracers()) == 1


def test_a_failed_script_is_an_error_span(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_url: str, namespace: str
) -> None:
    """A script whose round trip fails: its span ends as ERROR, naming the exception."""
    tracer, exported = exporter
    store = effectq.RedisStore(redis.Redis.from_url(redis_url), namespace=namespace)
    store.client.connection_pool.connection_kwargs["port"] = 1  # nothing listens there
    store.client.connection_pool.disconnect()
    with tracer.start_as_current_span("task"), pytest.raises(effectq.StoreError):
        store.get("no-such-key")
    (span,) = _redis_spans(exported.get_finished_spans())["read"]
    assert span.status.status_code is trace.StatusCode.ERROR
    assert "ConnectionError" in (span.status.description or "")
    store.close()


class _Broken:
    """A tracer whose every hook raises."""

    def execute(self, name: str, key: str, run_id: str, namespace: str, attempt: int) -> events.Scope:
        raise RuntimeError("tracer down")

    def redis_script(self, script: str, peer: tuple[str, int, int] | None) -> events.ScriptSpan | None:
        raise RuntimeError("tracer down")


class _BrokenScope:
    def enter(self) -> object:
        raise RuntimeError("scope down")

    def exit(self, token: object) -> None:
        raise AssertionError("never entered: never exited")

    def end(self, event: events.Event) -> None:
        raise RuntimeError("scope down")


class _BrokenScopes(_Broken):
    def execute(self, name: str, key: str, run_id: str, namespace: str, attempt: int) -> events.Scope:
        return _BrokenScope()


@pytest.mark.parametrize("tracer", [_Broken(), _BrokenScopes()], ids=["tracer", "scope"])
def test_a_tracer_that_raises_changes_nothing_the_effect_does(
    tracer: events.Tracer, redis_store: effectq.RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Observability never changes what an effect does: each failure is logged, the call runs
    once and records its result."""
    _providers.append(TracerProvider())
    untrace = events.trace(tracer)
    try:
        with effectq.run("tr-run", store=redis_store):
            assert charge("o-6") == "ch_o-6"
            assert charge("o-6") == "ch_o-6"
            record = redis_store.get(charge.key("o-6"))
    finally:
        untrace()
        _providers.pop()
    assert record is not None and record.status is effectq.Status.COMPLETED
    assert "down" in caplog.text


class Declined(Exception):
    """A terminal error of the charge below."""


@effectq.effect(name="tr.terminal", terminal=(Declined,))
def declined(order: str) -> str:
    raise Declined(f"card declined for {order}")


def test_a_terminal_failure_and_its_replay_are_error_spans(
    exporter: tuple[trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """The function raised a terminal exception, and a later call raised it again from the record:
    both spans say failed, as ERROR, with the recorded message."""
    tracer, exported = exporter
    for _ in range(2):
        with (
            tracer.start_as_current_span("task"),
            effectq.run("tr-terminal", store=redis_store),
            pytest.raises(Declined),
        ):
            declined("o-1")
    failed = [
        span
        for span in exported.get_finished_spans()
        if span.attributes is not None and span.attributes.get("effectq.outcome") == "failed"
    ]
    names = sorted(span.name for span in failed)
    assert names == ["effectq.claim tr.terminal", "effectq.execute tr.terminal"]
    for span in failed:
        assert span.status.status_code is trace.StatusCode.ERROR
        assert "card declined for o-1" in (span.status.description or "")


def test_every_event_kind_names_the_step_it_reports_from() -> None:
    """An event of a kind without a step would raise inside the engine whenever a listener is on."""
    assert set(events.STEPS) == set(events.EventKind)
