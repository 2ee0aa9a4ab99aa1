"""The chaos run: real workers, killed at random, and a ledger that counts every application.

One run (:func:`run_chaos`) starts ``workers`` real worker processes of one
configuration (Celery or Dramatiq, Redis or RabbitMQ broker), enqueues ``tasks``
tasks of ``effects`` effects each, and until every task has finished SIGKILLs a
random worker every few seconds and starts it again, plus the faults asked for:
the store's Redis restarted, a worker SIGSTOPped past its lease and resumed,
the broker connections cut, faults the workers inject into themselves. Then it
reads the ledger and reports (:class:`Report`).
"""

from __future__ import annotations

import contextlib
import logging
import random
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..testing.ledger import Ledger, Verdict, verdict
from ..testing.workers import Producer, WorkerProcess
from .proxy import Proxy
from .redis_server import RedisServer
from .workload import WorkloadConfig

__all__ = ["CONFIGURATIONS", "SIZES", "SIZE_TIMEOUTS", "Options", "Report", "run_chaos"]

log = logging.getLogger("effectq.chaos")

CONFIGURATIONS: dict[str, tuple[str, str]] = {
    "celery-redis": ("celery", "redis"),
    "celery-rabbitmq": ("celery", "rabbitmq"),
    "dramatiq-rabbitmq": ("dramatiq", "rabbitmq"),
    "dramatiq-redis": ("dramatiq", "redis"),
}
"""Configuration name -> (task queue, broker)."""

SIZES: dict[str, dict[str, Any]] = {
    "small": {"tasks": 30, "effects": 5, "workers": 2},
    "ci": {"tasks": 60, "effects": 5, "workers": 2},
    "long": {"tasks": 1000, "effects": 5, "workers": 3},
}
"""Preset sizes: ``small`` (150 effects), ``ci`` (300 effects), ``long`` (5,000 effects)."""
SIZE_TIMEOUTS: dict[str, float] = {"small": 170.0, "ci": 170.0, "long": 1200.0}
"""How long each preset may take (a long run does about three tasks a second on two cores)."""


REDIS_URL = "redis://127.0.0.1:6379/0"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
TIMEOUT = 170.0
STALL = 15.0
"""Seconds without any event after which unfinished tasks are sent again (lost by the broker)."""
CALM_AFTER = 0.6
"""Faults stop after this share of the timeout, so the last tasks can finish."""


@dataclass(frozen=True, slots=True)
class Options:
    """What one chaos run does (``python -m effectq.chaos --help`` explains each).

    Attributes:
        configuration: a key of :data:`CONFIGURATIONS`.
        tasks: how many tasks.
        effects: effects per task.
        workers: worker processes.
        effectq: ``False`` runs the same tasks unguarded (the chaos must bite).
        kill_every: (min, max) seconds between two SIGKILLs; ``None``: no kills.
        redis_restart: restart the store's own redis-server every this many seconds.
        sigstop: SIGSTOP a worker past its lease every this many seconds.
        cut: cut the broker connections every this many seconds.
        faults: faults workers inject into themselves (``"after_effect:0.02:kill"``).
        pause: seconds between two effects of a task (so kills land mid-task).
        lease: the effects' lease, seconds.
        redis_url: the Redis of the ledger (and of the store, unless ``redis_restart``).
        amqp_url: the RabbitMQ broker.
        timeout: give up after this many seconds.
        seed: seeds the choice of victims and moments.
        log_dir: where worker logs go (a temporary directory by default).
        workload: the module the workers run (see :class:`~effectq.chaos.workload.WorkloadConfig`).
    """

    configuration: str = "celery-redis"
    tasks: int = 30
    effects: int = 5
    workers: int = 2
    effectq: bool = True
    kill_every: tuple[float, float] | None = (1.5, 3.5)
    redis_restart: float | None = None
    sigstop: float | None = None
    cut: float | None = None
    faults: str = ""
    pause: float = 0.2
    lease: float = 2.0
    redis_url: str = REDIS_URL
    amqp_url: str = AMQP_URL
    timeout: float = TIMEOUT
    seed: int | None = None
    log_dir: str | None = None
    workload: str = "effectq.chaos.workload"


