"""wrap_tools: side-effecting tools apply once per key, read-only tools pass through, allow gates."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import effectq


class Shop:
    """Tools of a support agent, counting what they did."""

    def __init__(self) -> None:
        self.applied: Counter[str] = Counter()
        self.gate = threading.Event()

    def lookup_order(self, order_id: int) -> dict[str, Any]:
        """Read an order."""
        self.applied["lookup_order"] += 1
        return {"order_id": order_id, "total": 30.0}

    def refund(self, order_id: int, amount: float) -> str:
        """Refund an order."""
        self.applied["refund"] += 1
        return f"refund of {amount} for order {order_id}"

    async def send_email(self, to: str, subject: str) -> str:
        """Email a customer."""
        self.applied["send_email"] += 1
        return f"mail to {to}: {subject}"

    def tools(self) -> dict[str, Any]:
        return {"lookup_order": self.lookup_order, "refund": self.refund, "send_email": self.send_email}


def test_read_only_tools_pass_through_unchanged() -> None:
    """Without allow, a tool not named in effects is the very same object."""
    shop = Shop()
    tools = effectq.wrap_tools(shop.tools(), effects=["refund"])
    assert tools["lookup_order"] == shop.lookup_order
    assert tools["refund"] != shop.refund
    assert list(tools) == ["lookup_order", "refund", "send_email"]


def test_wrappers_look_like_the_tools() -> None:
    """Name, docstring, signature and async-ness survive, for frameworks that read them."""
    shop = Shop()
    tools = effectq.wrap_tools(shop.tools(), effects=["refund", "send_email"], allow=lambda name: True)
    for name, tool in tools.items():
        original = shop.tools()[name]
        assert tool.__name__ == name
        assert tool.__doc__ == original.__doc__
        assert inspect.signature(tool) == inspect.signature(original)
        assert inspect.iscoroutinefunction(tool) == inspect.iscoroutinefunction(original)


def test_calls_with_new_call_ids_fold_into_one(store: effectq.Store) -> None:
    """The same call under five tool-call ids, one after another, applies once."""
    shop = Shop()
    tools = effectq.wrap_tools(shop.tools(), effects=["refund"])
    calls = [
        {"id": f"call_{i}", "name": "refund", "arguments": '{"order_id": 42, "amount": 30.0}'}
        for i in range(5)
    ]
    with effectq.run("ticket-1", store=store):
        results = [tools[c["name"]](**json.loads(c["arguments"])) for c in calls]
    assert results == ["refund of 30.0 for order 42"] * 5
    assert shop.applied["refund"] == 1


def test_other_arguments_are_another_effect(store: effectq.Store) -> None:
    """A different argument is a different application (a second refund)."""
    shop = Shop()
    tools = effectq.wrap_tools(shop.tools(), effects=["refund"])
    with effectq.run("ticket-1", store=store):
        tools["refund"](order_id=42, amount=30.0)
        tools["refund"](order_id=42, amount=10.0)
    assert shop.applied["refund"] == 2


def test_parallel_identical_calls_share_one_execution(store: effectq.Store) -> None:
    """Identical calls in parallel threads of one turn wait for one execution and share it."""
    shop = Shop()
    started = threading.Event()

    def slow_refund(order_id: int, amount: float) -> str:
        started.set()
        assert shop.gate.wait(30)
        return shop.refund(order_id, amount)

    tools = effectq.wrap_tools({"refund": slow_refund}, effects=["refund"])
    with effectq.run("ticket-1", store=store) as bound, ThreadPoolExecutor(5) as pool:
        call = functools.partial(tools["refund"], order_id=42, amount=30.0)
        futures = [pool.submit(contextvars.copy_context().run, call) for _ in range(5)]
        assert started.wait(30)
        shop.gate.set()
        results = [f.result(timeout=60) for f in futures]
    assert results == ["refund of 30.0 for order 42"] * 5
    assert shop.applied["refund"] == 1
    assert bound.stats.executed == 1
    assert bound.stats.waited + bound.stats.replayed == 4


def test_async_tool_set(store: effectq.Store) -> None:
    """Async tools stay async and gathered identical calls apply once."""
    shop = Shop()
    tools = effectq.wrap_tools(shop.tools(), effects=["send_email"])

    async def turn() -> list[str]:
        async with effectq.run("ticket-1", store=store):
            return list(
                await asyncio.gather(*(tools["send_email"]("a@example.com", "Refunded") for _ in range(5)))
            )

    assert asyncio.run(turn()) == ["mail to a@example.com: Refunded"] * 5
    assert asyncio.run(turn()) == ["mail to a@example.com: Refunded"] * 5
    assert shop.applied["send_email"] == 1


def test_per_tool_key(store: effectq.Store) -> None:
    """A per-tool key makes "the same effect" mean one refund per order, whatever the amount."""
    shop = Shop()
    tools = effectq.wrap_tools(
        shop.tools(),
        effects={"refund": {"key": lambda args, ctx: f"{ctx.run_id}:refund:{args['order_id']}"}},
    )
    with effectq.run("ticket-1", store=store):
        first = tools["refund"](order_id=42, amount=30.0)
        assert tools["refund"](order_id=42, amount=25.0) == first
    assert shop.applied["refund"] == 1


def test_per_tool_reconcile(store: effectq.Store) -> None:
    """A per-tool reconcile hook runs before a first execution with reconcile_on="always"."""
    shop = Shop()
    already = {42: "refund found at the payment provider"}
    tools = effectq.wrap_tools(
        shop.tools(),
        effects={
            "refund": {
                "key_args": ["order_id"],
                "reconcile": lambda key, args, ctx: already.get(args["order_id"]),
                "reconcile_on": "always",
            }
        },
    )
    with effectq.run("ticket-1", store=store):
        assert tools["refund"](order_id=42, amount=30.0) == "refund found at the payment provider"
        assert tools["refund"](order_id=7, amount=5.0) == "refund of 5.0 for order 7"
    assert shop.applied["refund"] == 1


def test_effect_names_carry_the_prefix(store: effectq.Store) -> None:
    """Each effect is named prefix + tool name, so its records say which tool they are."""
    shop = Shop()
    tools = effectq.wrap_tools(shop.tools(), effects=["refund"], prefix="support.")
    with effectq.run("ticket-1", store=store) as bound:
        tools["refund"](order_id=42, amount=30.0)
        assert bound.calls("support.refund") == 1


def test_an_effect_in_the_tool_set_stays_itself(store: effectq.Store) -> None:
    """A tool that already is an effect keeps its own name and options."""
    applied = []

    @effectq.effect(name="crm.note")
    def add_note(text: str) -> str:
        applied.append(text)
        return "noted"

    tools = effectq.wrap_tools([add_note], allow=lambda name: name == "add_note")
    with effectq.run("ticket-1", store=store) as bound:
        assert tools[0](text="hi") == tools[0](text="hi") == "noted"
        assert bound.calls("crm.note") == 2
    assert applied == ["hi"]
    with pytest.raises(effectq.ConfigurationError, match="already is an effect"):
        effectq.wrap_tools([add_note], effects=["add_note"])


def test_allow_is_asked_on_every_call(store: effectq.Store) -> None:
    """A refused call raises ToolNotAllowed, runs nothing and records nothing; allow is asked each time."""
    shop = Shop()
    granted = {"lookup_order", "refund"}
    asked: list[str] = []

    def allow(name: str) -> bool:
        asked.append(name)
        return name in granted

    tools = effectq.wrap_tools(shop.tools(), effects=["refund", "send_email"], allow=allow)
    with effectq.run("ticket-1", store=store) as bound:
        tools["lookup_order"](42)
        tools["refund"](order_id=42, amount=30.0)
        granted.discard("refund")  # revoked mid-run
        with pytest.raises(effectq.ToolNotAllowed) as caught:
            tools["refund"](order_id=43, amount=1.0)
        with pytest.raises(effectq.ToolNotAllowed):
            asyncio.run(tools["send_email"]("a@example.com", "hi"))
        assert bound.calls("tool.send_email") == 0
    assert caught.value.tool == "refund"
    assert "not allowed" in str(caught.value)
    assert asked == ["lookup_order", "refund", "refund", "send_email"]
    assert shop.applied == Counter({"lookup_order": 1, "refund": 1})


def test_list_form_keeps_order_and_names() -> None:
    """A list of functions comes back as a list, in order, named by __name__."""
    shop = Shop()
    tools = effectq.wrap_tools([shop.lookup_order, shop.refund], effects=["refund"])
    assert [t.__name__ for t in tools] == ["lookup_order", "refund"]
    assert tools[0] == shop.lookup_order


def test_misconfiguration_is_refused() -> None:
    """Unknown effect names, duplicate names and non-callables fail when wrapping."""
    shop = Shop()
    with pytest.raises(effectq.ConfigurationError, match="string"):
        effectq.wrap_tools(shop.tools(), effects="refund")  # type: ignore[arg-type]
    with pytest.raises(effectq.ConfigurationError, match="refnud"):
        effectq.wrap_tools(shop.tools(), effects=["refnud"])
    with pytest.raises(effectq.ConfigurationError, match="two tools"):
        effectq.wrap_tools([shop.refund, shop.refund])
    with pytest.raises(effectq.ConfigurationError, match="not callable"):
        effectq.wrap_tools({"refund": 42})  # type: ignore[dict-item]
    with pytest.raises(effectq.ConfigurationError, match="allow"):
        effectq.wrap_tools(shop.tools(), allow="refund")  # type: ignore[arg-type]
    with pytest.raises(effectq.ConfigurationError, match="not valid"):
        effectq.wrap_tools({"send email": shop.refund}, effects=["send email"])
