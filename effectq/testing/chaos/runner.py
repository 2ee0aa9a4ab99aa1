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
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..ledger import Application, Ledger, Verdict, verdict
from ..workers import Producer, WorkerProcess
from .proxy import Proxy
from .redis_server import RedisServer
from .user import Send, UserProducer, load
from .workload import WorkloadConfig

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
"""Preset sizes of the plain configurations: ``small`` (150 effects), ``ci`` (300), ``long`` (5,000)."""
SIZE_TIMEOUTS: dict[str, float] = {"small": 170.0, "ci": 170.0, "long": 1200.0}
"""How long each preset may take (a long run does about three tasks a second on two cores)."""


REDIS_URL = "redis://127.0.0.1:6379/0"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
TIMEOUT = 170.0
STALL = 15.0
"""Seconds without any event after which unfinished tasks are sent again (lost by the broker)."""
CALM_AFTER = 0.6
"""Faults stop after this share of the timeout, so the last tasks can finish."""
KILL_WITH = ("kill", "child", "term", "quit")
"""What a fault does to its victim: SIGKILL the worker (its whole process group), SIGKILL one pool
child, SIGTERM the worker's main process (warm shutdown; SIGKILL after ``grace``), SIGQUIT it (cold)."""


class Unreachable(Exception):
    """Redis or the broker did not answer: the run is no evidence either way (one line says which)."""


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
        sigstop: SIGSTOP a worker past its lease every this many seconds (the first at once).
        cut: cut the broker connections every this many seconds.
        faults: faults workers inject into themselves (``"after_effect:0.02:kill"``).
        pause: seconds between two effects of a task (so kills land mid-task).
        lease: the effects' lease, seconds.
        redis_url: the Redis of the ledger (and of the store, unless ``redis_restart``).
        amqp_url: the RabbitMQ broker.
        timeout: give up after this many seconds.
        seed: seeds the choice of victims and moments.
        log_dir: where worker logs go (a temporary directory by default).
        workload: the module the workers run (see :class:`~effectq.testing.chaos.workload.WorkloadConfig`).
        scenario: the named scenario these options came from (for the report), or ``""``.
        pool: Celery's pool, or a comma-separated cycle of pools (``"solo,prefork"``: worker 0 solo,
            worker 1 prefork...).
        concurrency: Celery pool size, or Dramatiq threads.
        visibility: the Redis brokers' redelivery timeout in seconds (0: twice the lease, at least 3).
        idle_workers: more Celery workers that consume a queue nobody sends to: an idle consumer's
            loop is where kombu restores unacked messages past the visibility timeout.
        slow: ``"INDEX:SECONDS[:EVERY]"``: the first execution of each task (of every EVERY-th)
            spends SECONDS in effect INDEX before its side effect.
        inside: seconds each effect spends after its side effect (kills land inside effects).
        countdown: tasks are sent due this many seconds later (ETA tasks).
        retry: how tasks ask for their retry (see :class:`~effectq.testing.chaos.workload.WorkloadConfig`).
        retry_after: the first execution of each task asks for a retry after this many effects.
        kill_with: what the faults do, in turn (see :data:`KILL_WITH`).
        target: the victim of a kill, shutdown or SIGSTOP: ``"any"`` worker, or ``"busy"``: one
            running a task (its child, for ``child``); with none at a kill's moment, the next
            moment is drawn.
        grace: seconds a warm shutdown (SIGTERM) may take before the worker is SIGKILLed.
        store_pause: freeze the store's own redis-server (SIGSTOP) past the lease while a task
            runs (the first time at once, then this many seconds after each freeze), then resume it.
        partition: every this many seconds (the first time at once), hold one busy worker's
            connections to the store's own redis-server past the lease (each worker reaches it
            through a proxy of its own), then release them.
        late: ``"INDEX:SECONDS[:EVERY]"``: the first execution of tasks 1, 1 + EVERY... spends
            SECONDS in effect INDEX after its side effect.
        time_limit: the Dramatiq actors' time limit in seconds (0: ten minutes).
        progress: seconds between two progress lines (0: none; they go to :func:`run_chaos`'s
            ``progress`` callback).
        stall: seconds without any event after which the unfinished tasks are sent again.
        persistence: whether the store's own redis-server writes an append-only file (``False``:
            none, and no snapshots: a restart loses every record, which the run says before it starts).
        app: your Celery app or Dramatiq broker module (``module[:attribute]``): the workers run it
            unchanged and the tasks are ``send``'s (see :mod:`effectq.testing.chaos.user`); ``""``: the
            runner's own workload.
        send: the tasks to send with ``app``, ``name(arguments...)`` templates used in turn.
        chord: Celery only: the tasks go out as chords of this many header tasks, each chord's
            callback one more task of one effect, keyed by the chord's group id (0: no chords).
        reads: each effect reads its input from the store's Redis before its side effect and
            writes its result there after it, with effectq off too (so a frozen or cut-off store
            stalls a task wherever it is, as a stalled database would, effectq or not).
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
    workload: str = "effectq.testing.chaos.workload"
    scenario: str = ""
    pool: str = "solo"
    concurrency: int = 1
    visibility: float = 0.0
    idle_workers: int = 0
    slow: str = ""
    inside: float = 0.0
    countdown: float = 0.0
    retry: str = ""
    retry_after: int = 0
    kill_with: tuple[str, ...] = ("kill",)
    target: str = "any"
    grace: float = 2.0
    store_pause: float | None = None
    partition: float | None = None
    late: str = ""
    time_limit: float = 0.0
    progress: float = 0.0
    stall: float = STALL
    persistence: bool = True
    chord: int = 0
    app: str = ""
    send: tuple[str, ...] = ()
    reads: bool = False

    @property
    def chords(self) -> int:
        """How many chords the tasks make (0 without chords)."""
        return -(-self.tasks // self.chord) if self.chord else 0

    @property
    def units(self) -> int:
        """The tasks that must finish: the tasks, and each chord's callback."""
        return self.tasks + self.chords

    def identities(self) -> list[str]:
        """Every effect the run must apply once: ``task:index``, and ``callback:0`` per chord."""
        if self.app:
            return []  # your tasks: the effects effectq ran are the expected ones
        found = [f"{t}:{i}" for t in range(self.tasks) for i in range(self.effects)]
        return found + [f"{self.tasks + c}:0" for c in range(self.chords)]

    @property
    def broker_visibility(self) -> float:
        """The Redis brokers' redelivery timeout (Celery's visibility timeout, Dramatiq's heartbeat)."""
        return self.visibility or max(3.0, self.lease * 2)

    @property
    def own_store(self) -> bool:
        """Whether the store gets a redis-server of its own (to restart or freeze it)."""
        return bool(self.redis_restart or self.store_pause or self.partition)

    def pool_of(self, worker: int) -> str:
        """The pool of worker number ``worker`` (``pool`` is a comma-separated cycle)."""
        pools = [p.strip() for p in self.pool.split(",") if p.strip()] or ["solo"]
        return pools[worker % len(pools)]


@dataclass(slots=True)
class Report:
    """What a chaos run did and found.

    Attributes:
        options: the run's options.
        verdict: applications judged against the expected effects.
        kills: SIGKILLs of a whole worker the runner sent (random, or after a grace period ran out).
        child_kills: SIGKILLs of one pool child.
        terms: warm shutdowns (SIGTERM) the runner sent.
        quits: cold shutdowns (SIGQUIT) the runner sent.
        grace_kills: shutdowns that did not end within the grace period, then SIGKILLed.
        deaths: workers that died on their own (an injected kill, a crash) and were restarted.
        pauses: SIGSTOPs of a worker past its lease.
        store_restarts: restarts of the store's redis-server.
        store_pauses: freezes of the store's redis-server past the lease.
        partitions: times one worker's path to the store's Redis was held past the lease.
        cuts: broker connection cuts.
        deliveries: task executions started (a task killed and delivered again counts twice).
        copies: executions that started while another execution of the same task still ran.
        retries: executions that were a retry (``self.retry``, autoretry, effectq's in-flight retry).
        retry_asks: retries the tasks asked for.
        time_limits: executions a time limit interrupted.
        finished: tasks that finished.
        replayed: effects the finishing deliveries replayed from the record.
        reconciled: effects the finishing deliveries found applied by asking the ledger.
        unknown: tasks stopped by an unknown outcome (left for an operator).
        wrong: effects that returned another value than the one they applied.
        fenced: applications the ledger refused (a resumed holder, fenced out).
        resent: tasks sent again after the run stalled (the broker lost their message).
        elapsed: seconds.
        timed_out: the run gave up before every task finished.
        calmed: when the faults stopped to let the last tasks finish (0: they never had to).
        evidence: the ledger's applications of the effects that applied more than once (the
            first 30: key, fencing token, process, time), to tell what happened.
        warnings: what ``effectq doctor`` finds wrong with the store's Redis for the run's faults
            (said before the run starts: a restarted store without persistence loses records).
    """

    options: Options
    verdict: Verdict | None = None
    kills: int = 0
    child_kills: int = 0
    terms: int = 0
    quits: int = 0
    grace_kills: int = 0
    deaths: int = 0
    pauses: int = 0
    store_restarts: int = 0
    store_pauses: int = 0
    partitions: int = 0
    cuts: int = 0
    deliveries: int = 0
    copies: int = 0
    retries: int = 0
    retry_asks: int = 0
    time_limits: int = 0
    finished: int = 0
    replayed: int = 0
    reconciled: int = 0
    unknown: int = 0
    wrong: int = 0
    fenced: int = 0
    resent: int = 0
    elapsed: float = 0.0
    timed_out: bool = False
    calmed: float = 0.0
    logs: str = ""
    tail: dict[str, str] = field(default_factory=dict)
    evidence: list[Application] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    expected: int = 0

    @property
    def redeliveries(self) -> int:
        """Task executions beyond the first of each task."""
        return max(0, self.deliveries - self.finished)

    @property
    def duplicates(self) -> int:
        return self.verdict.extra if self.verdict else 0

    @property
    def callback_duplicates(self) -> int:
        """Applications beyond the first of the chords' callback effects (one per chord)."""
        if self.verdict is None or not self.options.chord:
            return 0
        tasks = self.options.tasks
        return sum(
            n - 1 for identity, n in self.verdict.duplicates.items() if int(identity.split(":")[0]) >= tasks
        )

    @property
    def missing(self) -> int:
        return len(self.verdict.missing) if self.verdict else 0

    @property
    def not_done(self) -> int:
        """Tasks that never finished."""
        return self.options.units - self.finished

    @property
    def harmed(self) -> bool:
        """Whether any effect applied twice or returned a wrong value (the harm a scenario is about)."""
        return bool(self.duplicates or self.wrong)

    @property
    def bit(self) -> bool:
        """Whether the chaos reached the tasks at all (some task was delivered again)."""
        return self.redeliveries > 0

    @property
    def passed(self) -> bool:
        """With effectq: no duplicate, nothing missing or wrong, nothing timed out, and the chaos bit."""
        return not self.timed_out and not self.harmed and self.missing == 0 and self.bit

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        o = self.options
        return {
            "scenario": o.scenario or o.configuration,
            "configuration": o.configuration,
            "effectq": o.effectq,
            "tasks": o.units,
            "chords": o.chords,
            "finished": self.finished,
            "not_done": self.not_done,
            "effects": self.expected,
            "kills": self.kills,
            "child_kills": self.child_kills,
            "terms": self.terms,
            "quits": self.quits,
            "grace_kills": self.grace_kills,
            "deaths": self.deaths,
            "pauses": self.pauses,
            "store_restarts": self.store_restarts,
            "store_pauses": self.store_pauses,
            "partitions": self.partitions,
            "cuts": self.cuts,
            "redeliveries": self.redeliveries,
            "copies": self.copies,
            "retries": self.retries,
            "retry_asks": self.retry_asks,
            "time_limits": self.time_limits,
            "applications": self.verdict.applications if self.verdict else 0,
            "duplicates": self.duplicates,
            "callback_duplicates": self.callback_duplicates,
            "missing": self.missing,
            "wrong": self.wrong,
            "reconciled": self.reconciled,
            "unknown": self.unknown,
            "replayed": self.replayed,
            "fenced": self.fenced,
            "resent": self.resent,
            "elapsed": round(self.elapsed, 3),
            "timed_out": self.timed_out,
            "conclusion": self.conclusion(),
            "warnings": self.warnings,
            "evidence": [
                {"identity": a.identity, "key": a.idempotency_key, "token": a.token, "pid": a.pid, "at": a.at}
                for a in self.evidence
            ],
        }

    def _faults(self) -> str:
        o = self.options
        faults = []
        if o.kill_every:
            what = {"kill": "SIGKILL", "child": "SIGKILL of a pool child", "term": "SIGTERM",
                    "quit": "SIGQUIT"}  # fmt: skip
            kinds = " / ".join(what.get(k, k) for k in o.kill_with)
            busy = " of a busy worker" if o.target == "busy" else ""
            faults.append(f"{kinds}{busy} every {o.kill_every[0]:g}-{o.kill_every[1]:g}s")
        for name, value in (("store restart every", o.redis_restart), ("SIGSTOP every", o.sigstop),
                            ("store freeze every", o.store_pause),
                            ("partition from the store every", o.partition),
                            ("connection cut every", o.cut)):  # fmt: skip
            if value:
                faults.append(f"{name} {value:g}s")
        for spec, where in ((o.slow, "before"), (o.late, "after")):
            if spec:
                index, seconds, every = [*spec.split(":"), "1"][:3]
                which = "each task" if every == "1" else f"one task in {every}"
                faults.append(f"first run of {which}: {seconds}s in effect {index} {where} its side effect")
        if o.time_limit:
            faults.append(f"time limit {o.time_limit:g}s")
        if o.countdown:
            faults.append(f"countdown {o.countdown:g}s")
        if o.retry_after:
            faults.append(f"retry ({o.retry or 'at once'}) after effect {o.retry_after}")
        if o.configuration.endswith("redis") and (o.visibility or o.slow or o.countdown):
            faults.append(f"visibility {o.broker_visibility:g}s")
        if o.faults:
            faults.append(f"injected {o.faults}")
        if o.reads:
            faults.append("each effect reads and writes the store's Redis")
        return ", ".join(faults) or "none"

    def render(self) -> str:
        """The report a person reads at a glance."""
        o = self.options
        pools = "" if o.configuration.startswith("dramatiq") or o.pool == "solo" else f", pool {o.pool}"
        idle = f" (+{o.idle_workers} idle)" if o.idle_workers else ""
        title = f"{o.scenario}: " if o.scenario and o.scenario != o.configuration else ""
        chords = f"; {o.chords} chords of {o.chord} header tasks and a callback" if o.chord else ""
        callbacks = ", 1 per chord callback" if o.chord else ""
        per = f"{o.effects} per task{callbacks}" if not o.app else "each one effectq ran, counted by its key"
        rows = [
            (
                "configuration",
                f"{title}{o.configuration}, effectq {'on' if o.effectq else 'OFF'}, "
                f"{o.workers} workers{idle}{pools}",
            ),
            ("faults", self._faults()),
            ("tasks", f"{o.units} ({self.finished} finished, {self.not_done} not done){chords}"),
            ("effects", f"{self.expected} ({per})"),
            (
                "kills",
                f"{self.kills} SIGKILL, {self.child_kills} of a pool child, {self.deaths} died on their own",
            ),
            (
                "shutdowns",
                f"{self.terms} SIGTERM, {self.quits} SIGQUIT, "
                f"{self.grace_kills} SIGKILLed when the {o.grace:g}s grace ran out",
            ),
            (
                "other faults",
                f"{self.pauses} SIGSTOP, {self.store_restarts} store restarts, "
                f"{self.store_pauses} store freezes, {self.partitions} partitions, {self.cuts} cuts",
            ),
            ("redeliveries", f"{self.redeliveries} ({self.deliveries} task executions started)"),
            ("copies", f"{self.copies} executions began while another of the same task still ran"),
            ("retries", f"{self.retries} executions were retries ({self.retry_asks} asked by the tasks)"),
            ("time limits", f"{self.time_limits} executions interrupted by their time limit"),
            ("applications", str(self.verdict.applications if self.verdict else 0)),
            (
                "duplicates",
                str(self.duplicates)
                + (f" ({self.callback_duplicates} of chord callbacks)" if o.chord else ""),
            ),
            ("missing", str(self.missing)),
            ("wrong results", str(self.wrong)),
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
        if self.evidence:
            first = min(a.at for a in self.evidence)
            lines += ["", "  the ledger's applications of the effects applied more than once:"]
            lines += [
                f"    {a.identity:<8} key={a.idempotency_key or '-'} token={a.token} pid={a.pid} "
                f"at +{a.at - first:.3f}s"
                for a in self.evidence
            ]
        notes = [f"  warning        {w}" for w in self.warnings]
        return "\n".join(["effectq chaos", *notes, *lines, "", self.conclusion()])

    def conclusion(self) -> str:
        o = self.options
        if self.timed_out:
            return f"INCONCLUSIVE: {self.not_done} tasks did not finish in {o.timeout:g}s (logs: {self.logs})"
        if not self.bit:
            return "PROVED NOTHING: no task was delivered twice; the chaos never reached a task"
        harm = f"{self.duplicates} duplicate applications" + (
            f", {self.wrong} wrong results" if self.wrong else ""
        )
        if not o.effectq:
            if self.harmed:
                return f"WITHOUT EFFECTQ: {harm}; the chaos bites"
            return "PROVED NOTHING: without effectq the chaos caused no duplicate; make it harsher"
        if self.duplicates or self.missing:
            warned = "; as warned before the run, the store's Redis lost records" if self.warnings else ""
            return f"FAIL: {self.verdict}" + (f"; {self.wrong} wrong results" if self.wrong else "") + warned
        if self.wrong:
            return f"FAIL: {self.wrong} effects returned another value than the one they applied"
        effects = self.expected
        return f"PASS: {effects} effects, each applied exactly once across {self.redeliveries} redeliveries"


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
    _reachable(options.redis_url, "Redis (the ledger and store)")
    if broker_url != options.redis_url:
        _reachable(broker_url, "the RabbitMQ broker")
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
        )
        producer: Producer | UserProducer
        with _answering(broker_url, "the broker"):
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
        chaos = _Chaos(options, rng, ledger, producer, report, started, server, proxy, progress)
        with _answering(broker_url, "the broker"):
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
        with _answering(options.redis_url, "Redis (the ledger)"):
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


class _Chaos:
    """One run's faults and bookkeeping: :meth:`torment` faults the workers until every task finished.

    A broker can lose a message outright (kombu's Redis transport, when a worker
    dies between popping a task and registering it as unacked): when nothing has
    happened for ``stall`` seconds (:data:`STALL` by default), the unfinished tasks are sent again, as
    an application's own reconciler would. The run is keyed by a business key,
    so a resent task is the same run and its effects still apply once.
    """

    def __init__(
        self,
        options: Options,
        rng: random.Random,
        ledger: Ledger,
        producer: Producer | UserProducer,
        report: Report,
        started: float,
        server: RedisServer | None,
        proxy: Proxy | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.options = options
        self.rng = rng
        self.ledger = ledger
        self.producer = producer
        self.report = report
        self.started = started
        self.server = server
        self.proxy = proxy
        self.progress = progress
        self.finished: set[int] = set()
        self.running: dict[int, int] = {}  # pid -> the task it runs (from the ledger's start/stop events)
        self.paused: dict[str, float] = {}  # worker name -> when to resume it
        self.stopping: dict[str, float] = {}  # worker name -> when its shutdown's grace runs out
        self.store_frozen_until = 0.0
        self.store_proxies: dict[str, Proxy] = {}
        self.partitioned: dict[str, float] = {}  # worker name -> when its path to the store heals
        self.cursor = 0
        self.strikes = 0
        self.groups: dict[int, tuple[str, list[int]]] = {}  # callback task -> (its chord's group id, header)
        self.called_again: set[int] = set()  # the callbacks sent again (once each)
        self.failed: list[int] = []  # tasks Celery gave up on (acked as failed), to send again

    def send(self, task_no: int, *, countdown: float = 0.0) -> None:
        o = self.options
        self.producer.send(task_no, o.effects, pause=o.pause, retry_after=o.retry_after, countdown=countdown)

    def torment(self, workers: list[WorkerProcess], idle: list[WorkerProcess]) -> None:
        """Fault the workers until every task has finished (or the timeout)."""
        o, report = self.options, self.report
        now = time.monotonic()
        last_event = last_line = now

        def every(seconds: float | None) -> float:
            return now + seconds if seconds else float("inf")

        next_kill = now + self.rng.uniform(*o.kill_every) if o.kill_every else float("inf")
        next_restart, next_cut = every(o.redis_restart), every(o.cut)
        # the first SIGSTOP, store freeze or partition comes with the first task in flight
        next_stop, next_freeze, next_partition = (
            now if s else float("inf") for s in (o.sigstop, o.store_pause, o.partition)
        )
        frozen_for = max(o.lease * 2, o.lease + 3.0)
        while len(self.finished) < o.units:
            time.sleep(0.2)
            now = time.monotonic()
            if now - self.started > o.timeout:
                report.timed_out = True
                break
            with _answering(o.redis_url, "Redis (the ledger)"):
                events, self.cursor = self.ledger.events_since(self.cursor)
            if events:
                last_event = now
            elif now - last_event > o.stall and o.chord:
                self._resend_callbacks()
                last_event = now
            elif now - last_event > o.stall and now >= self.store_frozen_until:
                broker = self.producer.config.broker
                _reachable(broker, "the broker")
                with _answering(broker, "the broker"):
                    unfinished = [t for t in range(o.tasks) if t not in self.finished]
                    for task_no in unfinished:
                        self.send(task_no)
                report.resent += len(unfinished)
                last_event = now
            self._count(events)
            self._resend_failed()
            if self.progress is not None and o.progress and now - last_line >= o.progress:
                last_line = now
                self.progress(self._progress_line(now))
            if self.server is not None and self.store_frozen_until and now >= self.store_frozen_until:
                self.server.resume()
                self.store_frozen_until = 0.0
            self._tend(workers, idle, now)
            if report.deaths > 5 * (o.workers + o.idle_workers) and not report.deliveries:
                report.timed_out = True  # the workers die as they start: their logs say why
                break
            if now - self.started > o.timeout * CALM_AFTER:
                if not report.calmed:  # let the stragglers finish: a liveness matter, not a safety one
                    report.calmed = now - self.started
                continue
            alive = [
                w for w in workers if w.alive and w.name not in self.paused and w.name not in self.stopping
            ]
            if now >= next_kill and o.kill_every and alive:
                kind = o.kill_with[self.strikes % len(o.kill_with)]
                if self._fault(kind, alive, now):
                    self.strikes += 1
                # No busy victim now: the next moment is drawn again. Waiting for one instead would
                # strike each task as it starts, before its first effect: the last task, killed at
                # every redelivery, never finished until the faults stopped.
                next_kill = now + self.rng.uniform(*o.kill_every)
            frozen = [w for w in alive if self._busy(w)] if o.target == "busy" else alive
            if now >= next_stop and o.sigstop and frozen:
                victim = self.rng.choice(frozen)
                victim.pause()
                self.paused[victim.name] = now + frozen_for
                report.pauses += 1
                next_stop = now + o.sigstop
            if (
                now >= next_restart
                and self.server is not None
                and o.redis_restart
                and not self.store_frozen_until
            ):
                self.server.restart()
                next_restart = time.monotonic() + o.redis_restart
            if (
                now >= next_freeze
                and self.server is not None
                and o.store_pause
                and not self.store_frozen_until
                and any(self._busy(w) for w in alive)  # while effects are in flight
            ):
                self.server.pause()
                self.store_frozen_until = now + frozen_for
                report.store_pauses += 1
                next_freeze = now + o.store_pause + frozen_for
            if now >= next_partition and o.partition:
                cut_off = [w for w in alive if w.name not in self.partitioned and self._busy(w)]
                if cut_off:
                    victim = self.rng.choice(cut_off)
                    self.store_proxies[victim.name].hold()
                    self.partitioned[victim.name] = now + frozen_for
                    report.partitions += 1
                    next_partition = now + o.partition
            if now >= next_cut and self.proxy is not None and o.cut:
                self.proxy.cut()
                next_cut = now + o.cut
        for worker in workers:
            if worker.paused:
                worker.resume()
        for proxy in self.store_proxies.values():
            proxy.release()
        if self.server is not None and self.store_frozen_until:
            self.server.resume()
        if not report.timed_out:
            self._drain()
        report.finished = len(self.finished)

    def _drain(self) -> None:
        """Wait (``stall`` seconds at most) for the executions still running when the last task
        finished: a copy a frozen or cut-off worker resumes may still apply, and counts."""
        deadline = time.monotonic() + self.options.stall
        while True:
            with _answering(self.options.redis_url, "Redis (the ledger)"):
                events, self.cursor = self.ledger.events_since(self.cursor)
            self._count(events)
            if not any(_running(pid) for pid in self.running) or time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    def _resend_failed(self) -> None:
        """Send again, at once, the unfinished tasks Celery gave up on: acked as failed (a solo
        worker's cold shutdown raises into its task), nothing delivers them again, so an
        application's reconciler would; without this they would wait for the stall."""
        lost = [t for t in dict.fromkeys(self.failed) if t not in self.finished and not self.options.chord]
        self.failed.clear()
        if lost:
            with _answering(self.producer.config.broker, "the broker"):
                for task_no in lost:
                    self.send(task_no)
            self.report.resent += len(lost)

    def _resend_callbacks(self) -> None:
        """Send again the callbacks of chords whose header tasks all finished, in their chord's group.

        Celery's Redis result backend claims a chord's dispatch before it sends the callback: a
        worker killed holding the claim leaves the chord without a callback when the copy of its
        header task comes back before the claim expires. The callback keyed by its group id applies
        its effect once however many times it is sent. (Header tasks are not sent again: a header
        task sent alone belongs to no chord; RabbitMQ redelivers them.)"""
        lost = [
            (callback, group)
            for callback, (group, header) in self.groups.items()
            if callback not in self.finished | self.called_again and all(t in self.finished for t in header)
        ]
        self.called_again.update(callback for callback, _ in lost)
        broker = self.producer.config.broker
        with _answering(broker, "the broker"):
            for callback, group in lost:
                assert isinstance(self.producer, Producer)
                self.producer.send_callback(callback, group)
        self.report.resent += len(lost)

    def _count(self, events: list[dict[str, Any]]) -> None:
        report = self.report
        for event in events:
            kind, pid = event["kind"], int(event.get("pid", 0))
            if kind == "start":
                report.deliveries += 1
                report.retries += int(event.get("retries", 0)) > 0
                task = event["task"]
                others = [p for p, t in self.running.items() if t == task and p != pid and _running(p)]
                if others:
                    report.copies += 1
                    log.debug("task %s started in process %s while %s still ran it", task, pid, others)
                self.running[pid] = task
            elif kind == "stop":
                self.running.pop(pid, None)
            elif kind in ("done", "unknown") and event["task"] not in self.finished:
                self.finished.add(event["task"])
                report.replayed += int(event.get("replayed", 0))
                report.reconciled += int(event.get("reconciled", 0))
                report.unknown += kind == "unknown"
            elif kind == "fenced":
                report.fenced += 1
            elif kind == "retry":
                report.retry_asks += 1
            elif kind == "wrong":
                report.wrong += 1
            elif kind == "time_limit":
                report.time_limits += 1
            elif kind == "failed":
                self.failed.append(event["task"])

    def _tend(self, workers: list[WorkerProcess], idle: list[WorkerProcess], now: float) -> None:
        """Resume the paused, finish the shutdowns, restart the dead."""
        report = self.report
        for worker in [*workers, *idle]:
            if worker.name in self.paused and now >= self.paused[worker.name]:
                worker.resume()
                del self.paused[worker.name]
            if worker.name in self.partitioned and now >= self.partitioned[worker.name]:
                self.store_proxies[worker.name].release()
                del self.partitioned[worker.name]
            if worker.name in self.stopping:
                if worker.alive and now < self.stopping[worker.name]:
                    continue
                if worker.alive:  # the grace ran out: what an orchestrator does next
                    worker.kill()
                    report.grace_kills += 1
                del self.stopping[worker.name]
                worker.start()
            elif not worker.alive:
                report.deaths += 1
                worker.start()

    def _fault(self, kind: str, alive: list[WorkerProcess], now: float) -> bool:
        """Strike one worker with ``kind`` (see :data:`KILL_WITH`); False when no victim fits yet."""
        o, report = self.options, self.report
        candidates = alive
        if o.target == "busy" or kind == "child":
            busy = [w for w in alive if self._busy(w)]
            candidates = busy or ([] if o.target == "busy" else alive)
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        if kind == "child":
            children = _children(victim.pid)
            running = [p for p in children if p in self.running]
            chosen = running if o.target == "busy" else children
            if not chosen:
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.rng.choice(chosen), signal.SIGKILL)
            report.child_kills += 1
        elif kind in ("term", "quit"):
            assert victim.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.pid, signal.SIGTERM if kind == "term" else signal.SIGQUIT)
            self.stopping[victim.name] = now + o.grace
            if kind == "term":
                report.terms += 1
            else:
                report.quits += 1
        else:
            victim.kill()
            victim.start()
            report.kills += 1
        return True

    def _busy(self, worker: WorkerProcess) -> bool:
        """Whether the worker (or one of its children) runs a task now."""
        if worker.pid is None:
            return False
        return any(p in self.running for p in (worker.pid, *_children(worker.pid)))

    def _progress_line(self, now: float) -> str:
        r = self.report
        counts = self.ledger.counts()
        duplicates = sum(n - 1 for n in counts.values() if n > 1)
        kills = r.kills + r.child_kills + r.terms + r.quits
        return (
            f"effectq chaos {now - self.started:5.0f}s: "
            f"{len(self.finished)}/{self.options.units} tasks done, "
            f"{kills} kills, {max(0, r.deliveries - len(self.finished))} redeliveries, "
            f"{r.copies} copies, {duplicates} duplicates so far"
        )


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a SIGSTOPped process still runs)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        if not Path("/proc/self/stat").exists():  # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    return state not in (b"Z", b"X")


