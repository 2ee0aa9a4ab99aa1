"""How each Celery pool keeps an effect's lease alive, shown with real workers.

effectq renews leases from one heartbeat thread per process. On the threads pool (and
prefork, solo) it is an OS thread: it renews while an effect computes, since the
interpreter switches threads. Under the gevent and eventlet pools, whose monkey patching
makes threads greenlets, it renews only when the running greenlet yields to the hub: an
effect that sleeps or does I/O keeps its lease; one that holds the CPU past its lease lets
it lapse. Another caller of the key then finds the effect in doubt (``OutcomeUnknown``:
never a second run), and the holder's late completion, under the token nobody took over,
is still recorded.

The workers run :mod:`tests.support.pools_app` on RabbitMQ (a green pool on the Redis broker
never restores a dead worker's messages: see :mod:`effectq.celery.checks`), with a lease of 1 s.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import effectq
from effectq.chaos.workload import WorkloadConfig
from effectq.testing.ledger import Ledger
from effectq.testing.workers import Producer, WorkerProcess, wait_until

AMQP_URL = os.environ.get("EFFECTQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(120)]


class Pool:
    """One real worker of ``pools_app`` on ``pool``, the store it writes to, and its ledger."""

    def __init__(self, redis_url: str, log_dir: Path, pool: str) -> None:
        self.log_dir = log_dir
        self.config = WorkloadConfig(
            kind="celery", broker=AMQP_URL, store=redis_url, ledger=redis_url,
            name=f"pl{uuid.uuid4().hex[:10]}", module="tests.support.pools_app", lease=1.0,
        )  # fmt: skip
        self.ledger = Ledger.from_url(redis_url, self.config.name)
        self.producer = Producer(self.config)  # deletes the queue and the run's keys at the end
        self.sender = Celery("effectq-pools-test", broker=AMQP_URL, set_as_current=False)
        self.worker = WorkerProcess(self.config, "w0", log_dir=log_dir, pool=pool)
        self.store = effectq.RedisStore.from_url(redis_url, namespace=self.config.name)

    def send(self, task_no: int, mode: str) -> str:
        """Send ``pools.hold``; returns the effect's key once it started holding."""
        args = (task_no, mode, self.release_file(task_no))
        self.sender.send_task("pools.hold", args=args, queue=self.config.queue)
        (note,) = self.wait(lambda: [e for e in self.ledger.events("holding") if e["task"] == task_no])
        return str(note["key"])

    def release_file(self, task_no: int) -> str:
        """The file whose creation ends task ``task_no``'s effect."""
        return str(self.log_dir / f"release-{task_no}")

    def release(self, task_no: int) -> dict[str, Any]:
        """End task ``task_no``'s effect; its ``done`` note."""
        Path(self.release_file(task_no)).touch()
        (done,) = self.wait(lambda: [e for e in self.ledger.events("done") if e["task"] == task_no])
        return done  # type: ignore[no-any-return]

    def record(self, key: str) -> effectq.Record:
        record = self.store.get(key)
        assert record is not None
        return record

    def wait(self, condition: Callable[[], Any], what: str = "") -> Any:
        try:
            return wait_until(condition, timeout=60, what=what)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n--- worker log ---\n{self.worker.log_tail(60)}") from None

    def renewed_past_first_lease(self, key: str) -> effectq.Record:
        """Wait until the store's clock is past the lease the claim gave, the record still held."""
        first = self.record(key).lease_expires_at
        assert first is not None

        def renewed() -> effectq.Record | None:
            record = self.record(key)
            now = datetime.now(UTC)
            live = record.status is effectq.Status.DISPATCHED and record.lease_live
            return record if live and now > first else None

        return self.wait(renewed, "a renewed lease")  # type: ignore[no-any-return]

    def close(self) -> None:
        self.worker.kill()  # its tasks are done: no need to wait out a warm shutdown
        self.sender.close()
        self.store.close()
        self.producer.cleanup()


@pytest.fixture
def make_pool(redis_url: str, tmp_path: Path) -> Iterator[Callable[[str], Pool]]:
    made: list[Pool] = []

    def make(pool: str) -> Pool:
        made.append(Pool(redis_url, tmp_path, pool))
        made[-1].worker.start()
        return made[-1]

    yield make
    for pool in made:
        pool.close()


@effectq.effect(name="pools.hold", lease=1.0)
def hold(task_no: int, mode: str, release: str) -> str:
    """The worker's effect, as another caller of the same key calls it: it must never run here."""
    raise AssertionError("a second execution of pools.hold")


@pytest.mark.parametrize("green", ["gevent", "eventlet"])
def test_green_pool_renews_a_yielding_effect_and_lets_a_cpu_bound_one_lapse(
    make_pool: Callable[[str], Pool], green: str
) -> None:
    """gevent or eventlet pool, lease 1 s. An effect that sleeps keeps its lease past the first second.
    One that spins without yielding lets it lapse: another caller meets OutcomeUnknown (the effect does
    not run twice), the holder sees no lost lease, and its late completion lands; later calls replay it."""
    if importlib.util.find_spec(green) is None:  # not imported here: importing eventlet warns
        pytest.skip(f"{green} is not installed")
    pool = make_pool(green)

    io_key = pool.send(1, "io")
    pool.renewed_past_first_lease(io_key)  # the heartbeat greenlet ran while the effect slept
    assert pool.release(1)["value"] == "held:1:io:0"
    assert pool.record(io_key).status is effectq.Status.COMPLETED

    cpu_key = pool.send(2, "cpu")
    token = pool.record(cpu_key).token
    lapsed = pool.wait(lambda: pool.record(cpu_key).in_doubt, "the lease to lapse")
    assert lapsed
    record = pool.record(cpu_key)
    assert (record.status, record.token) == (effectq.Status.DISPATCHED, token)  # nobody renewed it
    with effectq.run("pools:2", store=pool.store):
        with pytest.raises(effectq.OutcomeUnknown) as info:
            hold(2, "cpu", pool.release_file(2))  # another caller: in doubt, neither run again nor waited for
        assert info.value.key == cpu_key
        assert pool.record(cpu_key).status is effectq.Status.UNKNOWN
        # The holder never learns: its heartbeat could not run, and nobody took the key over.
        assert pool.release(2)["value"] == "held:2:cpu:0"
        record = pool.record(cpu_key)
        assert (record.status, record.token) == (effectq.Status.COMPLETED, token)  # the late completion
        assert hold(2, "cpu", pool.release_file(2)) == "held:2:cpu:0"  # replayed
    assert not pool.ledger.events("failed")


@pytest.mark.parametrize("kind", ["threads", "prefork"])
def test_threads_and_prefork_renew_a_cpu_bound_effect(make_pool: Callable[[str], Pool], kind: str) -> None:
    """threads or prefork pool, lease 1 s: the heartbeat is an OS thread (a prefork child's own), so an
    effect spinning on the CPU keeps its lease past the first second and completes under its token."""
    pool = make_pool(kind)
    key = pool.send(1, "cpu")
    token = pool.record(key).token
    pool.renewed_past_first_lease(key)
    assert pool.release(1)["value"] == "held:1:cpu:0"
    record = pool.record(key)
    assert (record.status, record.token) == (effectq.Status.COMPLETED, token)
