"""What one chaos run does: the configurations, the preset sizes, and :class:`Options`.

The named scenarios (:mod:`effectq.testing.chaos.scenarios`) are presets of these options;
:func:`~effectq.testing.chaos.runner.run_chaos` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "AMQP_URL",
    "CONFIGURATIONS",
    "KILL_WITH",
    "REDIS_URL",
    "SIZES",
    "SIZE_TIMEOUTS",
    "STALL",
    "TIMEOUT",
    "Options",
]

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
KILL_WITH = ("kill", "child", "term", "quit")
"""What a fault does to its victim: SIGKILL the worker (its whole process group), SIGKILL one pool
child, SIGTERM the worker's main process (warm shutdown; SIGKILL after ``grace``), SIGQUIT it (cold)."""


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
        progress: seconds between two progress lines (0: none; they go to
            :func:`~effectq.testing.chaos.runner.run_chaos`'s ``progress`` callback).
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
        reads_timeout: how long each of those calls waits before it raises redis-py's
            ``TimeoutError`` (0: as long as it takes; redis-py 8's default is 5 s).
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
    reads_timeout: float = 0.0

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
