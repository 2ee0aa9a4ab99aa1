"""Single flight at its edges, and streams closed before their end.

Callers of one key in one process share one execution (single flight). A follower gets what
a caller after the leader would get: the leader's result when it had the same input, the
mismatch check when it had another, and never the leader's own cancellation. A stream whose
consumer stops early may have partly applied: it is recorded as unknown, its source is
closed, and closing it never raises. An effect that calls itself by its own key fails at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import effectq
from effectq.store.base import Status


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail (naming ``what``) if it never does."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.01)


def parked(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in a wait of the threading module (an Event, a Condition)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Let the loop run until ``condition`` holds, then a few turns more."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        await asyncio.sleep(0.01)
    for _ in range(5):
        await asyncio.sleep(0)


def record_of(store: effectq.Store, key: str) -> Any:
    record = store.get(key)
    assert record is not None, f"no record of {key}"
    return record


def one_key(args: dict[str, Any], ctx: effectq.KeyContext) -> str:
    """Every call of the effect in a run shares one key, whatever its input."""
    return f"{ctx.run_id}:{ctx.name}"


# -- a follower with another input ------------------------------------------------------


class Payments:
    """A ``pay(amount)`` effect keyed by run alone, whose first call blocks until released."""

    def __init__(self, on_mismatch: str) -> None:
        self.charged: list[int] = []
        self.release = threading.Event()
        self.outcomes: dict[int, Any] = {}

        @effectq.effect(name="edge.pay", key=one_key, on_mismatch=on_mismatch, wait=30)
        def pay(amount: int) -> str:
            self.charged.append(amount)
            assert self.release.wait(30)
            return f"charged {amount}"

        self.pay = pay

    def call(self, rid: str, store: effectq.Store, amount: int) -> None:
        with effectq.run(rid, store=store):
            try:
                self.outcomes[amount] = self.pay(amount)
            except Exception as exc:
                self.outcomes[amount] = exc

    def leader_then_follower(self, store: effectq.Store) -> None:
        """pay(100) runs; pay(250) of the same key arrives while it does; then pay(100) returns."""
        rid = run_id()
        leader = threading.Thread(target=self.call, args=(rid, store, 100))
        leader.start()
        wait_until(lambda: self.charged == [100], "the leader is running")
        follower = threading.Thread(target=self.call, args=(rid, store, 250))
        follower.start()
        wait_until(lambda: parked(follower), "the follower waits for the leader")
        self.release.set()
        leader.join(30)
        follower.join(30)
        assert not leader.is_alive() and not follower.is_alive()


def test_follower_with_another_input_raises_input_mismatch(store: effectq.Store) -> None:
    """A thread waiting on another's execution of its key, with another input and
    on_mismatch="raise", gets InputMismatchError, as a caller after it would."""
    payments = Payments("raise")
    payments.leader_then_follower(store)
    assert payments.outcomes[100] == "charged 100"
    assert isinstance(payments.outcomes[250], effectq.InputMismatchError), payments.outcomes[250]
    assert payments.charged == [100]


def test_follower_with_another_input_is_warned(
    store: effectq.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """With on_mismatch="warn", such a follower gets the recorded result and the mismatch warning."""
    payments = Payments("warn")
    with caplog.at_level(logging.WARNING, logger="effectq.replay"):
        payments.leader_then_follower(store)
    assert payments.outcomes == {100: "charged 100", 250: "charged 100"}
    assert payments.charged == [100]
    warned = [r for r in caplog.records if "recorded with a different input" in r.getMessage()]
    assert len(warned) == 1, caplog.text


def test_async_follower_with_another_input_raises_input_mismatch(store: effectq.Store) -> None:
    """The same for asyncio tasks: the task with the other input gets InputMismatchError."""
    charged: list[int] = []

    async def main() -> list[Any]:
        release = asyncio.Event()

        @effectq.effect(name="edge.apay", key=one_key, on_mismatch="raise", wait=30)
        async def pay(amount: int) -> str:
            charged.append(amount)
            await release.wait()
            return f"charged {amount}"

        async with effectq.run(run_id(), store=store):
            leader = asyncio.create_task(pay(100))
            await until(lambda: charged == [100], "the leader is running")
            follower = asyncio.create_task(pay(250))
            await until(lambda: True, "the follower joined")
            release.set()
            return await asyncio.gather(leader, follower, return_exceptions=True)

    leader, follower = asyncio.run(main())
    assert leader == "charged 100"
    assert isinstance(follower, effectq.InputMismatchError), follower
    assert charged == [100]


# -- a leader stopped by its own control-flow exception ---------------------------------


def test_follower_of_a_cancelled_leader_gets_outcome_unknown(store: effectq.Store) -> None:
    """A task cancelled mid-effect leaves it unknown; a task that waited on it gets
    OutcomeUnknown (what the record shows), not the other task's cancellation."""

    async def main() -> tuple[BaseException, Any]:
        running = asyncio.Event()

        @effectq.effect(name="edge.push")
        async def push() -> str:
            running.set()
            await asyncio.sleep(60)
            return "pushed"

        async with effectq.run(run_id(), store=store):
            leader = asyncio.create_task(push())
            await running.wait()
            follower = asyncio.create_task(push())
            await until(lambda: True, "the follower joined")
            leader.cancel()
            (cancelled,) = await asyncio.gather(leader, return_exceptions=True)
            (outcome,) = await asyncio.gather(follower, return_exceptions=True)
            return cancelled, outcome

    cancelled, outcome = asyncio.run(main())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert isinstance(outcome, effectq.OutcomeUnknown), repr(outcome)


