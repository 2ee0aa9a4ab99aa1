"""The step journal: the Nth call of a step in a run replays the Nth journaled result."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from typing import Any

import pytest

import effectq


@dataclasses.dataclass(frozen=True)
class Reply:
    text: str
    tokens: int


class Model:
    """A scripted model that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def reply(self, prompt: str) -> Reply:
        self.calls.append(prompt)
        return Reply(text=f"{prompt}!{random.random()}", tokens=len(self.calls))


def test_nth_call_replays_the_nth_result(store: effectq.Store) -> None:
    """A second attempt of a run gets every journaled result back, by ordinal, without calling."""
    model = Model()
    llm = effectq.step(name="llm")(model.reply)
    first, second = [], []
    for seen in (first, second):
        with effectq.run("run-1", store=store):
            seen.append(llm("plan"))
            seen.append(llm("plan"))  # the same input again is another step: ordinal 1
            seen.append(llm("act"))
    assert model.calls == ["plan", "plan", "act"]
    assert second == first
    assert first[0] != first[1]
    assert all(type(reply) is Reply for reply in second)  # replayed as the annotated type


def test_a_new_run_calls_again(store: effectq.Store) -> None:
    """The journal is per run: another run id runs its steps."""
    model = Model()
    llm = effectq.step(name="llm")(model.reply)
    for run_id in ("run-a", "run-b"):
        with effectq.run(run_id, store=store):
            llm("plan")
    assert model.calls == ["plan", "plan"]


def test_a_step_that_raised_runs_again(store: effectq.Store) -> None:
    """A failed step journals nothing: the next attempt calls it again, even on a timeout."""
    outcomes: list[Any] = [TimeoutError("model timed out"), "ok"]

    @effectq.step(name="flaky")
    def flaky() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return str(outcome)

    with effectq.run("run-1", store=store), pytest.raises(TimeoutError):
        flaky()
    with effectq.run("run-1", store=store):
        assert flaky() == "ok"
    with effectq.run("run-1", store=store):
        assert flaky() == "ok"
    assert outcomes == []


