"""What Celery and Dramatiq workers check when they start: an evicting Redis, retries beyond retention.

The eviction tests start redis-server processes of their own on free ports (with the
``maxmemory-policy`` under test) and stop them; the shared Redis is never reconfigured.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from celery import Celery, signals
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Retries

import effectq
import effectq.celery
import effectq.dramatiq
from effectq.chaos.workload import WorkloadConfig
from effectq.dramatiq import EffectMiddleware
from effectq.testing.workers import Producer, WorkerProcess, wait_until
from tests.conftest import REDIS_URL
from tests.support.servers import Server, stop_all

needs_redis_server = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

Start = Callable[[str], str]
"""Starts a redis-server with a ``maxmemory-policy``; returns its URL."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Start]:
    """A redis-server of the test's own, with the given ``maxmemory-policy``; stopped afterwards."""
    started: list[Server] = []

    def start(policy: str) -> str:
        started.append(Server(tmp_path, "--maxmemory", "64mb", "--maxmemory-policy", policy).start())
        return f"redis://{started[-1].address}/0"

    yield start
    stop_all(started)


class _Worker:
    """What Celery's worker_init sends: the worker, whose ``app`` is the app (``pool_cls``: its ``-P``)."""

    def __init__(self, app: Celery, pool_cls: Any = "solo") -> None:
        self.app = app
        self.pool_cls = pool_cls


def _celery_app() -> Celery:
    app = Celery("startup", broker="memory://", set_as_current=False)
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True, task_time_limit=600)

    @app.task(shared=False, max_retries=3, default_retry_delay=60)
    def fine() -> None: ...

    return app


# -- eviction ------------------------------------------------------------------------------


@needs_redis_server
def test_celery_worker_start_warns_of_an_evicting_redis(
    server: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker of an app installed on a Redis with allkeys-lru logs, when it starts, the doctor's
    finding: the policy, what eviction does to records, and the fix."""
    url = server("allkeys-lru")
    app = _celery_app()
    installation = effectq.celery.install(app, url, namespace=f"t{uuid.uuid4().hex[:8]}")
    try:
        with caplog.at_level(logging.WARNING, logger="effectq.celery.check"):
            signals.worker_init.send(sender=_Worker(app))
    finally:
        installation.uninstall()
    (warning,) = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert "allkeys-lru" in warning and "applies again" in warning
    assert "CONFIG SET maxmemory-policy noeviction" in warning
    assert url.removeprefix("redis://").removesuffix("/0") in warning  # which server


@needs_redis_server
def test_celery_check_reads_the_store_policy(server: Start) -> None:
    """check(app, store=...) adds the eviction finding of an evicting Redis, and nothing for noeviction."""
    app = _celery_app()
    evicting = effectq.RedisStore.from_url(server("volatile-lru"), namespace="t")
    safe = effectq.RedisStore.from_url(server("noeviction"), namespace="t")
    try:
        (problem,) = effectq.celery.check(app, store=evicting)
        assert "maxmemory-policy volatile-lru" in problem
        assert effectq.celery.check(app, store=safe) == []
        assert effectq.celery.check(app, store=effectq.MemoryStore()) == []
    finally:
        for store in (evicting, safe):
            store.close()
            store.client.close()


@needs_redis_server
def test_dramatiq_worker_boot_warns_of_an_evicting_redis(
    server: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """A Dramatiq worker booting with EffectMiddleware on a Redis with allkeys-lru logs the
    doctor's finding."""
    url = server("allkeys-lru")
    broker = StubBroker()
    broker.add_middleware(EffectMiddleware(url, namespace=f"t{uuid.uuid4().hex[:8]}"))
    worker = dramatiq.Worker(broker, worker_threads=1)
    with caplog.at_level(logging.WARNING, logger="effectq.dramatiq"):
        worker.start()
    worker.stop()
    (warning,) = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert "allkeys-lru" in warning and "CONFIG SET maxmemory-policy noeviction" in warning


@needs_redis_server
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["celery", "dramatiq"])
def test_real_worker_logs_the_eviction_warning(
    server: Start, redis_url: str, tmp_path: Path, kind: str
) -> None:
    """A real worker process (Celery solo, Dramatiq) whose store evicts says so in its log at start."""
    config = WorkloadConfig(
        kind=kind,
        broker=redis_url,
        store=server("allkeys-lru"),
        ledger=REDIS_URL,
        name=f"su{uuid.uuid4().hex[:10]}",
    )
    _logs_at_start(WorkerProcess(config, "w0", log_dir=tmp_path), "maxmemory-policy allkeys-lru")


def _logs_at_start(worker: WorkerProcess, text: str) -> None:
    """Start the real worker and wait until its log says ``text``; stop it and delete what it made."""
    producer = Producer(worker.config)
    try:
        worker.start()
        try:
            wait_until(lambda: text in worker.log_tail(400), timeout=120, what=repr(text))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log_tail(60)}") from None
    finally:
        worker.stop()
        producer.cleanup()


