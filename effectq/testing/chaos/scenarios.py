"""Named chaos scenarios: each one a setting where task queues ran effects twice in production.

A scenario is one entry of :data:`SCENARIOS`: the configuration it runs (task
queue and broker), the :class:`~effectq.testing.chaos.options.Options` it sets (pool,
faults, timings), and its sizes: ``ci`` (well under a minute on two cores, run by
the test suite) and ``long`` (the documented long run). ``effectq chaos NAME``
runs one; ``--compare`` runs it again with effectq off, where it must do harm.
The four plain configurations are scenarios too: solo workers SIGKILLed at random.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCENARIOS", "Scenario"]

_PLAIN_SIZES: dict[str, dict[str, Any]] = {
    "small": {"tasks": 30, "effects": 5, "workers": 2, "timeout": 170.0},
    "ci": {"tasks": 60, "effects": 5, "workers": 2, "timeout": 170.0},
    "long": {"tasks": 1000, "effects": 5, "workers": 3, "timeout": 1200.0},
}


@dataclass(frozen=True, slots=True)
class Scenario:
    """One named scenario.

    Attributes:
        configuration: a key of :data:`~effectq.testing.chaos.options.CONFIGURATIONS`.
        summary: what the run does, in one line.
        mirrors: the production setting it reproduces, and where it was reported.
        options: :class:`~effectq.testing.chaos.options.Options` fields it sets (command-line
            options given explicitly win).
        sizes: ``ci`` and ``long`` (``small`` optional): ``tasks``, ``effects``,
            ``workers`` and the run's ``timeout``.
    """

    configuration: str
    summary: str
    mirrors: str
    options: Mapping[str, Any] = field(default_factory=dict)
    sizes: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: _PLAIN_SIZES)

    def size(self, name: str) -> Mapping[str, Any]:
        """The preset ``name`` (``small`` falls back to ``ci``)."""
        return self.sizes.get(name) or self.sizes["ci"]


_STALLED_STORE: dict[str, Any] = {
    "reads": True,
    "visibility": 2.0,
    "idle_workers": 1,
    "inside": 0.2,
    "pause": 0.0,
    "kill_every": None,
}
"""What ``redis-pause`` and ``partition`` share: effects that read and write the store's Redis, so a
frozen or cut-off store stalls a task (effectq or not) past the visibility timeout, and an idle
worker that restores its message to another; no kills, so the harm is the store's stall alone."""


def _plain(configuration: str, broker: str) -> Scenario:
    return Scenario(
        configuration,
        f"solo workers on {broker}, SIGKILLed at random and restarted",
        "a worker killed mid-task (OOM killer, node drain, deploy): the broker delivers the task again",
    )


