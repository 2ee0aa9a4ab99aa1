"""effectq.dramatiq on Dramatiq's StubBroker: run binding, business keys, whole-actor effects, outcomes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import AsyncIO
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend

import effectq
from effectq.dramatiq import EffectMiddleware
from effectq.store.base import Status


class Rig:
    def __init__(self, store: effectq.Store, *extra: Any) -> None:
        self.broker = StubBroker()
        for middleware in extra:
            self.broker.add_middleware(middleware)
        self.middleware = EffectMiddleware(store)
        self.broker.add_middleware(self.middleware)
        self.worker = dramatiq.Worker(self.broker, worker_timeout=50, worker_threads=2)

    def actor(self, **options: Any) -> Any:
        return dramatiq.actor(broker=self.broker, **{"max_retries": 0, **options})

    def process(self, *messages: Any) -> None:
        for message in messages:
            self.broker.enqueue(message)
        self.broker.join("default", fail_fast=False)
        self.worker.join()


@pytest.fixture
def rig(store: effectq.Store) -> Iterator[Rig]:
    made = Rig(store)
    made.worker.start()
    yield made
    made.worker.stop()


@pytest.fixture
def charged() -> list[int]:
    return []


@pytest.fixture
def charge(charged: list[int]) -> Any:
    @effectq.effect(name="charge")
    def charge(amount: int) -> int:
        charged.append(amount)
        return amount

    return charge


def test_run_is_the_message_id(rig: Rig, charge: Any, charged: list[int]) -> None:
    """A redelivered message (same message id) replays its effect; another message applies its own."""
    runs: list[str] = []

    @rig.actor()
    def fulfil(amount: int) -> None:
        runs.append(effectq.current_run().id)
        charge(amount)

    first = fulfil.message(5)
    rig.process(first, first, fulfil.message(5))
    assert charged == [5, 5]
    assert runs.count(first.message_id) == 2
    assert len(set(runs)) == 2


def test_business_key(rig: Rig, charge: Any, charged: list[int]) -> None:
    """effectq_run_id: two messages of one order apply the effect once."""

    @rig.actor(effectq_run_id="order:{order_id}")
    def fulfil(order_id: int) -> None:
        assert effectq.current_run().id == f"order:{order_id}"
        charge(1)

    rig.process(fulfil.message(9), fulfil.message(9))
    assert charged == [1]


def test_whole_actor_effect_skips_a_completed_message(rig: Rig, charged: list[int]) -> None:
    """effectq_task=True: a redelivered message whose actor completed is skipped; the body does not run."""

    @rig.actor(effectq_task=True)
    def report(n: int) -> None:
        charged.append(n)

    message = report.message(3)
    rig.process(message, message)
    assert charged == [3]


def test_whole_actor_effect_replays_its_value_for_results(store: effectq.Store) -> None:
    """With the Results middleware, a completed whole-actor effect returns its recorded value again."""
    backend = StubBackend()
    made = Rig(store, Results(backend=backend))
    bodies: list[int] = []

    @made.actor(effectq_task=True, store_results=True)
    def quote(n: int) -> dict[str, int]:
        bodies.append(n)
        return {"n": n, "body": len(bodies)}

    made.worker.start()
    try:
        message = quote.message(4)
        made.process(message)
        assert backend.get_result(message, block=True, timeout=5000) == {"n": 4, "body": 1}
        made.process(message)
        assert backend.get_result(message, block=True, timeout=5000) == {"n": 4, "body": 1}
    finally:
        made.worker.stop()
    assert bodies == [4]


def test_store_failure_stops_the_message(store: effectq.Store) -> None:
    """A store that fails while binding raises a MiddlewareError: the actor never runs unguarded."""

    class Broken(effectq.MemoryStore):
        def get(self, key: str) -> Any:
            raise effectq.StoreError("redis is down")

    made = Rig(Broken(namespace="broken"))
    ran: list[int] = []

    @made.actor(effectq_task=True)
    def report() -> None:
        ran.append(1)

    made.worker.start()
    try:
        made.process(report.message())
    finally:
        made.worker.stop()
    assert ran == []
    (dead,) = made.broker.dead_letters
    assert "RunNotBoundError" in dead.options["traceback"]
    assert "redis is down" in dead.options["traceback"]
    assert dead.options.get("retries") == 1


def test_outcome_unknown_fails_without_retries(store: effectq.Store) -> None:
    """OutcomeUnknown fails the message at once (dead-lettered), even with retries left."""
    made = Rig(store)
    bodies: list[int] = []

    @effectq.effect(name="wire")
    def wire() -> None:
        raise TimeoutError("no answer")

    @made.actor(max_retries=5, min_backoff=1, max_backoff=2)
    def pay() -> None:
        bodies.append(1)
        wire()

    made.worker.start()
    try:
        made.process(pay.message())
    finally:
        made.worker.stop()
    # the timeout marked it unknown; the retry met the unknown outcome and stopped
    assert bodies == [1, 1]
    assert len(made.broker.dead_letters) == 1


def test_time_limit_inside_an_effect_means_maybe_applied(store: effectq.Store) -> None:
    """Dramatiq's TimeLimitExceeded landing inside an effect records it as unknown, never as released."""
    made = Rig(store)

    @effectq.effect(name="slow")
    def slow() -> None:
        for _ in range(1000):  # short sleeps: the interrupt lands between bytecodes
            time.sleep(0.01)

    keys: list[str] = []

    @made.actor(time_limit=200)
    def job() -> None:
        keys.append(slow.key())
        slow()

    made.broker.emit_after("process_boot")  # starts TimeLimit's timer thread
    made.worker.start()
    try:
        made.process(job.message())
    finally:
        made.worker.stop()
    record = store.get(keys[0])
    assert record is not None
    assert record.status is Status.UNKNOWN
    assert "TimeLimitExceeded" in record.error


