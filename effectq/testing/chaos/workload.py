"""The tasks real workers run under chaos: T tasks of E effects each, applied to a ledger.

Worker processes import this module (``celery -A effectq.testing.chaos.workload:app worker``,
``dramatiq effectq.testing.chaos.workload``); it reads its configuration from the
environment (:class:`WorkloadConfig`), which the harness writes. Each effect
applies to the :class:`~effectq.testing.ledger.Ledger` with the idempotency key
and fencing token effectq hands it, and its reconcile hook asks the ledger, so a
worker killed between the ledger write and the store write is settled on the
next delivery. With effectq switched off the same tasks call the ledger
directly: what a plain task queue does.
"""

from __future__ import annotations

import os
import time
from typing import Any

import effectq
from effectq.errors import OutcomeUnknown, StoreError
from effectq.testing.ledger import Fenced, Ledger

from .config import ENV_PREFIX, WorkloadConfig

__all__ = ["Transient", "WorkloadConfig", "app", "broker", "work"]


class Transient(Exception):
    """A failure the task queue retries with a backoff (``autoretry_for``, Dramatiq's Retries)."""


def _identity(task_no: int, index: int) -> str:
    return f"{task_no}:{index}"


def work(
    ledger: Ledger,
    apply: Any,
    task_no: int,
    effects: int,
    hold_after: int,
    pause: float,
    *,
    retry_after: int = 0,
    retry: Any = None,
    retries: int = 0,
    linger: float = 0.0,
) -> int:
    """The body of every chaos task: apply ``effects`` effects in order.

    ``hold_after`` (>= 1) makes the first delivery stop after that many effects and
    wait to be killed; ``retry_after`` makes it ask the task queue for a retry
    there instead (``retry()`` raises the queue's retry); ``pause`` spaces the
    effects so random kills land mid-task; ``linger`` makes the first execution
    wait that long after its last effect (a kill there delivers the task again).
    ``retries`` (the queue's retry count of this execution) goes on the ledger's
    ``start`` event; every execution that does not die notes ``stop``, and an
    effect that returns another value than the one it applied notes ``wrong``.
    """
    run = effectq.active_run()
    ledger.note("start", task=task_no, retries=retries)
    try:
        for index in range(effects):
            value = apply(task_no, index)
            if isinstance(value, str) and value != _identity(task_no, index):
                ledger.note("wrong", task=task_no, index=index, value=value)
            if index + 1 == hold_after and ledger.arm(f"task:{task_no}"):
                ledger.note("armed", task=task_no, after=index + 1)
                time.sleep(600)  # until the harness kills this worker
            if index + 1 == retry_after and ledger.arm(f"retry:{task_no}"):
                ledger.note("retry", task=task_no, after=index + 1)
                retry()
            if pause:
                time.sleep(pause)
        if linger and ledger.arm(f"linger:{task_no}"):
            _linger(linger)  # the first execution waits here, its effects applied, where kills land
    except OutcomeUnknown as exc:
        ledger.note("unknown", task=task_no, key=exc.key)
        raise
    except BaseException as exc:
        if type(exc).__name__ in _TIME_LIMITS:
            ledger.note("time_limit", task=task_no)
        raise
    finally:
        ledger.note("stop", task=task_no)
    stats = run.stats if run is not None else None
    ledger.note(
        "done",
        task=task_no,
        replayed=stats.replayed if stats else 0,
        reconciled=stats.reconciled if stats else 0,
        executed=stats.executed if stats else effects,
    )
    return effects


CALLBACK_LINGER = 2.0
"""Seconds a chord's callback lingers after its effect on its first run, where kills land."""

_TIME_LIMITS = ("TimeLimitExceeded", "SoftTimeLimitExceeded")
"""The exceptions a task queue raises into a task that outran its time limit."""


def _slow(spec: str) -> tuple[int, float, int] | None:
    """``"INDEX:SECONDS[:EVERY]"`` parsed."""
    if not spec:
        return None
    index, seconds, every = [*spec.split(":"), "1"][:3]
    return int(index), float(seconds), max(1, int(every))


