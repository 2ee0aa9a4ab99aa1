"""How agent code sees the types of steps and tool sets (checked by mypy only, never run)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any, assert_type

import effectq


@effectq.step
def plan(goal: str) -> list[str]:
    return [goal]


@effectq.step(name="llm", on_mismatch="raise", lease=30.0)
def call_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {}


@effectq.step(name="think")
async def think(prompt: str) -> str:
    return prompt


def refund(order_id: int, amount: float) -> str:
    return "ok"


def use(store: effectq.Store) -> None:
    with effectq.run("r", store=store):
        assert_type(plan("ship"), list[str])
        assert_type(call_model([{"role": "user"}]), dict[str, Any])
        assert_type(asyncio.run(think("x")), str)
        assert_type(effectq.step("clock", time.time), float)
        assert_type(effectq.step("jitter", random.uniform, 0.5, 1.5), float)
        plan(1)  # type: ignore[arg-type]
        effectq.step("jitter", random.uniform, "a", 1.5)  # type: ignore[call-overload]
    tools = effectq.wrap_tools(
        {"refund": refund},
        effects={"refund": {"key_args": ["order_id"], "replay_safe": True}},
        allow=lambda name: name != "refund",
    )
    assert_type(tools, dict[str, Callable[..., Any]])
    assert_type(effectq.wrap_tools([refund], effects=["refund"]), list[Callable[..., Any]])
    effectq.wrap_tools({"refund": refund}, effects={"refund": {"replay_saf": True}})  # type: ignore[typeddict-unknown-key]