def _children(pid: int | None) -> list[int]:
    """The live children of ``pid`` (a prefork worker's pool processes)."""
    if pid is None:
        return []
    found: list[int] = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = entry.read_bytes().rsplit(b")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
                found.append(int(entry.parent.name))
    return found


def _connection_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a server did not answer (redis-py, kombu, pika, sockets)."""
    found: list[type[BaseException]] = [OSError]
    with contextlib.suppress(ImportError):
        import redis.exceptions

        found += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    with contextlib.suppress(ImportError):
        import kombu.exceptions

        found.append(kombu.exceptions.OperationalError)
    with contextlib.suppress(ImportError):
        import pika.exceptions

        found.append(pika.exceptions.AMQPConnectionError)
    return tuple(found)


def _safe(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


@contextlib.contextmanager
def _answering(url: str, what: str) -> Iterator[None]:
    """Turn a server that does not answer into :class:`Unreachable`, one line naming it."""
    try:
        yield
    except _connection_errors() as exc:
        raise Unreachable(f"{what} at {_safe(url)} did not answer: {exc}") from exc


def _reachable(url: str, what: str) -> None:
    """Raise :class:`Unreachable` unless the Redis or AMQP server at ``url`` answers (5 s at most)."""
    parts = urlsplit(url)
    with _answering(url, what):
        if parts.scheme.startswith("amqp"):
            with socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 5672), timeout=5
            ) as conn:
                conn.sendall(b"AMQP\x00\x00\x09\x01")
                if not conn.recv(8):
                    raise ConnectionError("it closed the connection")
            return
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            client.ping()
        finally:
            client.close()


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
