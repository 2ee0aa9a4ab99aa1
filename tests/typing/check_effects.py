"""How user code sees effectq's types (checked by mypy only, never run)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
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


@effectq.effect(redact=lambda r: {**r, "card": "****"})
def charge(amount: int) -> dict[str, str]:
    return {}


@effectq.effect(redact=effectq.NOTHING)
def tokens(n: int) -> Iterator[str]:
    yield "a"


async def outcomes() -> None:
    done = send.call_with_outcome("a", "b")
    assert_type(done, effectq.Outcome[int])
    assert_type(done.value, int)
    assert_type(done.kind, effectq.events.EventKind)
    assert_type(done.idempotency_key, str)
    assert_type(charge.call_with_outcome(1).value, dict[str, str])
    posted = await post.acall_with_outcome(1)
    assert_type(posted, effectq.Outcome[str])
    await post.acall_with_outcome("x")  # type: ignore[arg-type]
    streamed = tokens.stream_with_outcome(2)
    assert_type(streamed, effectq.Streamed[Iterator[str]])
    for item in streamed.items:
        assert_type(item, str)
    with effectq.disabled():
        send("a", "b")