@dataclass(slots=True)
class Report:
    """What a chaos run did and found.

    Attributes:
        options: the run's options.
        verdict: applications judged against the expected effects.
        kills: SIGKILLs the runner sent.
        deaths: workers that died on their own (an injected kill, a crash) and were restarted.
        pauses: SIGSTOPs past the lease.
        store_restarts: restarts of the store's redis-server.
        cuts: broker connection cuts.
        deliveries: task executions started (a task killed and delivered again counts twice).
        finished: tasks that finished.
        replayed: effects the finishing deliveries replayed from the record.
        reconciled: effects the finishing deliveries found applied by asking the ledger.
        unknown: tasks stopped by an unknown outcome (left for an operator).
        fenced: applications the ledger refused (a resumed holder, fenced out).
        resent: tasks sent again after the run stalled (the broker lost their message).
        elapsed: seconds.
        timed_out: the run gave up before every task finished.
        calmed: when the faults stopped to let the last tasks finish (0: they never had to).
    """

    options: Options
    verdict: Verdict | None = None
    kills: int = 0
    deaths: int = 0
    pauses: int = 0
    store_restarts: int = 0
    cuts: int = 0
    deliveries: int = 0
    finished: int = 0
    replayed: int = 0
    reconciled: int = 0
    unknown: int = 0
    fenced: int = 0
    resent: int = 0
    elapsed: float = 0.0
    timed_out: bool = False
    calmed: float = 0.0
    logs: str = ""
    tail: dict[str, str] = field(default_factory=dict)

    @property
    def redeliveries(self) -> int:
        """Task executions beyond the first of each task."""
        return max(0, self.deliveries - self.finished)

    @property
    def duplicates(self) -> int:
        return self.verdict.extra if self.verdict else 0

    @property
    def missing(self) -> int:
        return len(self.verdict.missing) if self.verdict else 0

    @property
    def bit(self) -> bool:
        """Whether the chaos reached the tasks at all (some task was delivered again)."""
        return self.redeliveries > 0

    @property
    def passed(self) -> bool:
        """With effectq: no duplicate, nothing missing, nothing timed out, and the chaos bit."""
        return not self.timed_out and self.duplicates == 0 and self.missing == 0 and self.bit

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        o = self.options
        return {
            "configuration": o.configuration,
            "effectq": o.effectq,
            "tasks": o.tasks,
            "finished": self.finished,
            "effects": o.tasks * o.effects,
            "kills": self.kills,
            "deaths": self.deaths,
            "pauses": self.pauses,
            "store_restarts": self.store_restarts,
            "cuts": self.cuts,
            "redeliveries": self.redeliveries,
            "applications": self.verdict.applications if self.verdict else 0,
            "duplicates": self.duplicates,
            "missing": self.missing,
            "reconciled": self.reconciled,
            "unknown": self.unknown,
            "replayed": self.replayed,
            "fenced": self.fenced,
            "resent": self.resent,
            "elapsed": round(self.elapsed, 3),
            "timed_out": self.timed_out,
            "conclusion": self.conclusion(),
        }

    def render(self) -> str:
        """The report a person reads at a glance."""
        o = self.options
        faults = [f"kill every {o.kill_every[0]:g}-{o.kill_every[1]:g}s"] if o.kill_every else []
        for name, value in (("store restart every", o.redis_restart), ("SIGSTOP every", o.sigstop),
                            ("connection cut every", o.cut)):  # fmt: skip
            if value:
                faults.append(f"{name} {value:g}s")
        if o.faults:
            faults.append(f"injected {o.faults}")
        rows = [
            (
                "configuration",
                f"{o.configuration}, effectq {'on' if o.effectq else 'OFF'}, {o.workers} workers",
            ),
            ("faults", ", ".join(faults) or "none"),
            ("tasks", f"{o.tasks} ({self.finished} finished)"),
            ("effects", f"{o.tasks * o.effects} ({o.effects} per task)"),
            ("kills", f"{self.kills} SIGKILL, {self.deaths} died on their own"),
            (
                "other faults",
                f"{self.pauses} SIGSTOP, {self.store_restarts} store restarts, {self.cuts} cuts",
            ),
            ("redeliveries", f"{self.redeliveries} ({self.deliveries} task executions started)"),
            ("applications", str(self.verdict.applications if self.verdict else 0)),
            ("duplicates", str(self.duplicates)),
            ("missing", str(self.missing)),
            ("unknown", f"{self.reconciled} resolved by reconcile, {self.unknown} left for an operator"),
            ("replayed", f"{self.replayed} effects short-circuited by finishing deliveries"),
            ("fenced", f"{self.fenced} late applications refused by the ledger"),
            ("resent", f"{self.resent} tasks the broker lost, sent again under a new task id"),
            (
                "elapsed",
                f"{self.elapsed:.1f}s"
                + (" (TIMED OUT)" if self.timed_out else "")
                + (f", faults stopped at {self.calmed:.0f}s to let the rest finish" if self.calmed else ""),
            ),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"  {k.ljust(width)}  {v}" for k, v in rows]
        return "\n".join(["effectq chaos", *lines, "", self.conclusion()])

    def conclusion(self) -> str:
        o = self.options
        if self.timed_out:
            left = o.tasks - self.finished
            return f"INCONCLUSIVE: {left} tasks did not finish in {o.timeout:g}s (logs: {self.logs})"
        if not self.bit:
            return "PROVED NOTHING: no task was delivered twice; the chaos never reached a task"
        if not o.effectq:
            if self.duplicates:
                return f"WITHOUT EFFECTQ: {self.duplicates} duplicate applications; the chaos bites"
            return "PROVED NOTHING: without effectq the chaos caused no duplicate; make it harsher"
        if self.duplicates or self.missing:
            return f"FAIL: {self.verdict}"
        effects = o.tasks * o.effects
        return f"PASS: {effects} effects, each applied exactly once across {self.redeliveries} redeliveries"


