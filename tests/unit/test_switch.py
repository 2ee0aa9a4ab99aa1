"""The switch for tests and local development: effects run as plain functions, with one warning."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

import effectq
from effectq import switch
from effectq.events import EventKind


@pytest.fixture
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a new process: the switch has not warned yet."""
    monkeypatch.setattr(switch, "_warned", False)


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch has warned already in this process (tests of something else)."""
    monkeypatch.setattr(switch, "_warned", True)


def test_disabled_runs_plain_functions_touching_no_store(
    redis_store: effectq.RedisStore, redis_client: redis.Redis, namespace: str, fresh_warning: None
) -> None:
    """Under disabled() every call runs the function, inside a run or not, and Redis sees nothing."""
    calls: list[int] = []

    @effectq.effect(name="switch.send")
    def send(n: int) -> int:
        calls.append(n)
        return n * 2

    with warnings.catch_warnings(record=True) as seen, effectq.disabled():
        warnings.simplefilter("always")
        assert send(1) == 2
        assert send(1) == 2
        with effectq.run("switch-run", store=redis_store):
            assert send(1) == 2
            done = send.call_with_outcome(1)
    given = [w for w in seen if issubclass(w.category, effectq.EffectsDisabledWarning)]
    assert len(given) == 1
    assert "effectq.disabled()" in str(given[0].message)
    assert "switch.send" in str(given[0].message)
    assert given[0].filename == __file__  # it points at the caller
    assert (done.value, done.kind) == (2, EventKind.EXECUTED)
    assert calls == [1, 1, 1, 1]
    assert list(redis_client.scan_iter(match=f"*{namespace}*")) == []
    with pytest.raises(effectq.NoActiveRun):  # the switch is off again after the block
        send(1)


def test_current_effect_works_and_dedupes_nothing(warned: None) -> None:
    """Inside a disabled effect current_effect() answers, with a new key (and idempotency key) per call."""

    @effectq.effect(name="switch.keys")
    def send(n: int) -> str:
        return effectq.current_effect().idempotency_key

    with effectq.disabled():
        first, second = send(1), send(1)
        outcome = send.call_with_outcome(1)
    assert first != second
    assert outcome.key.startswith("disabled:switch.keys:")
    assert outcome.value == outcome.idempotency_key


def test_async_and_streams_run_plain_with_their_context(warned: None) -> None:
    """Async and generator effects run plain too; current_effect() holds for every item."""

    @effectq.effect(name="switch.async")
    async def coro(n: int) -> int:
        return n + len(effectq.current_effect().key) * 0

    @effectq.effect(name="switch.gen")
    def gen(n: int) -> Iterator[str]:
        for _ in range(n):
            yield effectq.current_effect().name

    @effectq.effect(name="switch.agen")
    async def agen(n: int) -> AsyncIterator[str]:
        for _ in range(n):
            yield effectq.current_effect().name

    async def main() -> tuple[int, list[str], effectq.Outcome[int]]:
        return await coro(1), [item async for item in agen(2)], await coro.acall_with_outcome(3)

    with effectq.disabled():
        assert list(gen(2)) == ["switch.gen", "switch.gen"]
        streamed = gen.stream_with_outcome(1)
        assert list(streamed.items) == ["switch.gen"]
        value, items, outcome = asyncio.run(main())
    assert (value, items, outcome.value) == (1, ["switch.agen", "switch.agen"], 3)
    assert (streamed.outcome.value, streamed.outcome.kind) == ("switch.gen", EventKind.EXECUTED)


def test_bad_input_raises_as_it_would_in_a_run(warned: None) -> None:
    """Arguments that do not bind and input no key can be made of raise the same errors, before
    the function runs."""
    calls: list[object] = []

    @effectq.effect(name="switch.bad")
    def send(thing: object) -> None:
        calls.append(thing)

    with effectq.disabled():
        with pytest.raises(effectq.InvalidInputError):
            send(object())
        with pytest.raises(TypeError):
            send(1, 2)  # type: ignore[call-arg]
    assert calls == []


def _child(code: str, value: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EFFECTQ_DISABLED": value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


CHILD = """
import warnings, effectq
warnings.simplefilter("always")

@effectq.effect(name="switch.env")
def send(n: int) -> int:
    return n

print(send(1), send(2), effectq.switch.is_disabled())
"""


def test_the_environment_variable_switches_effects_off_with_one_warning() -> None:
    """EFFECTQ_DISABLED=1: effects run without a run; one warning names the variable; a value that
    is neither on nor off is refused."""
    ran = _child(CHILD, "1")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["1", "2", "True"]
    assert ran.stderr.count("EffectsDisabledWarning") == 1
    assert "EFFECTQ_DISABLED=1" in ran.stderr
    refused = _child(CHILD, "maybe")
    assert refused.returncode != 0
    assert "EFFECTQ_DISABLED='maybe' is neither on" in refused.stderr


def test_a_process_that_turns_the_warning_into_an_error_refuses_the_switch(fresh_warning: None) -> None:
    """The warning made an error (as a production entry point may): every call under the switch
    raises before its function runs."""
    calls: list[int] = []

    @effectq.effect(name="switch.refused")
    def send(n: int) -> None:
        calls.append(n)

    with warnings.catch_warnings():
        warnings.simplefilter("error", effectq.EffectsDisabledWarning)
        with effectq.disabled():
            for n in (1, 2):
                with pytest.raises(effectq.EffectsDisabledWarning):
                    send(n)
    assert calls == []
