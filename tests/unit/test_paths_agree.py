"""A sync and an async effect take the same steps, on the real Redis.

Both run the one procedure; they differ in the driver (blocking, or awaited in an event
loop) and in the wire under it (the store's lane, or its async lane sent from the loop,
or a worker thread). The same scenario through both must give the same events, stats,
records and exceptions.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import effectq
from effectq import events
from effectq.store.base import ClaimRequest
from effectq.testing import Action, Fault, FaultyStore, Point


class Declined(Exception):
    """Not applied: released."""


class Timeout(Exception):
    """Maybe applied: unknown."""


def _outcome(run: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", run()
    except BaseException as exc:
        return "raised", type(exc).__name__


def _scenario(
    store: effectq.Store, kind: str, body: str, *, prepare: Callable[[effectq.Store, str], None] | None = None
) -> dict[str, Any]:
    """Run one call of a ``kind`` ("sync" or "async") effect whose body does ``body``; what it saw."""
    seen: list[tuple[str, str, int]] = []

    def listen(event: events.Event) -> None:
        seen.append((event.kind.value, event.step, event.attempt))

    def act(n: int) -> Any:
        if body == "declines":
            raise Declined("card declined")
        if body == "times out":
            raise Timeout("no answer")
        if body == "too large":
            return "x" * 100
        return {"n": n}

    options: dict[str, Any] = {"name": f"paths.{body.replace(' ', '_')}", "max_result_bytes": 64}
    options.update(lease=10, wait=0)  # in flight after a crash: InProgress at once, never a wait
    options["maybe_applied"] = [Timeout]
    if kind == "sync":

        @effectq.effect(**options)
        def effect_fn(n: int) -> Any:
            return act(n)
    else:

        @effectq.effect(**options)
        async def effect_fn(n: int) -> Any:
            return act(n)

    run_id = f"paths-{uuid.uuid4().hex[:8]}"
    unsubscribe = events.subscribe(listen)
    try:
        with effectq.run(run_id, store=store) as bound:
            key = effect_fn.key(7)
            if prepare is not None:
                prepare(store, key)
            call = (lambda: effect_fn(7)) if kind == "sync" else (lambda: asyncio.run(effect_fn(7)))  # type: ignore[arg-type]
            first = _outcome(call)
            second = _outcome(call)
    finally:
        unsubscribe()
    record = store.get(key)
    return {
        "first": first,
        "second": second,
        "events": seen,
        "stats": (bound.stats.executed, bound.stats.replayed, bound.stats.failed),
        "status": None if record is None else (record.status, record.result_state, record.attempt),
    }


BODIES = ["returns", "declines", "times out", "too large"]


@pytest.mark.parametrize("body", BODIES)
def test_sync_and_async_agree(redis_store: effectq.RedisStore, body: str) -> None:
    """First call and a second (replay, or what follows a failure) see the same thing either way."""
    assert _scenario(redis_store, "sync", body) == _scenario(redis_store, "async", body)


@pytest.mark.parametrize(
    "fault",
    [
        Fault(Point.BEFORE_CLAIM, Action.ERROR),
        Fault(Point.BEFORE_CLAIM, Action.ERROR, times=3),
        Fault(Point.AFTER_EFFECT, Action.ERROR),
        Fault(Point.AFTER_EFFECT, Action.ERROR, times=4),
        Fault(Point.COMPLETION_LOST, Action.ERROR),
        Fault(Point.AFTER_CLAIM, Action.CRASH),
        Fault(Point.AFTER_EFFECT, Action.CRASH),
    ],
    ids=lambda f: f"{f.point.value}-{f.action.value}-{f.times}",
)
def test_sync_and_async_agree_under_store_faults(redis_store: effectq.RedisStore, fault: Fault) -> None:
    """A failed claim or completion is retried, given up or left unknown alike on both paths."""
    outcomes = []
    for kind in ("sync", "async"):
        injected = Fault(fault.point, fault.action, times=fault.times)
        outcomes.append(_scenario(FaultyStore(redis_store, [injected]), kind, "returns"))
    assert outcomes[0] == outcomes[1]


def test_sync_and_async_agree_on_a_claim_taken_over(redis_store: effectq.RedisStore) -> None:
    """A completion whose claim was taken over meanwhile is not recorded, alike on both paths."""

    def steal_after_claim(store: effectq.Store, key: str) -> None:
        inner = store.claim

        def claim_then_steal(k: str, request: ClaimRequest) -> Any:
            got = inner(k, request)
            store.release(k, got.token, error="taken over", retention_ms=60_000)  # type: ignore[attr-defined]
            return got

        store.claim = claim_then_steal  # type: ignore[method-assign]

    outcomes = []
    for kind in ("sync", "async"):
        store = effectq.RedisStore(redis_store.client, namespace=redis_store.namespace)
        outcomes.append(_scenario(store, kind, "returns", prepare=steal_after_claim))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["first"] == ("value", {"n": 7})
