"""The outcome beside the result: executed, replayed, reconciled or waited for, per call."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import effectq
from effectq._runtime.singleflight import flights
from effectq.events import EventKind
from effectq.store.base import ClaimRequest


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def held_elsewhere(store: effectq.Store, effect: effectq.Effect[[], Any], rid: str) -> tuple[str, int]:
    """Claim ``effect``'s key in run ``rid`` as another process would: (key, token)."""
    with effectq.run(rid, store=store):
        key = effect.key()
    return key, store.claim(key, ClaimRequest(lease_ms=30_000, owner="elsewhere")).token


def test_executed_then_replayed_with_the_keys_the_function_saw(store: effectq.Store) -> None:
    """The first call executed, the next replayed; the key and idempotency key are the function's."""
    seen: list[effectq.EffectContext] = []

    @effectq.effect(name="outcome.send")
    def send(to: str) -> str:
        seen.append(effectq.current_effect())
        return f"sent:{to}"

    with effectq.run(run_id(), store=store):
        first = send.call_with_outcome("a")
        again = send.call_with_outcome("a")
        plain = send("a")
    assert (first.value, first.kind, first.executed) == ("sent:a", EventKind.EXECUTED, True)
    assert (again.value, again.kind, again.executed) == ("sent:a", EventKind.REPLAYED, False)
    assert plain == "sent:a"
    assert len(seen) == 1
    assert first.key == again.key == seen[0].key
    assert first.idempotency_key == again.idempotency_key == seen[0].idempotency_key
    assert first.namespace == store.namespace


def test_async_effect_outcome(store: effectq.Store) -> None:
    """An async effect: ``await acall_with_outcome`` says executed, then replayed."""

    @effectq.effect(name="outcome.async")
    async def send(n: int) -> int:
        return n + 1

    async def main() -> list[effectq.Outcome[int]]:
        async with effectq.run(run_id(), store=store):
            return [await send.acall_with_outcome(1), await send.acall_with_outcome(1)]

    first, again = asyncio.run(main())
    assert (first.value, first.kind) == (2, EventKind.EXECUTED)
    assert (again.value, again.kind) == (2, EventKind.REPLAYED)
    assert first.key == again.key


def test_stream_outcomes_sync_and_async(store: effectq.Store) -> None:
    """A generator effect's outcome (its last item, how it came) is known once its items ended."""

    @effectq.effect(name="outcome.gen")
    def tokens(n: int) -> Iterator[int]:
        yield from range(n)

    @effectq.effect(name="outcome.agen")
    async def atokens(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async def consume(streamed: effectq.Streamed[AsyncIterator[int]]) -> list[int]:
        return [item async for item in streamed.items]

    with effectq.run(run_id(), store=store):
        first = tokens.stream_with_outcome(3)
        with pytest.raises(RuntimeError, match="not ended"):
            first.outcome  # noqa: B018
        assert list(first.items) == [0, 1, 2]
        again = tokens.stream_with_outcome(3)
        assert list(again.items) == [2]
    assert (first.outcome.value, first.outcome.kind) == (2, EventKind.EXECUTED)
    assert (again.outcome.value, again.outcome.kind) == (2, EventKind.REPLAYED)

    async def main() -> tuple[list[int], list[int], effectq.Streamed[Any], effectq.Streamed[Any]]:
        async with effectq.run(run_id(), store=store):
            one, two = atokens.stream_with_outcome(2), atokens.stream_with_outcome(2)
            return await consume(one), await consume(two), one, two

    items, replayed, one, two = asyncio.run(main())
    assert (items, replayed) == ([0, 1], [1])
    assert (one.outcome.kind, two.outcome.kind) == (EventKind.EXECUTED, EventKind.REPLAYED)


def test_reconciled_outcome(store: effectq.Store) -> None:
    """After an unknown outcome, a reconcile hook that finds the effect: reconciled."""

    @effectq.effect(name="outcome.reconciled", reconcile=lambda key, args, ctx: "found")
    def send() -> str:
        raise AssertionError("must not run: reconcile found it")

    rid = run_id()
    key, token = held_elsewhere(store, send, rid)
    store.mark_unknown(key, token, error="the worker died mid-call")
    with effectq.run(rid, store=store):
        done = send.call_with_outcome()
    assert (done.value, done.kind, done.key) == ("found", EventKind.RECONCILED, key)


def test_waited_for_a_holder_elsewhere(store: effectq.Store) -> None:
    """A call that waited for the same effect in flight in another process took its result: waited."""

    @effectq.effect(name="outcome.waited", wait=30)
    def send() -> str:
        raise AssertionError("must not run: the holder completes it")

    rid = run_id()
    key, token = held_elsewhere(store, send, rid)
    got: list[effectq.Outcome[str]] = []
    bound: list[effectq.Run] = []

    def caller() -> None:
        with effectq.run(rid, store=store) as run:
            bound.append(run)
            got.append(send.call_with_outcome())

    thread = threading.Thread(target=caller)
    thread.start()
    while thread.is_alive() and not (bound and bound[0].stats.waited):  # it found the claim and waits
        threading.Event().wait(0.01)
    store.complete(
        key, token, result=b'"theirs"', result_state=effectq.ResultState.STORED, retention_ms=60_000
    )
    thread.join()
    assert [(o.value, o.kind) for o in got] == [("theirs", EventKind.WAITED)]


def test_waited_for_the_leader_in_this_process(store: effectq.Store) -> None:
    """A follower of the same key in this process shares the leader's execution: waited."""
    entered, release = threading.Event(), threading.Event()
    runs: list[int] = []

    @effectq.effect(name="outcome.flight")
    def send() -> int:
        runs.append(1)
        entered.set()
        release.wait()
        return 7

    rid = run_id()
    got: dict[str, effectq.Outcome[int]] = {}

    def call(who: str) -> None:
        with effectq.run(rid, store=store):
            got[who] = send.call_with_outcome()

    leader = threading.Thread(target=call, args=("leader",))
    leader.start()
    entered.wait()
    follower = threading.Thread(target=call, args=("follower",))
    follower.start()
    flight = next(f for (sid, _), f in flights._flights.items() if sid == id(store))
    while flight._event is None:  # the follower waits on the leader's flight
        threading.Event().wait(0.01)
    release.set()
    leader.join()
    follower.join()
    assert runs == [1]
    assert (got["leader"].kind, got["follower"].kind) == (EventKind.EXECUTED, EventKind.WAITED)
    assert got["follower"].value == 7
    assert got["leader"].key == got["follower"].key


def test_each_kind_of_effect_has_its_own_method(store: effectq.Store) -> None:
    """The wrong method for the kind of effect is a clear TypeError, before anything runs."""

    @effectq.effect(name="outcome.sync")
    def plain() -> int:
        raise AssertionError("must not run")

    @effectq.effect(name="outcome.coro")
    async def coro() -> int:
        raise AssertionError("must not run")

    with effectq.run(run_id(), store=store):
        with pytest.raises(TypeError, match="acall_with_outcome"):
            coro.call_with_outcome()
        with pytest.raises(TypeError, match="not a generator"):
            plain.stream_with_outcome()
        with pytest.raises(TypeError, match="call_with_outcome"):
            asyncio.run(plain.acall_with_outcome())  # type: ignore[arg-type]


def test_no_run_bound_raises_as_a_call_does() -> None:
    """Outside a run, asking for the outcome raises NoActiveRun, as calling does."""

    @effectq.effect(name="outcome.norun")
    def send() -> int:
        raise AssertionError("must not run")

    with pytest.raises(effectq.NoActiveRun):
        send.call_with_outcome()
