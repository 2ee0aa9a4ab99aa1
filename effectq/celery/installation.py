"""Bind a run for every task of a Celery app, and turn effect outcomes into task outcomes.

Two mechanisms, each where Celery is reliable:

* ``task_prerun`` / ``task_postrun`` (sent around every execution, eager or in a
  worker, in the thread that runs the task) bind and clear the run. The binding
  is a :class:`contextvars.ContextVar`, so prefork, solo, threads and gevent pools
  never see another task's run.
* Each task's ``run`` is wrapped once, inside Celery's own ``autoretry_for``
  wrapper (the way Celery wraps it), so :class:`~effectq.InProgress` becomes a
  retry with a countdown and :class:`~effectq.OutcomeUnknown` (like each error of
  :data:`~effectq.integration.STOPS_TASK`: a parked key too) a failure that is not
  retried; a task declared with ``effectq_task=True`` runs its body as one effect.

The store and the options come from :func:`install`'s arguments, else from the app's
configuration (``effectq_url``, ``effectq_namespace``... read the way Celery reads its own
settings, so ``CELERY_EFFECTQ_URL`` works under ``namespace="CELERY"``), else from
``EFFECTQ_URL`` / ``EFFECTQ_NAMESPACE``. They are read when first needed (never while the
app's configuration may still be loading, as Django's settings are while they import the
Celery app: :mod:`.settings`), and a worker refuses to start without a store.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, NamedTuple

from celery import bootsteps

from .._runtime.leases import heartbeat
from ..errors import ConfigurationError, EffectqError, InProgress
from ..integration import STOPS_TASK, StoreSource, TaskRequest, log_finished, run_id_for, stopped, task_effect
from ..runs import Run, RunScope
from ..runs import run as bind_run
from ..store.base import Store
from .checks import log_problems
from .settings import SETTINGS, Settings, read_settings

__all__ = ["SETTINGS", "Installation", "Settings", "SettingsStep", "install", "read_settings"]

log = logging.getLogger("effectq.celery")
log_retry = logging.getLogger("effectq.celery.retry")
log_unknown = logging.getLogger("effectq.celery.unknown")

_APP_ATTRIBUTE = "effectq_installation"


class _Bound(NamedTuple):
    task_id: str
    scope: RunScope | None
    parent: _Bound | None


_bound: ContextVar[_Bound | None] = ContextVar("effectq.celery.bound", default=None)


class Installation:
    """effectq installed on one Celery app; :meth:`uninstall` disconnects it.

    Attributes:
        app: the Celery app.
    """

    def __init__(self, app: Any, given: Mapping[str, Any]) -> None:
        self.app = app
        self._given = dict(given)
        self._lock = threading.Lock()
        self._settings: Settings | None = None
        self._source: StoreSource | None = None
        self._receivers: list[tuple[Any, Callable[..., Any]]] = []

    def __repr__(self) -> str:
        return f"<effectq installation on {self.app.main or self.app!r}>"

    @property
    def settings(self) -> Settings:
        """The settings, read on first use (see :func:`read_settings`)."""
        if self._settings is None:
            with self._lock:
                if self._settings is None:
                    settings = read_settings(self.app, self._given)
                    self._source = StoreSource(
                        settings.store, namespace=settings.namespace, **settings.redis_options
                    )
                    self._settings = settings
        return self._settings

    @property
    def source(self) -> StoreSource:
        """Where each process gets its store."""
        self.settings  # noqa: B018 - reads the settings and builds the source
        assert self._source is not None
        return self._source

    @property
    def in_progress_countdown(self) -> float:
        """Seconds before the retry an in-flight effect causes."""
        return self.settings.in_progress_countdown

    @property
    def store(self) -> Store:
        """This process's store."""
        return self.source.get()

    # -- wiring ------------------------------------------------------------------------

    def _connect(self) -> None:
        from celery import signals

        for signal, receiver in (
            (signals.task_prerun, self._on_prerun),
            (signals.task_postrun, self._on_postrun),
            (signals.worker_init, self._on_worker_init),
            (signals.worker_process_init, self._on_process_init),
            (signals.worker_shutdown, self._on_shutdown),
            (signals.worker_process_shutdown, self._on_shutdown),
            (self.app.on_after_finalize, self._on_finalize),
        ):
            signal.connect(receiver, weak=False)
            self._receivers.append((signal, receiver))
        self.app.steps["worker"].add(SettingsStep)
        if self.app.finalized:
            self.guard_all()

    def uninstall(self) -> None:
        """Disconnect every signal (tasks keep their wrapper, which passes through)."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()
        self.app.steps["worker"].discard(SettingsStep)
        if getattr(self.app, _APP_ATTRIBUTE, None) is self:
            delattr(self.app, _APP_ATTRIBUTE)

    def guard_all(self) -> None:
        """Wrap every task of the app (idempotent)."""
        for name, task in list(self.app.tasks.items()):
            if not name.startswith("celery."):
                self.guard(task)

    def guard(self, task: Any) -> None:
        """Wrap one task's body: outcomes become retries/failures; ``effectq_task`` makes it an effect."""
        if getattr(task, "_effectq_guarded", False):
            return
        attribute = "_orig_run" if "_orig_run" in vars(task) else "run"
        inner: Callable[..., Any] = getattr(task, attribute)
        spec = getattr(task, "effectq_task", None)
        if spec:
            inner = task_effect(inner, task.name, spec)
        # Read once: a static lookup walks the class's MRO, and a function stays unbound.
        task._effectq_run_id = inspect.getattr_static(task, "effectq_run_id", None)
        setattr(task, attribute, _guarded(self, task, inner))
        task._effectq_guarded = True

    # -- signal receivers ----------------------------------------------------------------

    def _on_finalize(self, sender: Any = None, **_: Any) -> None:
        if sender is self.app:
            self.guard_all()

    def _on_worker_init(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not self.app:
            return
        self.guard_all()
        try:
            settings = self.settings
        except ConfigurationError:
            return  # SettingsStep raises it next, and the worker does not start
        with self.source.probe() as store:  # what fails here Celery logs; the worker starts anyway
            log_problems(
                self.app,
                in_progress_countdown=settings.in_progress_countdown,
                store=store,
                lease=settings.lease,
                retention=settings.retention,
                pool=getattr(sender, "pool_cls", None),
            )

    def _on_process_init(self, **_: Any) -> None:
        if self.source.url is not None:
            self.source.reset()
            self.source.get()

    def _on_shutdown(self, **_: Any) -> None:
        """Writes the heartbeat still retries get one more try; each that does not land is logged
        with what to do (a prefork child ends without running ``atexit``)."""
        heartbeat.settle_repairs(why="the worker shut down")

    def _on_prerun(self, sender: Any = None, task_id: str = "", task: Any = None, **kw: Any) -> None:
        if task is None or task.app is not self.app:
            return
        scope: RunScope | None = None
        try:
            self.guard(task)
            scope = self._scope(task, task_id, kw.get("args"), kw.get("kwargs"))
            scope.__enter__()
        except Exception:
            # Nothing bound: every effect of this task raises NoActiveRun (not claimed, not run).
            log.exception(
                "effectq could not bind a run for task %s[%s]; its effects will not run", task.name, task_id
            )
            scope = None
        _bound.set(_Bound(task_id, scope, _bound.get()))

    def _scope(self, task: Any, task_id: str, args: Any, kwargs: Any) -> RunScope:
        request = task.request
        delivery = request.delivery_info or {}
        run_id = run_id_for(
            task._effectq_run_id,  # guard() read it, and _on_prerun guards every task first
            task.run,
            args,
            kwargs,
            default=task_id,
            task=task.name,
            request=functools.partial(_task_request, task_id, request),  # made only for a spec
        )
        return bind_run(
            run_id,
            store=self.source.get(),
            task=task.name,
            task_id=task_id,
            retries=request.retries or 0,
            redelivered=bool(delivery.get("redelivered")),
            hostname=request.hostname,
        )

    def _on_postrun(self, sender: Any = None, task_id: str = "", task: Any = None, **_: Any) -> None:
        top = _bound.get()
        if top is None or top.task_id != task_id:
            return
        _bound.set(top.parent)
        if top.scope is None:
            return
        bound = top.scope.run
        top.scope.__exit__(None, None, None)
        try:
            _log_run(task, bound)
        except Exception:  # a log line must never fail a task
            log.exception("effectq could not log the end of task %s", task_id)


def _task_request(task_id: str, request: Any) -> TaskRequest:
    return TaskRequest(
        id=task_id,
        group=getattr(request, "group", None),
        root_id=getattr(request, "root_id", None),
        parent_id=getattr(request, "parent_id", None),
    )


def _log_run(task: Any, bound: Run) -> None:
    meta = bound.metadata
    redelivered = bool(meta.get("redelivered")) or bool(meta.get("retries"))
    log_finished(bound, lambda: f"task {task.name}[{meta.get('task_id')}]", redelivered=redelivered)


def _guarded(installation: Installation, task: Any, inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        except InProgress as exc:
            raise _retry_in_progress(installation, task, exc) from exc
        except STOPS_TASK as exc:
            raise _stop(task, exc) from exc

    run.__effectq_inner__ = inner  # type: ignore[attr-defined]
    return run


def _retry_in_progress(installation: Installation, task: Any, exc: InProgress) -> BaseException:
    """The same task id runs elsewhere (visibility timeout, consumer timeout, retry before ack): retry later.

    The retry does not count against ``max_retries``; it is bounded by the holder's lease.
    """
    request = task.request
    limit = task.max_retries
    if limit is not None:
        limit = max(limit, (request.retries or 0) + 1)
    countdown = installation.in_progress_countdown
    log_retry.warning(
        "effectq task %s[%s]: effect %s is in flight elsewhere (holder %s); retrying in %gs",
        task.name,
        request.id,
        exc.key,
        exc.owner or "?",
        countdown,
    )
    retry: BaseException = task.retry(exc=exc, countdown=countdown, max_retries=limit, throw=False)
    return retry


def _stop(task: Any, exc: EffectqError) -> BaseException:
    """Record the task as failed with ``exc`` (one of ``STOPS_TASK``), and stop: never retry it
    in a loop, since an operator must act first."""
    from celery.exceptions import Ignore

    request = task.request
    log_unknown.error(
        "effectq task %s[%s] stopped and is not retried: %s. Send the task again once that is done.",
        task.name,
        request.id,
        str(exc).rstrip("."),
    )
    try:
        task.backend.mark_as_failure(request.id, stopped(exc), request=request)
    except Exception as store_exc:  # no result backend, or it failed: the log line above stands
        log_unknown.debug("effectq could not record the failure of %s: %s", request.id, store_exc)
    stop: BaseException = Ignore(f"effectq stopped the task: {type(exc).__name__}")
    return stop


class SettingsStep(bootsteps.Step):  # type: ignore[misc]
    """A worker of an app whose effectq settings are incomplete or wrong does not start: the
    :class:`~effectq.ConfigurationError` ends ``celery worker`` before it consumes a task."""

    name = "effectq.settings"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        installation = getattr(parent.app, _APP_ATTRIBUTE, None)
        if installation is not None:
            installation.settings  # noqa: B018 - raises when they are incomplete
        super().__init__(parent, **kwargs)


def install(
    app: Any,
    store: Store | str | None = None,
    *,
    namespace: str | None = None,
    in_progress_countdown: float | timedelta | None = None,
    lease: float | timedelta | None = None,
    retention: float | timedelta | None = None,
    **redis_options: Any,
) -> Installation:
    """Make every effect called inside a task of ``app`` keyed by that task.

    The run id is the task id (stable across broker redelivery and
    ``self.retry()``), or the task's ``effectq_run_id`` option. A task with
    ``effectq_task=True`` runs its body as one effect. When a worker starts, the
    configuration is checked and each problem logged (see :func:`effectq.celery.check`).

    Each argument left out is read from the app's configuration, the way Celery reads
    its own settings: ``effectq_url``, ``effectq_namespace``, ``effectq_in_progress_countdown``,
    ``effectq_lease``, ``effectq_retention`` and ``effectq_redis_options`` (a dict), or,
    with ``app.config_from_object("django.conf:settings", namespace="CELERY")``,
    ``CELERY_EFFECTQ_URL`` and so on. The store and namespace fall back to ``EFFECTQ_URL``
    and ``EFFECTQ_NAMESPACE``. They are read when first needed: at once if the app's
    configuration is already loaded, else when a worker starts (which refuses to start
    without a store) or a task first runs.

    Args:
        app: the Celery app.
        store: an effectq store, or a ``redis://`` URL: each worker process (each
            prefork child) then builds its own connection after the fork.
        namespace: the namespace of a store built from a URL (``default``).
        in_progress_countdown: seconds before retrying a task whose effect is in
            flight elsewhere (5).
        lease: the longest effect lease the app's effects use, for the start-up check (60 s).
        retention: the shortest effect retention the app's effects use, for the check (7 days).
        **redis_options: passed to :meth:`effectq.RedisStore.from_url` (over
            ``effectq_redis_options``).

    Raises:
        ConfigurationError: effectq is already installed on the app; or, when the app's
            configuration is already loaded, no store is given anywhere or an option is wrong.

    Example:
        >>> effectq.celery.install(app, "redis://127.0.0.1:6379/0", namespace="shop")
        >>> effectq.celery.install(app)  # settings.py: CELERY_EFFECTQ_URL = "redis://..."
    """
    if getattr(app, _APP_ATTRIBUTE, None) is not None:
        raise ConfigurationError(f"effectq is already installed on {app!r}; uninstall() it first")
    given: dict[str, Any] = {
        "store": store,
        "namespace": namespace,
        "in_progress_countdown": in_progress_countdown,
        "lease": lease,
        "retention": retention,
        "redis_options": redis_options,
    }
    installation = Installation(app, {k: v for k, v in given.items() if v is not None})
    if app.configured:  # reading it now loads nothing: a missing store is an error here
        installation.settings  # noqa: B018
    setattr(app, _APP_ATTRIBUTE, installation)
    installation._connect()
    return installation