def test_follower_keeps_waiting_when_its_leader_is_cancelled_while_waiting(store: effectq.Store) -> None:
    """A leader cancelled while it waits for a holder elsewhere: its follower waits on, and
    returns the holder's result when it lands."""

    @effectq.effect(name="edge.job", wait=30)
    async def job() -> str:
        return "mine"

    async def main() -> tuple[BaseException, Any]:
        rid = run_id()
        async with effectq.run(rid, store=store) as bound:
            key = job.key()
            held = store.claim(key, effectq.store.ClaimRequest(lease_ms=30_000, owner="elsewhere"))
            leader = asyncio.create_task(job())
            await until(lambda: bound.stats.waited == 1, "the leader waits for the holder")
            follower = asyncio.create_task(job())
            await until(lambda: True, "the follower joined")
            leader.cancel()
            (cancelled,) = await asyncio.gather(leader, return_exceptions=True)
            await asyncio.to_thread(
                store.complete,
                key,
                held.token,
                result=b'"theirs"',
                result_state=effectq.ResultState.STORED,
                retention_ms=60_000,
            )
            (outcome,) = await asyncio.gather(follower, return_exceptions=True)
            return cancelled, outcome

    cancelled, outcome = asyncio.run(main())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert outcome == "theirs"


def test_thread_following_an_interrupted_leader_gets_outcome_unknown(store: effectq.Store) -> None:
    """A leader thread hit by KeyboardInterrupt mid-effect: the thread waiting on it gets
    OutcomeUnknown, not the interrupt."""
    release = threading.Event()
    entered: list[int] = []
    outcomes: dict[str, BaseException | str] = {}

    @effectq.effect(name="edge.interrupted", wait=30)
    def send() -> str:
        entered.append(1)
        assert release.wait(30)
        raise KeyboardInterrupt

    def call(role: str, rid: str) -> None:
        with effectq.run(rid, store=store):
            try:
                outcomes[role] = send()
            except BaseException as exc:
                outcomes[role] = exc

    rid = run_id()
    leader = threading.Thread(target=call, args=("leader", rid))
    leader.start()
    wait_until(lambda: entered == [1], "the leader is running")
    follower = threading.Thread(target=call, args=("follower", rid))
    follower.start()
    wait_until(lambda: parked(follower), "the follower waits for the leader")
    release.set()
    leader.join(30)
    follower.join(30)
    assert isinstance(outcomes["leader"], KeyboardInterrupt)
    assert isinstance(outcomes["follower"], effectq.OutcomeUnknown), repr(outcomes["follower"])
    assert entered == [1]


# -- streams closed before their end -----------------------------------------------------


