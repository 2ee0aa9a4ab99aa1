"""Reported agent incidents, re-expressed: each prints the count without effectq and with it.

Every incident runs twice: once as agents are written today (the baseline,
which must reproduce the duplicate), once with effectq on the real Redis store
(model steps journaled, side-effecting tools wrapped).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import effectq

pydantic_ai = pytest.importorskip("pydantic_ai")

from pydantic_ai import (  # noqa: E402
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ModelMessage,
    ModelResponse,
    TextPart,
    Tool,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from effectq.pydantic_ai import DurableModel  # noqa: E402

pytestmark = pytest.mark.redis


def _report(incident: str, without: int, with_effectq: int) -> None:
    print(f"\n{incident}: without effectq {without}, with effectq {with_effectq}")


# -- five identical tool calls with five call ids in one turn ------------------------------


def test_five_identical_calls_in_one_turn(redis_store: effectq.RedisStore) -> None:
    """The model asks for the same refund five times under five call ids in one turn: 5 -> 1."""

    def run_once(durable: bool) -> int:
        applied: list[str] = []

        def refund(order_id: int, amount: float) -> str:
            applied.append(f"{order_id}:{amount}")
            return f"refunded {amount}"

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            if len(messages) == 1:
                args = {"order_id": 42, "amount": 30.0}
                return ModelResponse(
                    parts=[ToolCallPart("refund", args, tool_call_id=f"call_{i}") for i in range(5)]
                )
            return ModelResponse(parts=[TextPart("Refunded.")])

        tools = effectq.wrap_tools([refund], effects=["refund"]) if durable else [refund]
        agent = Agent(FunctionModel(model), tools=tools)
        if durable:
            with effectq.run("ticket-1", store=redis_store):
                agent.run_sync("Refund order 42")
        else:
            agent.run_sync("Refund order 42")
        return len(applied)

    without, with_effectq = run_once(durable=False), run_once(durable=True)
    _report("five identical refund calls under five call ids", without, with_effectq)
    assert (without, with_effectq) == (5, 1)


# -- a model step fails after a tool result was stored; the run is retried ------------------


class ScriptedModel:
    """An OpenAI-style chat model: refund, then (after one provider error) a final answer."""

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()
        self.failures_left = 1

    def __call__(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        step = sum(1 for m in messages if m["role"] == "assistant")
        self.calls[step] += 1
        if step == 0:
            arguments = json.dumps({"order_id": 42, "amount": 30.0})
            call = {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "function": {"name": "refund", "arguments": arguments},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        if self.failures_left:
            self.failures_left -= 1
            raise ConnectionError("model provider returned 502")
        return {"role": "assistant", "content": "Your refund of 30.0 is on its way."}


def agent_loop(model: Callable[[list[dict[str, Any]]], dict[str, Any]], tools: dict[str, Any]) -> str:
    """A hand-written function-calling loop, as with the OpenAI or Anthropic SDKs."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Refund order 42."}]
    for _ in range(10):
        reply = model(messages)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return str(reply["content"])
        for call in reply["tool_calls"]:
            result = tools[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    raise AssertionError("the agent did not finish")


def test_model_step_fails_after_a_tool_result_then_the_run_is_retried(
    redis_store: effectq.RedisStore,
) -> None:
    """Retried after the model failed past the refund: without effectq it re-plans and refunds twice."""

    def run_once(durable: bool) -> tuple[int, Counter[int]]:
        refunds: list[int] = []

        def refund(order_id: int, amount: float) -> str:
            refunds.append(order_id)
            return f"refunded {amount}"

        scripted = ScriptedModel()
        model: Any = effectq.step(name="llm")(scripted.__call__) if durable else scripted
        tools = effectq.wrap_tools({"refund": refund}, effects=["refund"]) if durable else {"refund": refund}
        for attempt in range(2):  # the task queue retries the failed run under the same id
            try:
                if durable:
                    with effectq.run("ticket-2", store=redis_store):
                        agent_loop(model, tools)
                else:
                    agent_loop(model, tools)
            except ConnectionError:
                assert attempt == 0
        return len(refunds), scripted.calls

    (without, _), (with_effectq, calls) = run_once(durable=False), run_once(durable=True)
    _report("refunds after a model failure and a retry of the run", without, with_effectq)
    assert (without, with_effectq) == (2, 1)
    assert calls == Counter({0: 1, 1: 2})  # step 0 paid once; step 1 failed once, then answered


# -- the same approval delivered twice --------------------------------------------------------


def test_the_same_approval_delivered_twice(redis_store: effectq.RedisStore) -> None:
    """An approval webhook arrives twice; each delivery resumes the agent: the transfer runs once."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
            return ModelResponse(parts=[TextPart("Sent.")])
        return ModelResponse(
            parts=[ToolCallPart("transfer", {"to": "bob", "cents": 10_000}, tool_call_id="call_7")]
        )

    def run_once(durable: bool) -> int:
        transfers: list[int] = []

        def transfer(to: str, cents: int) -> str:
            transfers.append(cents)
            return f"sent {cents} to {to}"

        tools = effectq.wrap_tools([transfer], effects=["transfer"]) if durable else [transfer]
        agent = Agent(
            DurableModel(FunctionModel(model)) if durable else FunctionModel(model),
            tools=[Tool(t, requires_approval=True) for t in tools],
            output_type=[str, DeferredToolRequests],
        )
        with effectq.run("conversation-9:ask", store=redis_store):
            paused = agent.run_sync("Send bob 100 dollars")
        assert isinstance(paused.output, DeferredToolRequests)
        history = paused.all_messages()
        approval = DeferredToolResults(approvals={paused.output.approvals[0].tool_call_id: True})
        for _delivery in range(2):  # the run is the approval, not the delivery
            with effectq.run("conversation-9:approval:call_7", store=redis_store):
                assert (
                    agent.run_sync(message_history=history, deferred_tool_results=approval).output == "Sent."
                )
        return len(transfers)

    without, with_effectq = run_once(durable=False), run_once(durable=True)
    _report("transfers after the same approval was delivered twice", without, with_effectq)
    assert (without, with_effectq) == (2, 1)
