"""``via_execute_command=True``: every script through redis-py's ``Redis.execute_command``, the
method APM's Redis instrumentation wraps, so it sees them; effectq's own wire (the default)
bypasses it. Instrumentation is stood for by a wrapper of that method, as theirs is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import effectq
import effectq.tracing

Seen = list[tuple[str, int]]
"""(command, the span current when it was sent) for each command through execute_command."""


@pytest.fixture
def instrumented(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Seen, trace.Tracer, InMemorySpanExporter]]:
    """``Redis.execute_command`` wrapped as APM instrumentation wraps it, and effectq's tracing on."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    seen: Seen = []
    original = redis.Redis.execute_command

    def execute_command(self: redis.Redis, *args: Any, **options: Any) -> Any:
        seen.append((str(args[0]), trace.get_current_span().get_span_context().span_id))
        return original(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", execute_command)
    uninstall = effectq.tracing.install(provider)
    yield seen, provider.get_tracer("test"), exported
    uninstall()
    provider.shutdown()


def _effect(calls: list[str]) -> effectq.Effect[[str], str]:
    @effectq.effect(name="apm.charge")
    def charge(order: str) -> str:
        calls.append(order)
        return f"ch_{order}"

    return charge


def _evalshas(seen: Seen) -> list[int]:
    return [span for command, span in seen if command == "EVALSHA"]


def test_each_script_goes_through_execute_command_under_the_callers_span(
    instrumented: tuple[Seen, trace.Tracer, InMemorySpanExporter], commands_store: effectq.RedisStore
) -> None:
    """A first call's claim and completion, and a replay's claim: each an EVALSHA the wrapper sees,
    under the caller's span; effectq makes no Redis span of its own (no duplicates)."""
    seen, tracer, exported = instrumented
    calls: list[str] = []
    charge = _effect(calls)
    with tracer.start_as_current_span("task") as task, effectq.run("apm-run", store=commands_store):
        assert charge("o-1") == "ch_o-1"
        assert charge("o-1") == "ch_o-1"
    assert calls == ["o-1"]
    task_id = task.get_span_context().span_id
    assert _evalshas(seen) == [task_id] * 3  # claim, complete, claim (the replay)
    assert not [s for s in exported.get_finished_spans() if s.name.startswith("effectq.redis")]


def test_the_default_wire_is_invisible_there_and_makes_spans_of_its_own(
    instrumented: tuple[Seen, trace.Tracer, InMemorySpanExporter], redis_store: effectq.RedisStore
) -> None:
    """Why the option exists: on effectq's wire the wrapper sees no script at all."""
    seen, tracer, exported = instrumented
    with tracer.start_as_current_span("task"), effectq.run("apm-run", store=redis_store):
        _effect([])("o-2")
    assert _evalshas(seen) == []
    names = sorted(s.name for s in exported.get_finished_spans() if s.name.startswith("effectq.redis"))
    assert names == ["effectq.redis claim", "effectq.redis complete"]


def test_an_async_effect_s_scripts_go_through_execute_command(
    instrumented: tuple[Seen, trace.Tracer, InMemorySpanExporter], commands_store: effectq.RedisStore
) -> None:
    """From an event loop the scripts hop to a thread (the wrapper still sees them, under the
    caller's span: the thread gets the task's context)."""
    seen, tracer, _ = instrumented
    calls: list[str] = []

    @effectq.effect(name="apm.acharge")
    async def acharge(order: str) -> str:
        calls.append(order)
        return f"ch_{order}"

    async def main() -> int:
        with tracer.start_as_current_span("task") as task:
            async with effectq.run("apm-run", store=commands_store):
                assert await acharge("o-3") == "ch_o-3"
                assert await acharge("o-3") == "ch_o-3"
            return task.get_span_context().span_id

    task_id = asyncio.run(main())
    assert calls == ["o-3"]
    assert _evalshas(seen) == [task_id] * 3


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_value_that_is_not_a_bool_is_refused(redis_client: redis.Redis, value: object) -> None:
    with pytest.raises(effectq.ConfigurationError, match="via_execute_command"):
        effectq.RedisStore(redis_client, via_execute_command=value)  # type: ignore[arg-type]


def test_from_url_takes_the_option(
    instrumented: tuple[Seen, trace.Tracer, InMemorySpanExporter], redis_url: str, namespace: str
) -> None:
    seen, _, _ = instrumented
    store = effectq.RedisStore.from_url(redis_url, namespace=namespace, via_execute_command=True)
    try:
        assert store.get("no-such-key") is None
    finally:
        store.close()
        store.client.close()
    assert [command for command, _ in seen] == ["EVALSHA"]


def _failing(store: effectq.RedisStore) -> Callable[[], None]:
    """The store's client pointed at a port nothing listens on; returns what points it back."""
    pool = store.client.connection_pool
    port = pool.connection_kwargs["port"]

    def restore() -> None:
        pool.connection_kwargs["port"] = port
        pool.reset()  # its connections were made for the other port

    pool.connection_kwargs["port"] = 1
    pool.reset()
    return restore


def test_a_redis_that_does_not_answer_is_a_store_error_before_the_function_runs(
    commands_store: effectq.RedisStore,
) -> None:
    """The failure comes as on the wire: a StoreError naming the script; the function never runs.
    (redis-py does not say whether a failed command was written: the claim counts as maybe sent,
    and the heartbeat takes it back once Redis answers, as for a cluster client.)"""
    calls: list[str] = []
    charge = _effect(calls)
    restore = _failing(commands_store)
    try:
        with effectq.run("apm-run", store=commands_store), pytest.raises(effectq.StoreError, match="claim"):
            charge("o-4")
    finally:
        restore()
    assert calls == []