def run_chaos(options: Options) -> Report:
    """Run the chaos and report. Everything started is stopped, everything created deleted."""
    queue_kind, broker_kind = CONFIGURATIONS[options.configuration]
    rng = random.Random(options.seed)
    name = f"chaos{uuid.uuid4().hex[:10]}"
    log_dir = Path(options.log_dir or tempfile.mkdtemp(prefix="effectq-chaos-"))
    report = Report(options, logs=str(log_dir))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        store_url = options.redis_url
        server: RedisServer | None = None
        if options.redis_restart:
            server = RedisServer(log_dir / "store-redis")
            server.start()
            stack.callback(server.stop)
            store_url = server.url
        broker_url = options.redis_url if broker_kind == "redis" else options.amqp_url
        config = WorkloadConfig(
            kind=queue_kind,
            broker=broker_url,
            store=store_url,
            ledger=options.redis_url,
            name=name,
            effectq="on" if options.effectq else "off",
            lease=options.lease,
            visibility=max(3.0, options.lease * 2),
            faults=options.faults,
            module=options.workload,
            keyed_by="business",  # a task the broker lost is sent again under a new id: same run
        )
        producer = Producer(config)
        stack.callback(_cleanup, producer)
        proxy: Proxy | None = None
        worker_config = config
        if options.cut:
            proxy, proxied = Proxy.for_url(broker_url)
            stack.callback(proxy.close)
            worker_config = replace(config, broker=proxied)
        ledger = Ledger.from_url(options.redis_url, name)
        for task_no in range(options.tasks):
            producer.send(task_no, options.effects, pause=options.pause)
        workers = [WorkerProcess(worker_config, f"w{i}", log_dir=log_dir) for i in range(options.workers)]
        for worker in workers:
            stack.callback(worker.stop)
            worker.start()
        _torment(options, rng, workers, ledger, server, proxy, report, started, producer)
        report.elapsed = time.monotonic() - started
        report.verdict = verdict(
            ledger, (f"{t}:{i}" for t in range(options.tasks) for i in range(options.effects))
        )
        report.tail = {w.name: w.log_tail(30) for w in workers}
        if server is not None:
            report.store_restarts = server.restarts
        if proxy is not None:
            report.cuts = proxy.cuts
    return report


