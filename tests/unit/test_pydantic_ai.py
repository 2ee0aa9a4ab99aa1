"""pydantic-ai: DurableModel journals model requests, wrap_tools keeps call ids out of keys."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from typing import Any

import pytest

import effectq

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, ModelMessage, ModelResponse, RunContext, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from effectq.pydantic_ai import DurableModel, transcript


class Script:
    """A FunctionModel script: look up, then refund, then answer; counts requests per step."""

    def __init__(self) -> None:
        self.requests: list[int] = []

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(1 for m in messages if isinstance(m, ModelResponse))
        self.requests.append(step)
        if step == 0:
            return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": 42}, tool_call_id="c1")])
        if step == 1:
            return ModelResponse(
                parts=[ToolCallPart("refund", {"order_id": 42, "amount": 30.0}, tool_call_id="c2")]
            )
        return ModelResponse(parts=[TextPart("Refunded 30.0 for order 42.")])


class Tools:
    def __init__(self) -> None:
        self.applied: list[str] = []

    def lookup_order(self, order_id: int) -> dict[str, Any]:
        self.applied.append("lookup_order")
        return {"order_id": order_id, "total": 30.0}

    def refund(self, ctx: RunContext[None], order_id: int, amount: float) -> str:
        self.applied.append(f"refund:{ctx.tool_call_id}")
        return f"refunded {amount}"


def test_a_rerun_replays_model_steps_and_tool_effects(store: effectq.Store) -> None:
    """Rerun under the same run id: every journaled request replays and the refund applies once."""
    script, tools = Script(), Tools()
    agent = Agent(
        DurableModel(FunctionModel(script.respond)),
        tools=effectq.wrap_tools([tools.lookup_order, tools.refund], effects=["refund"]),
    )
    outputs = []
    for _ in range(2):
        with effectq.run("ticket-1", store=store):
            outputs.append(agent.run_sync("Refund order 42").output)
    assert outputs == ["Refunded 30.0 for order 42."] * 2
    assert script.requests == [0, 1, 2]  # each model step paid once in total
    assert tools.applied == ["lookup_order", "refund:c2", "lookup_order"]  # reads run again


def test_run_context_stays_out_of_the_key(store: effectq.Store) -> None:
    """A tool taking RunContext is keyed by its arguments only: new call ids fold into one."""
    tools = Tools()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            call = {"order_id": 42, "amount": 30.0}
            return ModelResponse(
                parts=[ToolCallPart("refund", call, tool_call_id=f"id{i}") for i in range(3)]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), tools=effectq.wrap_tools([tools.refund], effects=["refund"]))
    with effectq.run("ticket-1", store=store):
        agent.run_sync("Refund order 42")
        agent.run_sync("Refund order 42")  # re-planned from scratch: ids id0..id2 again
    assert len(tools.applied) == 1


def test_test_model_round_trips_through_the_journal(store: effectq.Store) -> None:
    """TestModel's responses (tool calls with generated arguments, then text) replay as equal objects."""
    tools = Tools()
    agent = Agent(
        DurableModel(TestModel(call_tools=["refund"])),
        tools=effectq.wrap_tools([tools.refund], effects=["refund"]),
    )
    results = []
    for _ in range(2):
        with effectq.run("ticket-1", store=store):
            results.append(agent.run_sync("Refund something"))
    assert results[0].output == results[1].output
    responses = [[m for m in r.all_messages() if isinstance(m, ModelResponse)] for r in results]
    assert [r.parts for r in responses[0]] == [r.parts for r in responses[1]]
    assert len(tools.applied) == 1


def test_transcript_leaves_out_what_differs_between_attempts() -> None:
    """Two attempts of one conversation have equal transcripts although timestamps and run ids differ."""
    agent = Agent(TestModel())
    first = agent.run_sync("hello").all_messages()
    second = agent.run_sync("hello").all_messages()
    assert first != second
    assert transcript(first) == transcript(second)
    assert transcript(agent.run_sync("bye").all_messages()) != transcript(first)


def test_replay_without_changes_does_not_warn(store: effectq.Store, caplog: pytest.LogCaptureFixture) -> None:
    """A faithful rerun compares equal at every step: no divergence warning."""
    tools = Tools()
    agent = Agent(DurableModel(FunctionModel(Script().respond)), tools=[tools.lookup_order, tools.refund])
    with caplog.at_level(logging.WARNING, logger="effectq"):
        for _ in range(2):
            with effectq.run("ticket-1", store=store):
                agent.run_sync("Refund order 42")
    assert "different input" not in caplog.text


def test_a_changed_prompt_diverges(store: effectq.Store) -> None:
    """With on_mismatch="raise", a rerun asked something else raises naming the model step."""
    agent = Agent(DurableModel(FunctionModel(Script().respond), on_mismatch="raise"))
    with effectq.run("ticket-1", store=store):
        agent.run_sync("Refund order 42")
    with effectq.run("ticket-1", store=store), pytest.raises(effectq.StepDivergedError) as caught:
        agent.run_sync("Refund order 43")
    assert (caught.value.name, caught.value.ordinal) == ("agent.model", 0)


def test_streamed_requests_are_refused(store: effectq.Store) -> None:
    """run_stream would bypass the journal, so it raises instead of running un-journaled."""
    agent = Agent(DurableModel(TestModel()))

    async def stream() -> None:
        async with agent.run_stream("hi") as result:
            await result.get_output()

    with effectq.run("ticket-1", store=store), pytest.raises(effectq.ConfigurationError, match="streamed"):
        asyncio.run(stream())


def test_import_effectq_does_not_import_pydantic_ai() -> None:
    """The integration loads lazily, and a missing extra names the pip command."""
    code = (
        "import sys, effectq\n"
        "assert 'pydantic_ai' not in sys.modules\n"
        "sys.modules['pydantic_ai'] = None\n"
        "try:\n"
        "    import effectq.pydantic_ai\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'effectq[agents]'" in out