def _linger(seconds: float) -> None:
    """Sleep in short steps, so an exception a time limit raises into this thread lands on time."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def _effect(config: WorkloadConfig, ledger: Ledger) -> Any:
    """The effect every task applies: guarded by effectq, or plain when it is off."""
    slow, late = _slow(config.slow), _slow(config.late)
    data = _data(config)

    def side_effect(task_no: int, index: int, key: str = "", token: int = 0) -> str:
        data(task_no, index, "")
        if slow is not None and index == slow[0] and task_no % slow[2] == 0 and ledger.arm(f"slow:{task_no}"):
            _linger(slow[1])
        value = ledger.apply(_identity(task_no, index), idempotency_key=key, token=token)
        picked = late is not None and index == late[0] and task_no % late[2] == 1 % late[2]
        if late is not None and picked and ledger.arm(f"late:{task_no}"):
            _linger(late[1])
        if config.inside:
            time.sleep(config.inside)
        data(task_no, index, value)
        return value

    if config.effectq == "off":
        return side_effect

    def reconcile(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> str | None:
        return ledger.lookup(ctx.idempotency_key, token=ctx.token)

    @effectq.effect(name="chaos.apply", lease=config.lease, wait=config.lease * 3, reconcile=reconcile)
    def apply_guarded(task_no: int, index: int) -> str:
        ctx = effectq.current_effect()
        try:
            return side_effect(task_no, index, ctx.idempotency_key, ctx.token)
        except Fenced:
            ledger.note("fenced", task=task_no, index=index, token=ctx.token)
            raise

    return apply_guarded


def _data(config: WorkloadConfig) -> Any:
    """The task's data on the store's Redis: ``data(task, index, "")`` reads an effect's input,
    ``data(task, index, value)`` saves its result (kept a minute); nothing without ``reads``.

    A call sent to a frozen or cut-off Redis waits for its answer, as a task's call into a stalled
    database does; with ``reads_timeout``, only so long (redis-py 8 gives every client 5 s by
    default), then it raises redis-py's ``TimeoutError``: before the side effect (nothing
    applied) or after it (applied, its result unsaved). effectq takes either for maybe applied,
    and the reconcile hook asks the ledger which."""
    if not config.reads:
        return lambda task_no, index, value: None
    import redis

    timeout = config.reads_timeout or None
    client = redis.Redis.from_url(config.store, socket_timeout=timeout, socket_connect_timeout=timeout)

    def data(task_no: int, index: int, value: str) -> None:
        key = f"{config.prefix}data:{task_no}:{index}"
        if value:
            client.set(key, value, ex=60)
        else:
            client.get(key)

    return data


def _store(config: WorkloadConfig) -> Any:
    """The store workers use: the URL (built per process), or a ready store that injects faults."""
    if not config.faults:
        return config.store
    from effectq.store.redis import RedisStore
    from effectq.testing.faults import FaultyStore, parse_faults

    return FaultyStore(RedisStore.from_url(config.store, namespace=config.name), parse_faults(config.faults))


def _run_options(config: WorkloadConfig) -> dict[str, Any]:
    """The task options that name the run by a business key, when asked for."""
    if config.effectq == "on" and config.keyed_by == "business":
        return {"effectq_run_id": "chaos:{task_no}"}
    return {}


def _autoretries(config: WorkloadConfig, task_no: int) -> bool:
    """Whether this task's retry is a failure the queue retries with a backoff (else an explicit retry)."""
    return config.retry == "autoretry" or (config.retry == "mixed" and task_no % 2 == 1)


def _celery_app(config: WorkloadConfig, ledger: Ledger) -> Any:
    from celery import Celery

    celery_app = Celery(f"effectq-chaos-{config.name}", broker=config.broker)
    settings: dict[str, Any] = {"task_ignore_result": True, **config.results()}
    celery_app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_default_queue=config.queue,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": config.visibility,
            "unacked_restore_interval": 1,  # look for a dead worker's tasks every second (kombu >= 5.5)
            "unacked_restore_throttle": 1,
            "global_keyprefix": config.prefix,
        },
        **settings,
    )
    apply = _effect(config, ledger)
    if config.effectq == "on":
        import effectq.celery

        effectq.celery.install(
            celery_app, _store(config), namespace=config.name, in_progress_countdown=1.0, lease=config.lease
        )

    @celery_app.task(  # type: ignore[untyped-decorator]
        name="chaos.work",
        autoretry_for=(StoreError, Fenced, ConnectionError, Transient),
        retry_backoff=1,
        retry_backoff_max=5,
        max_retries=None,
        bind=True,
        **_run_options(config),
    )
    def chaos_work(
        self: Any, task_no: int, effects: int, hold_after: int = 0, pause: float = 0.0, retry_after: int = 0
    ) -> int:
        def retry() -> None:
            if _autoretries(config, task_no):
                raise Transient(f"task {task_no} failed after its first effects")
            raise self.retry(countdown=1 if config.retry else 0)

        retries = self.request.retries or 0
        return work(
            ledger,
            apply,
            task_no,
            effects,
            hold_after,
            pause,
            retry_after=retry_after,
            retry=retry,
            retries=retries,
        )

    if config.chord:
        _chord_callback(celery_app, config, ledger, apply)
    _note_failures(ledger)
    return celery_app


