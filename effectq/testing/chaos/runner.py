"""The chaos run: real workers, faulted, and a ledger that counts every application.

One run (:func:`run_chaos`) starts ``workers`` real worker processes of one
configuration (Celery or Dramatiq, Redis or RabbitMQ broker), enqueues ``tasks``
tasks of ``effects`` effects each, and until every task has finished faults the
workers: SIGKILLs (of a worker, or of one pool child), warm and cold shutdowns,
SIGSTOPs past the lease, the store's Redis restarted or frozen, the broker
connections cut, faults the workers inject into themselves, plus what the
broker does on its own (a visibility timeout shorter than a task). Then it reads
the ledger and reports (:class:`Report`). The named scenarios
(:mod:`effectq.testing.chaos.scenarios`) are presets of these options.

Its parts: :mod:`~effectq.testing.chaos.options` (what a run does),
:mod:`~effectq.testing.chaos.torment` (the fault loop), :mod:`~effectq.testing.chaos.report`
(what it found), :mod:`~effectq.testing.chaos.reach` (whether the servers answer).
"""

from __future__ import annotations

import contextlib
import logging
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..ledger import Ledger, verdict
from ..workers import Producer, WorkerProcess
from .config import WorkloadConfig
from .options import AMQP_URL as AMQP_URL  # importable from here too
from .options import CONFIGURATIONS, SIZE_TIMEOUTS, SIZES, Options
from .options import KILL_WITH as KILL_WITH
from .options import REDIS_URL as REDIS_URL
from .options import STALL as STALL
from .options import TIMEOUT as TIMEOUT
from .proxy import Proxy
from .reach import Unreachable, answering, reachable
from .redis_server import RedisServer
from .report import Report
from .torment import CALM_AFTER as CALM_AFTER
from .torment import Chaos
from .user import Send, UserProducer, load

__all__ = [
    "CONFIGURATIONS",
    "SIZES",
    "SIZE_TIMEOUTS",
    "Options",
    "Report",
    "Unreachable",
    "run_chaos",
]

log = logging.getLogger("effectq.chaos")


