"""How user code sees effectq's types (checked by mypy only, never run)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import assert_type

import effectq


@effectq.effect
def send(to: str, subject: str) -> int:
    return 1


@effectq.effect(name="github.comment", lease=timedelta(minutes=1), key=lambda args, ctx: f"{ctx.run_id}:c")
def comment(issue: int, body: str) -> dict[str, str]:
    return {}


@effectq.effect
async def post(n: int) -> str:
    return str(n)


def use(store: effectq.Store) -> None:
    with effectq.run("r", store=store) as bound:
        assert_type(bound, effectq.Run)
        assert_type(send("a", "b"), int)
        assert_type(comment(1, body="x"), dict[str, str])
        assert_type(asyncio.run(post(1)), str)
        send(1, "b")  # type: ignore[arg-type]
        send("a")  # type: ignore[call-arg]
    ctx = effectq.current_effect()
    assert_type(ctx.idempotency_key, str)
    assert_type(effectq.effect_marker(ctx.key), str)