def _note_failures(ledger: Ledger) -> None:
    """Note ``failed`` when Celery gives a task up: it acks it, and nothing delivers it again."""
    from celery import signals

    def failed(sender: Any = None, args: Any = None, **_: Any) -> None:
        if getattr(sender, "name", "") == "chaos.work" and args:
            ledger.note("failed", task=args[0])

    signals.task_failure.connect(failed, weak=False)


def _chord_callback(celery_app: Any, config: WorkloadConfig, ledger: Ledger, apply: Any) -> None:
    """The chords' callback: one effect per chord, keyed by the chord's group id."""
    run_id = {"effectq_run_id": "chord:{request.group}"} if config.effectq == "on" else {}

    @celery_app.task(  # type: ignore[untyped-decorator]
        name="chaos.chord_done",
        autoretry_for=(StoreError, Fenced, ConnectionError),
        retry_backoff=1,
        retry_backoff_max=5,
        max_retries=None,
        bind=True,
        **run_id,
    )
    def chord_done(self: Any, results: list[int], task_no: int) -> int:
        retries = self.request.retries or 0
        return work(ledger, apply, task_no, 1, 0, 0.0, retries=retries, linger=CALLBACK_LINGER) + sum(results)


def _dramatiq_broker(config: WorkloadConfig, ledger: Ledger) -> Any:
    import dramatiq

    if config.broker.startswith("amqp"):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        dramatiq_broker: Any = RabbitmqBroker(url=config.broker)
    else:
        from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker

        dramatiq_broker = RedisBroker(  # type: ignore[no-untyped-call]
            url=config.broker,
            namespace=f"effectq-chaos-{config.name}",
            heartbeat_timeout=int(config.visibility * 1000),
            maintenance_chance=MAINTENANCE_SCALE,
        )
    from dramatiq.middleware import CurrentMessage

    dramatiq_broker.add_middleware(CurrentMessage())
    apply = _effect(config, ledger)
    if config.effectq == "on":
        from effectq.dramatiq import EffectMiddleware

        dramatiq_broker.add_middleware(EffectMiddleware(_store(config), namespace=config.name))
    dramatiq.set_broker(dramatiq_broker)

    @dramatiq.actor(
        actor_name="chaos_work",
        queue_name=config.queue,
        max_retries=1000,
        min_backoff=100,
        max_backoff=2000,
        time_limit=int(config.time_limit * 1000) or 600_000,
        **_run_options(config),
    )
    def chaos_work(
        task_no: int, effects: int, hold_after: int = 0, pause: float = 0.0, retry_after: int = 0
    ) -> None:
        def retry() -> None:
            if _autoretries(config, task_no):
                raise Transient(f"task {task_no} failed after its first effects")
            raise dramatiq.Retry(delay=1000 if config.retry else 0)

        message = CurrentMessage.get_current_message()
        retries = int(message.options.get("retries", 0)) if message is not None else 0
        work(
            ledger,
            apply,
            task_no,
            effects,
            hold_after,
            pause,
            retry_after=retry_after,
            retry=retry,
            retries=retries,
        )

    return dramatiq_broker


app: Any = None
"""The Celery app, when the environment says ``kind=celery``."""
broker: Any = None
"""The Dramatiq broker, when the environment says ``kind=dramatiq``."""

if os.environ.get(ENV_PREFIX + "KIND") and not os.environ.get(ENV_PREFIX + "APP"):  # APP: see .user
    _config = WorkloadConfig.from_env()
    _ledger = Ledger.from_url(_config.ledger, _config.name)
    if _config.kind == "celery":
        app = _celery_app(_config, _ledger)
    else:
        broker = _dramatiq_broker(_config, _ledger)