def run_chaos(options: Options, progress: Callable[[str], None] | None = None) -> Report:
    """Run the chaos and report. Everything started is stopped, everything created deleted.

    Raises:
        Unreachable: Redis or the broker did not answer (before the run, or while it ran).
    """
    target = load(options.app) if options.app else None
    queue_kind, broker_kind = CONFIGURATIONS[target.configuration if target else options.configuration]
    broker_url = options.redis_url if broker_kind == "redis" else options.amqp_url
    if target is not None and target.kind == "celery":
        broker_url = str(target.obj.conf.broker_url)
    reachable(options.redis_url, "Redis (the ledger and store)")
    if broker_url != options.redis_url:
        reachable(broker_url, "the RabbitMQ broker")
    rng = random.Random(options.seed)
    name = f"chaos{uuid.uuid4().hex[:10]}"
    log_dir = Path(options.log_dir or tempfile.mkdtemp(prefix="effectq-chaos-"))
    report = Report(options, logs=str(log_dir))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        store_url = options.redis_url
        server: RedisServer | None = None
        if options.own_store:
            server = RedisServer(log_dir / "store-redis", persistent=options.persistence)
            server.start()
            stack.callback(server.stop)
            store_url = server.url
        if options.redis_restart:
            report.warnings = _restart_findings(store_url)
            for warning in report.warnings:
                (progress or log.warning)(f"effectq chaos: warning: {warning}")
        config = WorkloadConfig(
            kind=queue_kind,
            broker=broker_url,
            store=store_url,
            ledger=options.redis_url,
            name=name,
            effectq="on" if options.effectq else "off",
            lease=options.lease,
            visibility=options.broker_visibility,
            faults=options.faults,
            module=options.workload,
            keyed_by="business",  # a task the broker lost is sent again under a new id: same run
            slow=options.slow,
            inside=options.inside,
            retry=options.retry,
            late=options.late,
            time_limit=options.time_limit,
            chord=options.chord,
            app=options.app,
            reads=int(options.reads),
            reads_timeout=options.reads_timeout,
        )
        producer: Producer | UserProducer
        with answering(broker_url, "the broker"):
            if target is not None:
                config = replace(config, module="effectq.testing.chaos.user")
                producer = UserProducer(config, target, [Send(t) for t in options.send])
                config = replace(config, queue_name=producer.queues() if target.kind == "dramatiq" else "")
            else:
                producer = Producer(config)
        stack.callback(_cleanup, producer)
        proxy: Proxy | None = None
        worker_config = config
        if options.cut:
            proxy, proxied = Proxy.for_url(broker_url)
            stack.callback(proxy.close)
            worker_config = replace(config, broker=proxied)
        ledger = Ledger.from_url(options.redis_url, name)
        chaos = Chaos(options, rng, ledger, producer, report, started, server, proxy, progress)
        with answering(broker_url, "the broker"):
            if options.chord and isinstance(producer, Producer):
                for c in range(options.chords):
                    header = list(range(c * options.chord, min(options.tasks, (c + 1) * options.chord)))
                    group = producer.send_chord(
                        header, options.tasks + c, options.effects, pause=options.pause
                    )
                    chaos.groups[options.tasks + c] = (group, header)
            else:
                for task_no in range(options.tasks):
                    chaos.send(task_no, countdown=options.countdown)
        store_proxies: dict[str, Proxy] = {}
        if options.partition:
            for i in range(options.workers):
                store_proxies[f"w{i}"], _ = Proxy.for_url(store_url)
                stack.callback(store_proxies[f"w{i}"].close)
        chaos.store_proxies = store_proxies
        workers = [
            WorkerProcess(
                _through(worker_config, store_proxies.get(f"w{i}")),
                f"w{i}",
                log_dir=log_dir,
                pool=options.pool_of(i),
                concurrency=options.concurrency,
            )
            for i in range(options.workers)
        ]
        idle: list[WorkerProcess] = [
            _IdleWorker(worker_config, f"idle{i}", log_dir=log_dir)
            for i in range(options.idle_workers if queue_kind == "celery" else 0)
        ]
        stack.callback(_stop_all, [*workers, *idle])
        for worker in [*workers, *idle]:
            worker.start()
        try:
            chaos.torment(workers, idle)
        except Unreachable:  # nothing left to prove: no graceful stop that waits on a dead server
            for worker in [*workers, *idle]:
                worker.kill()
            raise
        report.elapsed = time.monotonic() - started
        with answering(options.redis_url, "Redis (the ledger)"):
            expected = options.identities() or sorted(ledger.counts())  # yours: what effectq ran
            report.expected = len(expected)
            report.verdict = verdict(ledger, expected)
            if report.verdict.duplicates and options.effectq:
                twice = report.verdict.duplicates
                report.evidence = [a for a in ledger.applications() if a.identity in twice][:30]
        report.tail = {w.name: w.log_tail(30) for w in workers}
        if server is not None:
            report.store_restarts = server.restarts
        if proxy is not None:
            report.cuts = proxy.cuts
    return report


def _restart_findings(url: str) -> list[str]:
    """What ``effectq doctor``'s persistence check finds on the store's Redis the run will restart."""
    import redis

    from ...doctor import Level, check_persistence, examine, nodes

    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        return [
            f"the store's Redis {f.node} is restarted during this run: {f.summary}"
            for node in nodes(client)
            for f in examine(node, (check_persistence,))
            if f.level is not Level.OK
        ]
    finally:
        client.close()


def _through(config: WorkloadConfig, proxy: Proxy | None) -> WorkloadConfig:
    """``config`` with the store reached through ``proxy`` (when there is one)."""
    if proxy is None:
        return config
    return replace(config, store=f"redis://127.0.0.1:{proxy.port}/0")


class _IdleWorker(WorkerProcess):
    """A Celery worker consuming a queue nobody sends to: its loop restores unacked messages."""

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("-Q") + 1] = f"{self.config.queue}-idle"
        return command


def _stop_all(workers: list[WorkerProcess]) -> None:
    """SIGKILL every worker's process group: the verdict is in, nothing is left to finish (a warm
    shutdown would wait for whatever a worker still runs: a copy, a retry, a resent task)."""
    for worker in workers:
        worker.kill()


def _cleanup(producer: Producer | UserProducer) -> None:
    try:
        producer.cleanup()
    except Exception as exc:  # a broker gone away: its queues stay, the report still stands
        log.warning("effectq chaos could not delete this run's queues and keys: %s", exc)