# -- a green pool on the Redis broker ------------------------------------------------------------


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_pool_on_the_redis_broker_is_named_at_worker_start(
    pool: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A gevent or eventlet worker on the Redis broker is warned, when it starts, that it never restores
    unacked messages (kombu does that from an event loop those pools do not run); RabbitMQ, SQS (whose
    server makes an unacked message visible again) and the other pools are not."""
    app = _celery_app()
    app.conf.broker_url = "redis://127.0.0.1:6379/0"
    app.conf.broker_transport_options = {"visibility_timeout": 1200}
    installation = effectq.celery.install(app, effectq.MemoryStore())
    try:
        with caplog.at_level(logging.WARNING, logger="effectq.celery.check"):
            signals.worker_init.send(sender=_Worker(app, pool))
            signals.worker_init.send(sender=_Worker(app, "prefork"))
    finally:
        installation.uninstall()
    (warning,) = [r.getMessage() for r in caplog.records if "restores unacked" in r.getMessage()]
    assert f"the {pool} pool runs no event loop" in warning and "never restores them" in warning
    assert effectq.celery.check(app, pool="celery.concurrency.gevent:TaskPool") != effectq.celery.check(app)
    for url in ("amqp://guest:guest@127.0.0.1:5672//", "sqs://"):  # SQS makes messages visible itself
        app.conf.broker_url = url
        assert not [p for p in effectq.celery.check(app, pool=pool) if "restores unacked" in p], url


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_real_gevent_worker_on_the_redis_broker_logs_the_restore_trap(redis_url: str, tmp_path: Path) -> None:
    """A real ``celery worker -P gevent`` on the Redis broker says in its log at start that it never
    restores unacked messages."""
    pytest.importorskip("gevent")
    config = WorkloadConfig(
        kind="celery", broker=redis_url, store=redis_url, ledger=REDIS_URL, name=f"su{uuid.uuid4().hex[:10]}"
    )
    worker = WorkerProcess(config, "w0", log_dir=tmp_path, pool="gevent", concurrency=2)
    _logs_at_start(worker, "the gevent pool runs no event loop")


# -- Dramatiq's retries against the retention ---------------------------------------------------


def _broker(*middleware: Any, **retries: Any) -> StubBroker:
    broker = StubBroker(middleware=[Retries(**retries), *middleware])
    broker.add_middleware(EffectMiddleware(effectq.MemoryStore()))
    return broker


def test_dramatiq_retries_beyond_the_retention_are_named() -> None:
    """With Dramatiq's default Retries (20 retries, backoff up to 7 days) a message may be retried
    for weeks: check names every actor that may retry after the effects' records expired."""
    broker = _broker()

    @dramatiq.actor(broker=broker)
    def by_default() -> None: ...

    @dramatiq.actor(broker=broker, max_retries=3, max_backoff=60_000)
    def bounded() -> None: ...

    @dramatiq.actor(broker=broker, max_retries=5, min_backoff=86_400_000, max_backoff=2 * 86_400_000)
    def long_backoff() -> None: ...

    (problem,) = effectq.dramatiq.check(broker, retention=timedelta(days=7))
    assert problem.startswith("by_default, long_backoff may retry later than the effect retention (7 days)")
    assert "for up to 46.4 days" in problem and "max_backoff=604800000ms" in problem
    (problem,) = effectq.dramatiq.check(broker, retention=timedelta(days=30))  # long_backoff: 10 days
    assert problem.startswith("by_default may retry later than the effect retention (30 days)")
    assert effectq.dramatiq.check(broker, retention=timedelta(days=365)) == []


def test_dramatiq_retry_when_and_unbounded_retries_never_end() -> None:
    """retry_when (it decides, not max_retries) or max_retries=None: retried without end."""
    broker = _broker(max_retries=None)

    @dramatiq.actor(broker=broker)
    def forever() -> None: ...

    (problem,) = effectq.dramatiq.check(broker, retention=timedelta(days=365))
    assert "forever may retry" in problem and "without end" in problem

    broker = _broker(retry_when=lambda retries, exc: retries < 2)

    @dramatiq.actor(broker=broker)
    def predicate() -> None: ...

    assert "without end" in " ".join(effectq.dramatiq.check(broker, retention=timedelta(days=365)))


def test_dramatiq_middleware_takes_the_retention_it_checks(caplog: pytest.LogCaptureFixture) -> None:
    """EffectMiddleware(retention=...) is what the boot check holds the retries to; nonsense is refused."""
    broker = StubBroker(middleware=[Retries(max_retries=10, max_backoff=3_600_000)])
    broker.add_middleware(EffectMiddleware(effectq.MemoryStore(), retention=timedelta(hours=1)))

    @dramatiq.actor(broker=broker)
    def hourly() -> None: ...

    worker = dramatiq.Worker(broker, worker_threads=1)
    with caplog.at_level(logging.WARNING, logger="effectq.dramatiq"):
        worker.start()
    worker.stop()
    assert "hourly may retry later than the effect retention" in caplog.text
    with pytest.raises(effectq.ConfigurationError):
        EffectMiddleware(effectq.MemoryStore(), retention=-1)


def test_dramatiq_middleware_before_retries_is_named() -> None:
    """EffectMiddleware added before Retries: an unknown outcome would be retried; check says so."""
    broker = StubBroker(middleware=[])
    broker.add_middleware(EffectMiddleware(effectq.MemoryStore()))
    broker.add_middleware(Retries(max_retries=0))
    (problem,) = effectq.dramatiq.check(broker)
    assert "EffectMiddleware is added before Retries" in problem