SCENARIOS: dict[str, Scenario] = {
    "celery-redis": _plain("celery-redis", "the Redis broker"),
    "celery-rabbitmq": _plain("celery-rabbitmq", "RabbitMQ"),
    "dramatiq-rabbitmq": _plain("dramatiq-rabbitmq", "RabbitMQ"),
    "dramatiq-redis": Scenario(
        "dramatiq-redis",
        "Dramatiq's RedisBroker with a 2 s heartbeat timeout; busy workers SIGKILLed, and frozen "
        "(SIGSTOP) past the heartbeat timeout and their lease, then resumed",
        "a worker whose heartbeat stops while its task still runs (a C call holding the GIL, a "
        "stalled VM): another worker requeues and runs its messages (dramatiq#692)",
        {"visibility": 2.0, "sigstop": 6.0, "target": "busy", "kill_every": (2.0, 3.5)},
        {
            "small": {"tasks": 30, "effects": 5, "workers": 2, "timeout": 170.0},
            "ci": {"tasks": 10, "effects": 4, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 1000, "effects": 5, "workers": 3, "timeout": 1200.0},
        },
    ),
    "visibility-timeout": Scenario(
        "celery-redis",
        "Celery on the Redis broker with a 2 s visibility timeout; the first run of every third "
        "task spends 5 s inside its second effect; one more worker stays idle (it restores "
        "unacked messages); no kills",
        "a task running longer than the Redis transport's visibility_timeout: kombu hands it to "
        "another worker while it still runs (celery#5935)",
        {"visibility": 2.0, "slow": "1:5:3", "idle_workers": 1, "kill_every": None, "pause": 0.1},
        {
            "ci": {"tasks": 6, "effects": 4, "workers": 3, "timeout": 120.0},
            "long": {"tasks": 200, "effects": 4, "workers": 3, "timeout": 1200.0},
        },
    ),
    "eta-storm": Scenario(
        "celery-redis",
        "tasks sent with a 6 s countdown, longer than the 2 s visibility timeout, to three "
        "workers that prefetch them; no kills",
        "ETA/countdown tasks on the Redis broker: each worker that prefetched a copy restored by "
        "the visibility timeout runs it at the same instant (kombu#337, celery#2481)",
        {"visibility": 2.0, "countdown": 6.0, "kill_every": None, "pause": 0.1},
        {
            "ci": {"tasks": 6, "effects": 3, "workers": 3, "timeout": 120.0},
            "long": {"tasks": 300, "effects": 3, "workers": 4, "timeout": 1200.0},
        },
    ),
    "retry": Scenario(
        "celery-redis",
        "the first run of each task asks for a retry after its first effect: even tasks with "
        "self.retry(countdown=1), odd ones by raising an error autoretry_for retries with "
        "retry_backoff; workers SIGKILLed at random",
        "a task retried after it already charged, mailed or posted: the retry runs the whole "
        "body again (celery#2759, celery#6931)",
        {"retry": "mixed", "retry_after": 1, "kill_every": (2.0, 4.0)},
        {
            "ci": {"tasks": 10, "effects": 3, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 500, "effects": 4, "workers": 3, "timeout": 1200.0},
        },
    ),
    "chord": Scenario(
        "celery-rabbitmq",
        "Celery chords on RabbitMQ (results on Redis): three header tasks of three effects each, "
        "and a callback applying one effect per chord, keyed by the chord's group id "
        "(effectq_run_id='chord:{request.group}'), lingering after it on its first run; busy workers "
        "SIGKILLed",
        "a chord whose header tasks or callback are delivered again: every header task's effects run "
        "again, and the callback's 'once per chord' effect (a summary mail, an invoice) twice "
        "(django-celery-results#397, celery#3538)",
        {"chord": 3, "target": "busy", "kill_every": (1.5, 3.0), "pause": 0.1, "stall": 3.0},
        {
            "ci": {"tasks": 9, "effects": 3, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 600, "effects": 3, "workers": 3, "timeout": 1200.0},
        },
    ),
    "prefork-children": Scenario(
        "celery-redis",
        "prefork workers (two children each) with task_reject_on_worker_lost; only pool children "
        "running a task are SIGKILLed (the main process restarts them)",
        "the OOM killer taking one pool process: with task_reject_on_worker_lost the task goes "
        "back to the queue and runs again from the start (celery#3541, celery#6103)",
        {
            "pool": "prefork",
            "concurrency": 2,
            "kill_with": ("child",),
            "target": "busy",
            "kill_every": (0.7, 1.5),
        },
        {
            "ci": {"tasks": 20, "effects": 4, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 600, "effects": 5, "workers": 2, "timeout": 1200.0},
        },
    ),
    "pools": Scenario(
        "celery-rabbitmq",
        "Celery workers on RabbitMQ, one on the threads pool and one on the gevent pool (two tasks "
        "at once each), SIGKILLed while they run tasks, and restarted",
        "workers whose pool runs several tasks in one process (threads, gevent greenlets): one kill "
        "takes every task of the process, each then delivered again. gevent runs on RabbitMQ: on the "
        "Redis broker an idle gevent worker never restores unacked messages (celery#4968, kombu#1025), "
        "which effectq's start-up check names",
        {"pool": "threads,gevent", "concurrency": 2, "target": "busy", "kill_every": (1.0, 2.5)},
        {
            "ci": {"tasks": 16, "effects": 4, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 800, "effects": 5, "workers": 4, "timeout": 1200.0},
        },
    ),
    "shutdown": Scenario(
        "celery-redis",
        "a solo and a prefork worker, each effect 0.6 s long after its side effect; in turn a "
        "cold shutdown (SIGQUIT) and a warm one (SIGTERM, then SIGKILL after a 1.5 s grace) of a "
        "worker running a task; workers restarted",
        "deploys and scale-downs: the orchestrator's SIGTERM, its SIGKILL when the grace period "
        "runs out, and Ctrl-\\ cold shutdowns, all landing inside an effect",
        {
            "pool": "solo,prefork",
            "concurrency": 1,
            "kill_with": ("quit", "term"),
            "target": "busy",
            "grace": 1.5,
            "inside": 0.6,
            "pause": 0.0,
            "kill_every": (2.0, 3.5),
            "stall": 8.0,
        },
        {
            "ci": {"tasks": 6, "effects": 4, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 400, "effects": 4, "workers": 2, "timeout": 1800.0},
        },
    ),
    "dramatiq-retries": Scenario(
        "dramatiq-rabbitmq",
        "Dramatiq on RabbitMQ: the first run of each message asks for a retry after its first "
        "effect: even ones raise Retry(delay=1000), odd ones raise an error the Retries middleware "
        "retries with a 100 ms-2 s backoff; workers SIGKILLed at random",
        "an actor that fails after its first side effect and is retried by the Retries "
        "middleware: every retry runs the whole actor again",
        {"retry": "mixed", "retry_after": 1, "kill_every": (2.0, 4.0)},
        {
            "ci": {"tasks": 10, "effects": 3, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 500, "effects": 4, "workers": 3, "timeout": 1200.0},
        },
    ),
    "dramatiq-time-limit": Scenario(
        "dramatiq-rabbitmq",
        "Dramatiq actors with a 1.5 s time limit; the first run of even messages spends 4 s in "
        "their second effect before its side effect, odd ones after it: the time limit lands "
        "there; the Retries middleware retries them; no kills",
        "an actor outrunning its time_limit inside a slow call: TimeLimitExceeded interrupts it "
        "before or after the remote side applied, and only asking the remote side (a reconcile "
        "hook) tells which",
        {"time_limit": 1.5, "slow": "1:4:2", "late": "1:4:2", "kill_every": None, "pause": 0.1},
        {
            "ci": {"tasks": 8, "effects": 3, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 300, "effects": 3, "workers": 3, "timeout": 1200.0},
        },
    ),
    "redis-pause": Scenario(
        "celery-redis",
        "the store on a redis-server of its own, frozen (SIGSTOP) for 5 s, past the 2 s lease and "
        "the 2 s visibility timeout, while effects are in flight (at the first, then every 11 s); "
        "each effect reads its input from that Redis and writes its result there, and gives "
        "up after 4 s (redis-py 8's default is 5 s); one more worker stays idle (it restores "
        "unacked messages); no kills",
        "a Redis that stops answering without closing its connections (a VM paused, a failover, "
        "a slow fork): the tasks waiting on it outlive their lease and the broker's visibility "
        "timeout, and the broker hands them to another worker while they still run; a task's "
        "own call into it times out, after its side effect as well as before",
        {**_STALLED_STORE, "store_pause": 6.0, "reads_timeout": 4.0},
        {
            "ci": {"tasks": 8, "effects": 3, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 400, "effects": 4, "workers": 3, "timeout": 1800.0},
        },
    ),
    "partition": Scenario(
        "celery-redis",
        "each worker reaches the store's own redis-server through a proxy of its own; one busy "
        "worker's path is held for 5 s (at the first effect in flight, then every 6 s), past the "
        "2 s lease and the 2 s visibility timeout; each effect reads and writes that Redis; one "
        "more worker stays idle (it restores the cut-off worker's task to another); no kills",
        "a worker cut off from Redis (a network partition, a stuck NAT) while its task is "
        "redelivered elsewhere: when the path heals, the first copy carries on where it stood; "
        "the stale holder must be fenced out",
        {**_STALLED_STORE, "partition": 6.0},
        {
            "ci": {"tasks": 10, "effects": 3, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 400, "effects": 4, "workers": 3, "timeout": 1800.0},
        },
    ),
    "redis-restart": Scenario(
        "celery-redis",
        "the store on a redis-server of its own (append-only, fsync always), SIGKILLed and "
        "restarted every 3 s; each effect reads its input from that Redis and writes its result "
        "there; busy workers SIGKILLed",
        "the store's Redis crashing or restarted for an upgrade while effects are in flight: with "
        "persistence, nothing it acknowledged is lost and effects fail closed until it is back; a "
        "task's own call into it loses its reply or finds its connection closed, after its side "
        "effect as well as before",
        {
            "redis_restart": 3.0,
            "kill_every": (2.0, 3.5),
            "target": "busy",
            "reads": True,
            "reads_timeout": 4.0,
            "inside": 0.2,
        },
        {
            "ci": {"tasks": 12, "effects": 4, "workers": 2, "timeout": 120.0},
            "long": {"tasks": 500, "effects": 4, "workers": 3, "timeout": 1800.0},
        },
    ),
}
"""Scenario name -> :class:`Scenario`."""