class Source:
    """A generator effect's source: three items, and a note of how it ended."""

    def __init__(self) -> None:
        self.runs = 0
        self.closed_in: list[str] = []  # the key current_effect() named when the source closed

    def items(self) -> Iterator[int]:
        self.runs += 1
        try:
            yield from (1, 2, 3)
        finally:
            self.closed_in.append(effectq.current_effect().key)

    def effect(self, **options: Any) -> Any:
        """A generator effect that streams :meth:`items`."""

        @effectq.effect(name="edge.stream", **options)
        def stream() -> Iterator[int]:
            yield from self.items()

        return stream

    async def aitems(self) -> AsyncIterator[int]:
        self.runs += 1
        try:
            for item in (1, 2, 3):
                yield item
        finally:
            self.closed_in.append(effectq.current_effect().key)

    def async_effect(self) -> Any:
        """An async generator effect that streams :meth:`aitems`."""

        @effectq.effect(name="edge.astream")
        async def stream() -> AsyncIterator[int]:
            async for item in self.aitems():
                yield item

        return stream


def close_after_the_first_item(stream: Any, store: effectq.Store) -> str:
    """Take one item of ``stream()`` in a run of its own, close it; its key."""
    with effectq.run(run_id(), store=store):
        items = stream()
        next(items)
        items.close()
        return str(stream.key())


def test_closing_a_generator_early_records_unknown(store: effectq.Store) -> None:
    """gen.close() after the first item: close does not raise, the source is closed inside the
    effect, the record is unknown (the effect may have partly applied), a later call raises
    OutcomeUnknown."""
    source = Source()
    stream = source.effect()

    rid = run_id()
    with effectq.run(rid, store=store):
        key = stream.key()
    with effectq.run(rid, store=store):
        items = stream()
        assert next(items) == 1
        items.close()
    assert source.closed_in == [key]
    record = record_of(store, key)
    assert record.status is Status.UNKNOWN
    assert "closed" in record.error
    with effectq.run(rid, store=store), pytest.raises(effectq.OutcomeUnknown):
        next(stream())
    assert source.runs == 1


def test_breaking_out_of_a_generator_records_unknown(store: effectq.Store) -> None:
    """A for loop that breaks after the first item (the generator closed as it is collected)
    leaves the same truthful record: unknown, the source closed."""
    source = Source()
    stream = source.effect()

    rid = run_id()
    with effectq.run(rid, store=store):
        for _ in stream():
            break
        gc.collect()
        key = stream.key()
    assert source.closed_in == [key]
    assert record_of(store, key).status is Status.UNKNOWN


def test_a_replay_safe_generator_closed_early_runs_again(store: effectq.Store) -> None:
    """Unknown is the truth the effect's options then act on: a replay-safe stream closed
    early runs again, whole, on the next call."""
    source = Source()
    stream = source.effect(replay_safe=True)

    rid = run_id()
    with effectq.run(rid, store=store):
        items = stream()
        assert next(items) == 1
        items.close()
        assert list(stream()) == [1, 2, 3]
        assert list(stream()) == [3]
    assert source.runs == 2


def test_closing_a_replayed_generator_early_changes_nothing(store: effectq.Store) -> None:
    """A stream that replays its recorded last item may be closed at any point: the record
    stays completed."""
    source = Source()
    stream = source.effect()

    rid = run_id()
    with effectq.run(rid, store=store):
        assert list(stream()) == [1, 2, 3]
        replay = stream()
        assert next(replay) == 3
        replay.close()
        key = stream.key()
    assert record_of(store, key).status is Status.COMPLETED


def test_closing_early_is_unknown_whatever_maybe_applied_says(store: effectq.Store) -> None:
    """A maybe_applied predicate classifies the function's exceptions; a consumer's early
    close is none of them, and stays unknown."""
    source = Source()
    stream = source.effect(maybe_applied=lambda exc: False)

    key = close_after_the_first_item(stream, store)
    assert record_of(store, key).status is Status.UNKNOWN