def test_async_actor_sees_its_run(store: effectq.Store, charged: list[int]) -> None:
    """An async actor (AsyncIO middleware) runs inside its message's run; a redelivery replays."""
    made = Rig(store, AsyncIO())
    runs: list[str] = []

    @effectq.effect(name="charge_async")
    async def charge_async(amount: int) -> int:
        charged.append(amount)
        return amount

    @made.actor()
    async def fulfil(amount: int) -> None:
        runs.append(effectq.current_run().id)
        await charge_async(amount)

    made.broker.emit_after("process_boot")
    made.worker.start()
    try:
        message = fulfil.message(2)
        made.process(message, message)
    finally:
        made.worker.stop()
        made.broker.emit_before("process_stop")
    assert charged == [2]
    assert runs == [message.message_id, message.message_id]


def test_no_run_leaks_after_a_message(rig: Rig) -> None:
    """After a message, its worker thread has no run bound; the next message binds its own."""
    seen: list[str | None] = []

    @rig.actor()
    def probe() -> None:
        seen.append(effectq.current_run().id)

    messages = [probe.message() for _ in range(4)]
    rig.process(*messages)
    assert sorted(seen) == sorted(m.message_id for m in messages)


def test_a_worker_shutting_down_tries_pending_writes_once_more(
    redis_store: effectq.RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A forked worker process ends without atexit: the worker's shutdown tries the writes the
    heartbeat still retries, and logs each that does not land with what to do."""
    from effectq._runtime.leases import heartbeat

    rig = Rig(redis_store)
    rig.worker.start()

    def down() -> None:
        raise ConnectionError("Redis is still down")

    heartbeat.defer(down, "complete of r:send:1", store=redis_store, advice="Settle it with effectq resolve.")
    with caplog.at_level("ERROR", logger="effectq.repair"):
        rig.worker.stop()
    assert heartbeat.pending()[1] == 0
    assert "complete of r:send:1 never landed before the worker shut down" in caplog.text
    assert "Settle it with effectq resolve." in caplog.text


def test_an_actor_sees_how_each_effect_came(rig: Rig, charge: Any, charged: list[int]) -> None:
    """Inside an actor, call_with_outcome says executed on the first delivery, replayed on the next."""
    seen: list[tuple[int, str, str]] = []

    @rig.actor()
    def fulfil(amount: int) -> None:
        done = charge.call_with_outcome(amount)
        seen.append((done.value, done.kind.value, done.key))

    message = fulfil.message(4)
    rig.process(message)
    rig.process(message)  # one after the other (together, the second would wait for the first)
    assert charged == [4]
    assert [(value, kind) for value, kind, _ in seen] == [(4, "executed"), (4, "replayed")]
    assert seen[0][2] == seen[1][2]
    assert seen[0][2].startswith(f"{message.message_id}:charge:")


class _Declined(Exception):
    """Not applied: released, so the next attempt runs the effect again."""


def test_a_parked_key_fails_the_message_without_retries(
    store: effectq.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A key parked after its attempts only raises AttemptsExhausted again: the message is failed
    at once (dead-lettered), even with retries left, and the log names the key and the reset."""
    made = Rig(store)
    bodies: list[int] = []

    @effectq.effect(name="wire", max_attempts=1)
    def wire() -> None:
        raise _Declined("the bank refused")

    @made.actor(max_retries=5, min_backoff=1, max_backoff=2)
    def pay() -> None:
        bodies.append(1)
        wire()

    made.worker.start()
    try:
        made.process(pay.message())
    finally:
        made.worker.stop()
    # the first attempt parked the key; the retry met it and stopped
    assert bodies == [1, 1]
    assert len(made.broker.dead_letters) == 1
    stopped = [r.getMessage() for r in caplog.records if r.name.startswith("effectq.dramatiq")]
    assert any("parked" in line and ":wire:" in line and "--not-applied" in line for line in stopped), stopped
