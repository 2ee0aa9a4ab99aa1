"""An exception a signal handler raises into an effect means "maybe applied", whatever its type.

A signal lands wherever the effect happens to be, after its side effect as well as
before it: Celery's cold shutdown of a solo worker (SIGQUIT) raises
``NotImplementedError`` from its handler into the running task, a timeout built on
``SIGALRM`` raises the exception its author chose. Released, such an effect would
apply again on the next call. The unit tests deliver real signals (SIGUSR1 from
another thread, so the handler runs while the effect sleeps); the last test sends
SIGQUIT to a real solo Celery worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import effectq
from effectq.admin import list_records
from effectq.chaos.workload import WorkloadConfig
from effectq.options import raised_by_signal_handler
from effectq.store.operators import Standing
from effectq.testing.ledger import Ledger
from effectq.testing.workers import Producer, WorkerProcess, wait_until


class Interrupted(Exception):
    """An ordinary exception type: raised synchronously it means "not applied"."""


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


class Signaller:
    """Sends SIGUSR1 to the main thread (where Python runs signal handlers and the effect
    sleeps) once the effect says its side effect is done."""

    def __init__(self) -> None:
        self._main = threading.main_thread().ident
        self.applied = threading.Event()
        self.count = 0
        self._thread = threading.Thread(target=self._send, daemon=True)
        self._thread.start()

    def apply(self) -> None:
        """The side effect: counted; after the first, the signal comes while the effect sleeps."""
        self.count += 1
        if self.count == 1:
            self.applied.set()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the signal lands here (short sleeps: none is missed)
                time.sleep(0.01)

    def _send(self) -> None:
        if self.applied.wait(30):
            assert self._main is not None
            signal.pthread_kill(self._main, signal.SIGUSR1)

    def join(self) -> None:
        self.applied.set()
        self._thread.join(30)


@pytest.fixture
def handler() -> Iterator[Callable[[Callable[..., Any]], None]]:
    """Install a SIGUSR1 handler for the test; the previous one is restored afterwards."""
    previous = signal.getsignal(signal.SIGUSR1)

    def install(fn: Callable[..., Any]) -> None:
        signal.signal(signal.SIGUSR1, fn)

    yield install
    signal.signal(signal.SIGUSR1, previous)


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(f"signal {signum}")


def test_exception_from_a_signal_handler_is_maybe_applied(
    store: effectq.Store, handler: Callable[[Callable[..., Any]], None]
) -> None:
    """A handler that raises an ordinary Exception into an effect after its side effect: the record
    is unknown, and the next call raises OutcomeUnknown instead of applying the effect again."""
    handler(_raise_interrupted)
    signaller = Signaller()

    @effectq.effect(name="cold.charge")
    def charge(order: int) -> str:
        signaller.apply()
        return "charged"

    with effectq.run(run_id(), store=store):
        with pytest.raises(Interrupted):
            charge(1)
        with pytest.raises(effectq.OutcomeUnknown) as info:
            charge(1)
    signaller.join()
    assert signaller.count == 1
    assert "Interrupted" in info.value.reason
    record = store.get(info.value.key)
    assert record is not None and record.status is effectq.Status.UNKNOWN


def test_handler_removed_before_the_exception_escapes(
    store: effectq.Store, handler: Callable[[Callable[..., Any]], None]
) -> None:
    """A one-shot timeout inside the effect, its handler restored in a ``finally`` before the
    exception leaves the effect: still maybe applied."""
    signaller = Signaller()

    @effectq.effect(name="cold.timed")
    def timed(order: int) -> str:
        previous = signal.signal(signal.SIGUSR1, _raise_interrupted)
        try:
            signaller.apply()
        finally:
            signal.signal(signal.SIGUSR1, previous)
        return "sent"

    with effectq.run(run_id(), store=store):
        with pytest.raises(Interrupted):
            timed(1)
        with pytest.raises(effectq.OutcomeUnknown):
            timed(1)
    signaller.join()
    assert signaller.count == 1


def test_exception_chained_to_one_from_a_signal_handler(
    store: effectq.Store, handler: Callable[[Callable[..., Any]], None]
) -> None:
    """An effect that catches what a handler raised and raises its own exception from it: maybe applied."""

    class ClientError(Exception):
        pass

    class Shutdown:  # a handler that is a bound method, calling on into the code that raises
        def __call__(self, signum: int, frame: Any) -> None:
            self.stop()

        def stop(self) -> None:
            raise NotImplementedError("this pool cannot terminate a job")

    handler(Shutdown())
    signaller = Signaller()

    @effectq.effect(name="cold.wrapped")
    def wrapped(order: int) -> str:
        try:
            signaller.apply()
        except NotImplementedError as exc:
            raise ClientError("request aborted") from exc
        return "done"

    with effectq.run(run_id(), store=store):
        with pytest.raises(ClientError):
            wrapped(1)
        with pytest.raises(effectq.OutcomeUnknown):
            wrapped(1)
    signaller.join()
    assert signaller.count == 1


def test_same_exception_raised_by_the_effect_itself_is_released(
    store: effectq.Store, handler: Callable[[Callable[..., Any]], None]
) -> None:
    """With a handler installed that never fires, the same exception type raised by the effect
    means "not applied": released, and the next call runs the effect."""
    handler(_raise_interrupted)
    calls: list[int] = []

    @effectq.effect(name="cold.plain")
    def plain(order: int) -> str:
        calls.append(order)
        if len(calls) == 1:
            raise Interrupted("refused before anything was sent")
        return "sent"

    with effectq.run(run_id(), store=store):
        with pytest.raises(Interrupted):
            plain(1)
        assert plain(1) == "sent"
    assert calls == [1, 1]


def test_a_predicate_decides_alone_and_can_ask(
    store: effectq.Store, handler: Callable[[Callable[..., Any]], None]
) -> None:
    """A ``maybe_applied`` predicate has the last word; ``raised_by_signal_handler`` tells it
    whether a signal handler raised the exception."""
    handler(_raise_interrupted)
    seen: list[bool] = []

    def predicate(exc: BaseException) -> bool:
        seen.append(raised_by_signal_handler(exc))
        return False

    signaller = Signaller()

    @effectq.effect(name="cold.predicate", maybe_applied=predicate)
    def decided(order: int) -> str:
        signaller.apply()
        return "done"

    with effectq.run(run_id(), store=store), pytest.raises(Interrupted):
        decided(1)
    signaller.join()
    assert seen == [True]
    assert raised_by_signal_handler(Interrupted("raised here")) is False


# -- a real solo Celery worker, stopped cold -------------------------------------------------

AMQP_URL = os.environ.get("EFFECTQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("broker", "again"), [("rabbitmq", "autoretry"), ("redis", "sent-again")], ids=["rabbitmq", "redis"]
)
def test_cold_shutdown_of_a_solo_worker_does_not_repeat_the_effect(
    redis_url: str, tmp_path: Path, broker: str, again: str
) -> None:
    """SIGQUIT to a solo worker while its effect runs after the side effect: Celery's handler raises
    NotImplementedError into the task. The record is unknown, and the next execution of the task
    (Celery's autoretry, or the task sent again under the same run id) stops at OutcomeUnknown
    instead of applying the effect a second time."""
    config = WorkloadConfig(
        kind="celery",
        broker=AMQP_URL if broker == "rabbitmq" else redis_url,
        store=redis_url,
        ledger=redis_url,
        name=f"cs{uuid.uuid4().hex[:10]}",
        module="tests.support.cold_shutdown_app",
        keyed_by="business" if again == "sent-again" else "task",
        visibility=3.0,
    )
    ledger = Ledger.from_url(redis_url, config.name)
    producer = Producer(config)
    first = WorkerProcess(config, "first", log_dir=tmp_path, pool="solo")
    second = WorkerProcess(config, "second", log_dir=tmp_path, pool="solo")
    try:
        producer.send(1, 1)
        first.start()
        _wait(lambda: ledger.events("applied"), first, "the side effect")
        assert first.pid is not None and first.process is not None
        os.kill(first.pid, signal.SIGQUIT)
        first.process.wait(timeout=60)
        assert "NotImplementedError" in first.log_tail(200)  # what the solo pool raised into the task
        store = effectq.RedisStore.from_url(redis_url, namespace=config.name)
        try:
            (entry,) = list_records(store, standings=set(Standing), name="cold.charge")
            assert entry.record.status is effectq.Status.UNKNOWN, entry.record
            if again == "sent-again":
                producer.send(1, 1)
            second.start()
            _wait(lambda: ledger.events("unknown") or ledger.events("done"), second, "the next execution")
            assert ledger.counts() == {"charge:1": 1}
            assert ledger.events("unknown") and not ledger.events("done")
            (entry,) = list_records(store, standings=set(Standing), name="cold.charge")
            assert entry.record.status is effectq.Status.UNKNOWN
        finally:
            store.close()
    finally:
        first.stop()
        second.stop()
        producer.cleanup()


def _wait(condition: Callable[[], Any], worker: WorkerProcess, what: str) -> None:
    try:
        wait_until(condition, timeout=120, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log_tail(80)}") from None