def test_a_source_whose_cleanup_raises_is_closed_quietly(store: effectq.Store) -> None:
    """A source whose cleanup raises as it is closed: close() still returns, and the record,
    unknown, says what the cleanup raised."""

    @effectq.effect(name="edge.stream")
    def stream() -> Iterator[int]:
        try:
            yield 1
            yield 2
        finally:
            raise ValueError("upstream cleanup failed")

    key = close_after_the_first_item(stream, store)
    record = record_of(store, key)
    assert record.status is Status.UNKNOWN
    assert "upstream cleanup failed" in record.error


def test_aclosing_an_async_generator_early_records_unknown(store: effectq.Store) -> None:
    """aclose() after the first item: the same as close() for a generator."""
    source = Source()
    stream = source.async_effect()
    rid = run_id()

    async def main() -> str:
        async with effectq.run(rid, store=store):
            items = stream()
            assert await items.__anext__() == 1
            await items.aclose()
            return stream.key()

    key = asyncio.run(main())
    assert source.closed_in == [key]
    assert record_of(store, key).status is Status.UNKNOWN

    async def again() -> None:
        async with effectq.run(rid, store=store):
            await stream().__anext__()

    with pytest.raises(effectq.OutcomeUnknown):
        asyncio.run(again())


def test_breaking_out_of_an_async_generator_records_unknown(store: effectq.Store) -> None:
    """An async for loop that breaks: the loop closes the collected generator (aclose), the
    record turns unknown while the loop goes on, and the loop reports no error."""
    source = Source()
    stream = source.async_effect()
    loop_errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context))
        async with effectq.run(run_id(), store=store):
            key = stream.key()
            async for _ in stream():
                break
            gc.collect()
            await until(
                lambda: record_of(store, key).status is not Status.DISPATCHED, "the record settles", 10
            )
            assert record_of(store, key).status is Status.UNKNOWN
            assert source.closed_in == [key]

    asyncio.run(main())
    assert loop_errors == []


# -- an effect calling itself by its own key ---------------------------------------------


def test_an_effect_calling_itself_by_its_key_fails_at_once(store: effectq.Store) -> None:
    """The inner call would wait for the outer one, which waits for it: ReentrantEffectError,
    raised before the inner call writes anything; the outer call goes on."""
    seen: list[BaseException] = []

    @effectq.effect(name="edge.self", key=one_key, wait=3)
    def again(depth: int) -> str:
        if depth == 0:
            try:
                again(1)
            except Exception as exc:
                seen.append(exc)
        return f"done at {depth}"

    rid = run_id()
    with effectq.run(rid, store=store):
        assert again(0) == "done at 0"
        key = again.key(0)
    assert len(seen) == 1 and isinstance(seen[0], effectq.ReentrantEffectError), seen
    assert seen[0].key == key
    assert record_of(store, key).status is Status.COMPLETED


def test_an_effect_reached_again_through_another_fails_at_once(store: effectq.Store) -> None:
    """The same when the call comes back through another effect."""

    @effectq.effect(name="edge.outer", key=one_key, wait=3)
    def outer() -> str:
        return inner()

    @effectq.effect(name="edge.inner", wait=3)
    def inner() -> str:
        return outer()

    with effectq.run(run_id(), store=store), pytest.raises(effectq.ReentrantEffectError):
        outer()


def test_an_async_effect_calling_itself_fails_at_once(store: effectq.Store) -> None:
    """An async effect that awaits itself by its own key: ReentrantEffectError."""

    @effectq.effect(name="edge.aself", key=one_key, wait=3)
    async def again(depth: int) -> int:
        if depth == 0:
            return await again(1)
        return depth

    async def main() -> None:
        async with effectq.run(run_id(), store=store):
            await again(0)

    with pytest.raises(effectq.ReentrantEffectError):
        asyncio.run(main())


def test_a_generator_effect_calling_itself_fails_at_once(store: effectq.Store) -> None:
    """A generator effect whose source iterates the same key: ReentrantEffectError."""

    @effectq.effect(name="edge.gself", key=one_key, wait=3)
    def stream(depth: int) -> Iterator[int]:
        yield depth
        if depth == 0:
            yield from stream(1)

    with effectq.run(run_id(), store=store), pytest.raises(effectq.ReentrantEffectError):
        list(stream(0))