def _torment(
    options: Options,
    rng: random.Random,
    workers: list[WorkerProcess],
    ledger: Ledger,
    server: RedisServer | None,
    proxy: Proxy | None,
    report: Report,
    started: float,
    producer: Producer,
) -> None:
    """Fault the workers until every task has finished (or the timeout).

    A broker can lose a message outright (kombu's Redis transport, when a worker
    dies between popping a task and registering it as unacked): when nothing has
    happened for :data:`STALL` seconds, the unfinished tasks are sent again, as
    an application's own reconciler would. The run is keyed by a business key,
    so a resent task is the same run and its effects still apply once.
    """
    now = time.monotonic()
    last_progress = now

    def every(seconds: float | None) -> float:
        return now + seconds if seconds else float("inf")

    next_kill = now + rng.uniform(*options.kill_every) if options.kill_every else float("inf")
    next_restart, next_stop, next_cut = (
        every(options.redis_restart),
        every(options.sigstop),
        every(options.cut),
    )
    paused: dict[str, float] = {}
    finished: set[int] = set()
    cursor = 0
    starts = 0
    while len(finished) < options.tasks:
        time.sleep(0.2)
        now = time.monotonic()
        if now - started > options.timeout:
            report.timed_out = True
            break
        events, cursor = ledger.events_since(cursor)
        if events:
            last_progress = now
        elif now - last_progress > STALL:
            unfinished = [t for t in range(options.tasks) if t not in finished]
            for task_no in unfinished:
                producer.send(task_no, options.effects, pause=options.pause)
            report.resent += len(unfinished)
            last_progress = now
        for event in events:
            kind = event["kind"]
            if kind == "start":
                starts += 1
            elif kind in ("done", "unknown") and event["task"] not in finished:
                finished.add(event["task"])
                report.replayed += int(event.get("replayed", 0))
                report.reconciled += int(event.get("reconciled", 0))
                report.unknown += kind == "unknown"
            elif kind == "fenced":
                report.fenced += 1
        for worker in workers:
            if worker.name in paused and now >= paused[worker.name]:
                worker.resume()
                del paused[worker.name]
            if not worker.alive:
                report.deaths += 1
                worker.start()
        if now - started > options.timeout * CALM_AFTER:
            if not report.calmed:  # let the stragglers finish: a liveness matter, not a safety one
                report.calmed = now - started
            continue
        alive = [w for w in workers if w.alive and w.name not in paused]
        if now >= next_kill and options.kill_every and alive:
            victim = rng.choice(alive)
            victim.kill()
            victim.start()
            report.kills += 1
            next_kill = now + rng.uniform(*options.kill_every)
        if now >= next_stop and options.sigstop and alive:
            victim = rng.choice(alive)
            victim.pause()
            paused[victim.name] = now + max(options.lease * 2, options.lease + 3.0)
            report.pauses += 1
            next_stop = now + options.sigstop
        if now >= next_restart and server is not None and options.redis_restart:
            server.restart()
            next_restart = time.monotonic() + options.redis_restart
        if now >= next_cut and proxy is not None and options.cut:
            proxy.cut()
            next_cut = now + options.cut
    for worker in workers:
        if worker.paused:
            worker.resume()
    report.deliveries = starts
    report.finished = len(finished)


def _cleanup(producer: Producer) -> None:
    producer.cleanup()
