"""What a chaos worker process runs, passed through its environment: :class:`WorkloadConfig`.

The harness (:mod:`effectq.testing.workers`, :mod:`effectq.testing.chaos.runner`) writes it;
the worker side (:mod:`effectq.testing.chaos.workload`, :mod:`effectq.testing.chaos.user`)
reads it back with :meth:`WorkloadConfig.from_env`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["ENV_PREFIX", "WorkloadConfig"]

ENV_PREFIX = "EFFECTQ_CHAOS_"
"""The prefix of every environment variable a worker process reads."""


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Everything a worker process needs, passed through its environment.

    Attributes:
        kind: ``celery`` or ``dramatiq``.
        broker: the broker URL (``redis://...`` or ``amqp://...``).
        store: the Redis URL of the effectq store.
        ledger: the Redis URL of the ledger (a server the run never restarts).
        name: this run's name: the namespace, ledger name, queue and key prefixes.
        effectq: ``"on"``, or ``"off"`` to run the same tasks unguarded.
        lease: the effects' lease, in seconds (short, so kills resolve quickly).
        visibility: the Redis brokers' redelivery timeout for a silent worker, in seconds.
        faults: faults the workers inject into themselves (see
            :func:`effectq.testing.faults.parse_faults`), e.g. ``"after_effect:0.02:kill"``.
        module: the module workers import: this one, or yours (defining ``app`` or
            ``broker`` the same way, with a task that calls :func:`work`).
        keyed_by: ``"task"`` (the run id is the task / message id) or ``"business"``
            (``chaos:<task number>``, so a task sent again under a new id is the same run).
        slow: ``"INDEX:SECONDS"`` or ``"INDEX:SECONDS:EVERY"``: in the first execution of each
            task (of every EVERY-th task: 0, EVERY, 2 x EVERY...), effect INDEX waits SECONDS before
            its side effect (a slow remote call, longer than the broker's patience).
        inside: seconds each effect spends after its side effect, before it returns (so a
            signal or a kill lands inside the effect, between its side effect and its record).
        late: like ``slow``, but the wait comes after the side effect, and in tasks 1,
            1 + EVERY, 1 + 2 x EVERY... (every task when EVERY is 1).
        time_limit: the Dramatiq actor's time limit in seconds (0: ten minutes).
        retry: how a task asks for its retry after ``retry_after`` effects: ``""`` (at once),
            ``"countdown"`` (``self.retry(countdown=1)`` / ``Retry(delay=1000)``),
            ``"autoretry"`` (it raises :class:`Transient`, which ``autoretry_for`` /
            Dramatiq's Retries middleware retry with a backoff), ``"mixed"`` (odd tasks
            autoretry, even tasks count down).
        chord: Celery only: tasks go out as chords of this many header tasks, whose callback
            (``chaos.chord_done``, run id ``chord:{request.group}``) applies one effect per chord
            and lingers :data:`~effectq.testing.chaos.workload.CALLBACK_LINGER` seconds after it on its
            first run (so kills land there); results go to a Redis result backend on the ledger's server.
            0: no chords.
        app: your Celery app or Dramatiq broker module (``module[:attribute]``), which
            :mod:`effectq.chaos.user` runs unchanged; ``""``: this module's tasks.
        queue_name: the queue the workers consume, when not the run's own (a Dramatiq actor's).
        reads: 1: each effect reads its input from the store's Redis before its side effect
            and writes its result there after it (with effectq off too, as a task reads the
            order it charges and saves that it did), waiting as long as that Redis is frozen or
            cut off: the stall a frozen or partitioned Redis puts a task into, wherever it is.
        reads_timeout: how long each of those calls waits for its answer before it raises
            redis-py's ``TimeoutError`` (0: as long as it takes).
    """

    kind: str
    broker: str
    store: str
    ledger: str
    name: str
    effectq: str = "on"
    lease: float = 2.0
    visibility: float = 10.0
    faults: str = ""
    module: str = "effectq.testing.chaos.workload"
    keyed_by: str = "task"
    slow: str = ""
    inside: float = 0.0
    retry: str = ""
    late: str = ""
    time_limit: float = 0.0
    chord: int = 0
    app: str = ""
    queue_name: str = ""
    reads: int = 0
    reads_timeout: float = 0.0

    def to_env(self) -> dict[str, str]:
        """The environment variables a worker process reads."""
        return {ENV_PREFIX + f.name.upper(): str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_env(cls, environ: Any = None) -> WorkloadConfig:
        """Read the configuration a harness wrote."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                kind = {"float": float, "int": int}.get(str(f.type))
                values[f.name] = kind(raw) if kind is not None else raw
        missing = [n for n in ("kind", "broker", "store", "ledger", "name") if n not in values]
        if missing:
            raise RuntimeError(
                f"effectq.testing.chaos.workload: set {', '.join(ENV_PREFIX + m.upper() for m in missing)}"
            )
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def queue(self) -> str:
        """The queue this run's tasks go through."""
        return self.queue_name or f"effectq-chaos-{self.name}"

    @property
    def prefix(self) -> str:
        """The prefix of every Redis key this run's broker and result backend create."""
        return f"effectq-chaos-{self.name}:"

    def results(self) -> dict[str, Any]:
        """The Celery settings of the result backend chords need (none without chords)."""
        if not self.chord:
            return {}
        return {
            "result_backend": self.ledger,
            "result_backend_transport_options": {"global_keyprefix": self.prefix},
            "task_ignore_result": False,
            "result_expires": 3600,
        }