def test_divergence_warns_and_replays_by_default(
    store: effectq.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A replayed step with another input logs the step and ordinal and returns the journaled value."""
    model = Model()
    llm = effectq.step(name="llm")(model.reply)
    with effectq.run("run-1", store=store):
        journaled = llm("refund order 42")
    with caplog.at_level(logging.WARNING, logger="effectq.replay"), effectq.run("run-1", store=store):
        assert llm("refund order 43") == journaled
    assert model.calls == ["refund order 42"]
    assert "run-1:llm:#0" in caplog.text
    assert "different input" in caplog.text


def test_strict_divergence_raises_naming_step_and_ordinal(store: effectq.Store) -> None:
    """With on_mismatch="raise" a diverged replay raises StepDivergedError and runs nothing."""
    model = Model()
    llm = effectq.step(name="llm", on_mismatch="raise")(model.reply)
    with effectq.run("order:7", store=store):
        llm("look up order")
        llm("refund order 42")
    with effectq.run("order:7", store=store):
        llm("look up order")
        with pytest.raises(effectq.StepDivergedError) as caught:
            llm("refund order 43")
    error = caught.value
    assert (error.name, error.ordinal, error.run_id) == ("llm", 1, "order:7")
    assert isinstance(error, effectq.InputMismatchError)
    assert "step llm #1 of run 'order:7' diverged" in str(error)
    assert model.calls == ["look up order", "refund order 42"]


def test_an_effect_mismatch_inside_a_step_is_not_the_steps(store: effectq.Store) -> None:
    """An InputMismatchError of an effect the step calls passes through as it is."""

    @effectq.effect(name="mail", key=lambda args, ctx: f"{ctx.run_id}:mail", on_mismatch="raise")
    def mail(body: str) -> None:
        return None

    @effectq.step(name="compose")
    def compose(body: str) -> None:
        mail(body)

    with effectq.run("run-1", store=store):
        compose("hello")
    with effectq.run("run-2", store=store):
        mail("hello")
        with pytest.raises(effectq.InputMismatchError) as caught:
            compose("bye")  # a new step (run-2 has none), whose effect finds run-2:mail recorded
    assert type(caught.value) is effectq.InputMismatchError
    assert caught.value.name == "mail"


def test_explicit_call_form(store: effectq.Store) -> None:
    """step(name, fn, *args, **kwargs) journals a call of any function, builtins included."""
    values = []
    for _ in range(2):
        with effectq.run("run-1", store=store):
            values.append(
                (
                    effectq.step("clock", time.time),
                    effectq.step("jitter", random.uniform, 0.5, b=1.5),
                    effectq.step("pick", random.choice, ["a", "b", "c", "d"]),
                )
            )
    assert values[0] == values[1]
    assert 0.5 <= values[0][1] <= 1.5


def test_async_steps_take_ordinals_in_call_order(store: effectq.Store) -> None:
    """Steps gathered in one turn get the ordinals of the order they were called in."""
    calls: list[int] = []

    @effectq.step(name="think")
    async def think(n: int) -> int:
        calls.append(n)
        await asyncio.sleep(0.01 * (3 - n))  # finish in reverse order
        return n * 10

    async def attempt() -> list[int]:
        async with effectq.run("run-1", store=store):
            return list(await asyncio.gather(think(1), think(2), think(3)))

    assert asyncio.run(attempt()) == [10, 20, 30]
    assert asyncio.run(attempt()) == [10, 20, 30]
    assert sorted(calls) == [1, 2, 3]
    assert store.get("run-1:think:#2") is not None


def test_async_strict_divergence(store: effectq.Store) -> None:
    """An async step raises StepDivergedError like a sync one."""

    @effectq.step(name="think", on_mismatch="raise")
    async def think(prompt: str) -> str:
        return prompt

    async def attempt(prompt: str) -> str:
        async with effectq.run("run-1", store=store):
            return await think(prompt)

    asyncio.run(attempt("a"))
    with pytest.raises(effectq.StepDivergedError) as caught:
        asyncio.run(attempt("b"))
    assert caught.value.ordinal == 0


def test_explicit_call_form_of_an_async_function(store: effectq.Store) -> None:
    """step(name, async_fn, ...) returns an awaitable of the journaled result."""
    calls: list[str] = []

    async def fetch(url: str) -> str:
        calls.append(url)
        return f"<html>{random.random()}</html>"

    async def attempt() -> str:
        async with effectq.run("run-1", store=store):
            return await effectq.step("fetch", fetch, "https://example.com")

    assert asyncio.run(attempt()) == asyncio.run(attempt())
    assert calls == ["https://example.com"]


def test_effect_keyed_by_model_step(store: effectq.Store) -> None:
    """ctx.run.calls(step) keys an effect by the agent step it belongs to (one comment per step)."""
    posted: list[str] = []
    plans = iter(["first draft", "second draft", "first draft, redone"])

    @effectq.effect(name="comment", key=lambda args, ctx: f"{ctx.run_id}:comment:{ctx.run.calls('llm')}")
    def comment(body: str) -> str:
        posted.append(body)
        return f"posted {body}"

    @effectq.step(name="llm")
    def llm() -> str:
        return next(plans)

    with effectq.run("run-1", store=store):
        comment(llm())
        comment(llm())
    with effectq.run("run-1", store=store):
        comment(llm())  # replayed step, replayed comment
    assert posted == ["first draft", "second draft"]


def test_step_needs_a_run(store: effectq.Store) -> None:
    """Outside a run a step raises NoActiveRun and does not run."""
    model = Model()
    llm = effectq.step(model.reply)
    with pytest.raises(effectq.NoActiveRun):
        llm("plan")
    assert model.calls == []


def test_misuse_is_refused_early() -> None:
    """Generators, non-functions and a name without a function are configuration errors."""

    def stream() -> Any:
        yield 1

    with pytest.raises(effectq.ConfigurationError, match="generator"):
        effectq.step(stream)
    with pytest.raises(effectq.ConfigurationError):
        effectq.step("name-only")  # type: ignore[call-overload]
    with pytest.raises(effectq.ConfigurationError):
        effectq.step(name="x")(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        effectq.step(nmae="x")  # type: ignore[call-overload]


class Agent:
    def __init__(self) -> None:
        self.calls = 0

    @effectq.step(name="agent.plan")
    def plan(self, goal: str) -> str:
        self.calls += 1
        return f"plan for {goal}"


def test_step_on_a_method(store: effectq.Store) -> None:
    """A method step leaves self out of the compared input."""
    for agent in (Agent(), Agent()):
        with effectq.run("run-1", store=store):
            assert agent.plan("ship") == "plan for ship"
    assert Agent.plan.name == "agent.plan"
