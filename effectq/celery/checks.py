"""What a Celery configuration must give for effects to apply exactly once.

effectq makes a redelivered task safe to run again; it cannot make Celery
redeliver a task it dropped. :func:`check` reads the app's configuration (and,
given the store, what its Redis would evict) and returns one sentence per
problem; :func:`effectq.celery.install` logs them when a worker starts.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from ..integration import listed
from ..ops.doctor import startup_problems
from ..options import seconds

__all__ = ["RABBITMQ_CONSUMER_TIMEOUT", "check"]

log = logging.getLogger("effectq.celery.check")

RABBITMQ_CONSUMER_TIMEOUT = 1800.0
"""RabbitMQ's default ``consumer_timeout`` (30 minutes): a delivery unacked for longer
closes the channel and the message is delivered again, while the task still runs."""

_VISIBILITY_TRANSPORTS = ("redis", "rediss", "sqs", "sentinel")
_RESTORING_TRANSPORTS = ("redis", "rediss", "sentinel")
"""The transports whose client (kombu), not the server, puts unacked messages back past the
visibility timeout: SQS makes them visible again itself."""


def check(
    app: Any,
    *,
    lease: float | timedelta = 60.0,
    retention: float | timedelta = timedelta(days=7),
    in_progress_countdown: float = 5.0,
    store: Any = None,
    pool: Any = None,
) -> list[str]:
    """Problems in ``app``'s configuration, one sentence each (empty when none).

    Args:
        app: the Celery app.
        lease: the longest effect lease the app's effects use.
        retention: the shortest effect retention the app's effects use.
        in_progress_countdown: the countdown of the retry an in-flight effect causes.
        store: the store the effects use: its Redis is checked as ``effectq doctor``
            checks it for what repeats effects whatever the app does (see
            :data:`effectq.ops.doctor.STARTUP_CHECKS`: a ``maxmemory-policy`` that evicts).
        pool: the worker's pool (its ``-P`` name, or the pool class a worker holds in
            ``pool_cls``); ``None``: the app's ``worker_pool`` setting.
    """
    lease_s = seconds(lease, option="lease")
    retention_s = seconds(retention, option="retention")
    conf = app.conf
    tasks = [task for name, task in sorted(app.tasks.items()) if not name.startswith("celery.")]
    problems: list[str] = []

    early = [task.name for task in tasks if not getattr(task, "acks_late", conf.task_acks_late)]
    if early:
        problems.append(
            f"task_acks_late is off for {listed(early)}: a worker that dies mid-task has already acked it, "
            f"so it is never delivered again and its remaining effects never apply. Set task_acks_late=True "
            f"(effectq makes the redelivery safe)."
        )
    lost = [
        task.name
        for task in tasks
        if getattr(task, "acks_late", conf.task_acks_late)
        and not getattr(task, "reject_on_worker_lost", None)
        and not conf.task_reject_on_worker_lost
    ]
    if lost:
        problems.append(
            f"task_reject_on_worker_lost is off for {listed(lost)}: when a pool process is killed "
            f"mid-task (OOM, SIGKILL), Celery acks the task and marks it failed (WorkerLostError) "
            f"instead of delivering it again. Set task_reject_on_worker_lost=True: effects already "
            f"applied are replayed, not repeated."
        )

    transport = _transport(app)
    time_limit = conf.task_time_limit
    if transport in _VISIBILITY_TRANSPORTS:
        visibility = float((conf.broker_transport_options or {}).get("visibility_timeout", 3600))
        if time_limit is None or float(time_limit) > visibility:
            problems.append(
                f"the {transport} broker delivers a task again after visibility_timeout={visibility:g}s "
                f"without an ack, even while it still runs (task_time_limit is {time_limit}). Its effects "
                f"still apply once (the copy waits, then retries), but set task_time_limit below "
                f"visibility_timeout."
            )
        if lease_s > visibility:
            problems.append(
                f"the effect lease ({lease_s:g}s) is longer than visibility_timeout ({visibility:g}s): a "
                f"task delivered again after its worker died finds its effect in flight until the lease "
                f"runs out."
            )
        green = _pool_name(pool if pool is not None else conf.worker_pool)
        if green in _GREEN_POOLS and transport in _RESTORING_TRANSPORTS:
            problems.append(
                f"the {green} pool runs no event loop, and kombu's {transport} transport restores unacked "
                f"messages past visibility_timeout only from one (unacked_restore_interval): an idle {green} "
                f"worker never restores them, so a task whose worker died is delivered again late or never "
                f"(celery#4968, kombu#1025). Run at least one worker on the prefork, threads or solo pool on "
                f"this broker, or use RabbitMQ with {green}."
            )
        if in_progress_countdown >= visibility:
            problems.append(
                f"in_progress_countdown ({in_progress_countdown:g}s) is not below visibility_timeout "
                f"({visibility:g}s): the broker would deliver the retry again before it is due."
            )
    elif transport in ("amqp", "amqps", "pyamqp", "librabbitmq") and (
        time_limit is None or float(time_limit) > RABBITMQ_CONSUMER_TIMEOUT
    ):
        problems.append(
            f"RabbitMQ closes the channel of a delivery unacked for consumer_timeout (30 min by default) and "
            f"delivers it again while the task still runs (task_time_limit is {time_limit}). Effects still "
            f"apply once, but set task_time_limit below the server's consumer_timeout."
        )

    long_retry = [task.name for task in tasks if _retry_horizon(task, conf) > retention_s]
    if long_retry:
        problems.append(
            f"{listed(long_retry)} may retry later than the effect retention ({retention_s / 86400:g} days; "
            f"unbounded max_retries, or retries x delay beyond it): an effect whose record expired applies "
            f"again on such a late retry. Bound max_retries or raise the effects' retention."
        )
    if store is not None:
        problems.extend(startup_problems(store))
    return problems


def log_problems(app: Any, **options: Any) -> list[str]:
    """Log every problem :func:`check` finds, as a warning."""
    problems = check(app, **options)
    for problem in problems:
        log.warning("effectq: %s", problem)
    return problems


_GREEN_POOLS = ("gevent", "eventlet")


def _pool_name(pool: Any) -> str:
    """``gevent`` for ``"gevent"``, ``celery.concurrency.gevent:TaskPool`` or that class itself."""
    if pool is None:
        return ""
    if isinstance(pool, type):
        pool = pool.__module__
    text = str(pool).lower().split(":", 1)[0]
    return text.rsplit(".", 1)[-1]


def _transport(app: Any) -> str:
    url = app.conf.broker_url or ""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else ""
    return str(url).split("://", 1)[0].split("+", 1)[0].lower() if "://" in str(url) else str(url).lower()


def _retry_horizon(task: Any, conf: Any) -> float:
    """An upper bound of how long after its first delivery a task may still retry, in seconds."""
    retries = getattr(task, "max_retries", None)
    if retries is None:
        return float("inf")
    delay = float(getattr(task, "default_retry_delay", 0) or 0)
    if getattr(task, "retry_backoff", False):
        delay = max(delay, float(getattr(task, "retry_backoff_max", 600)))
    return float(retries) * delay
