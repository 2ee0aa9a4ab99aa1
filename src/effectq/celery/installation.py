"""Bind a run for every task of a Celery app, and turn effect outcomes into task outcomes.

Two mechanisms, each where Celery is reliable:

* ``task_prerun`` / ``task_postrun`` (sent around every execution, eager or in a
  worker, in the thread that runs the task) bind and clear the run. The binding
  is a :class:`contextvars.ContextVar`, so prefork, solo, threads and gevent pools
  never see another task's run.
* Each task's ``run`` is wrapped once, inside Celery's own ``autoretry_for``
  wrapper (the way Celery wraps it), so :class:`~effectq.InProgress` becomes a
  retry with a countdown and :class:`~effectq.OutcomeUnknown` a failure that is
  not retried; a task declared with ``effectq_task=True`` runs its body as one
  effect.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, NamedTuple

from ..errors import ConfigurationError, InProgress, OutcomeUnknown
from ..heartbeat import heartbeat
from ..integration import StoreSource, log_finished, run_id_for, task_effect
from ..runs import Run, RunScope
from ..runs import run as bind_run
from ..store.base import Store
from .checks import log_problems

__all__ = ["Installation", "install"]

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
        source: where each process gets its store.
        in_progress_countdown: seconds before the retry an in-flight effect causes.
    """

    def __init__(
        self,
        app: Any,
        source: StoreSource,
        *,
        in_progress_countdown: float,
        check_options: dict[str, Any],
    ) -> None:
        self.app = app
        self.source = source
        self.in_progress_countdown = in_progress_countdown
        self._check_options = check_options
        self._receivers: list[tuple[Any, Callable[..., Any]]] = []

    def __repr__(self) -> str:
        return f"<effectq installation on {self.app.main or self.app!r}>"

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
        if self.app.finalized:
            self.guard_all()

    def uninstall(self) -> None:
        """Disconnect every signal (tasks keep their wrapper, which passes through)."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()
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
        with self.source.probe() as store:  # what fails here Celery logs; the worker starts anyway
            log_problems(
                self.app, in_progress_countdown=self.in_progress_countdown, store=store, **self._check_options
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
            inspect.getattr_static(task, "effectq_run_id", None),  # a function stays unbound
            task.run,
            args,
            kwargs,
            default=task_id,
            task=task.name,
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


def _log_run(task: Any, bound: Run) -> None:
    meta = bound.metadata
    redelivered = bool(meta.get("redelivered")) or bool(meta.get("retries"))
    log_finished(bound, f"task {task.name}[{meta.get('task_id')}]", redelivered=redelivered)


def _guarded(installation: Installation, task: Any, inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        except InProgress as exc:
            raise _retry_in_progress(installation, task, exc) from exc
        except OutcomeUnknown as exc:
            raise _fail_unknown(task, exc) from exc

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


def _fail_unknown(task: Any, exc: OutcomeUnknown) -> BaseException:
    """Record the task as failed with the OutcomeUnknown, and stop: never retry it in a loop."""
    from celery.exceptions import Ignore

    request = task.request
    log_unknown.error(
        "effectq task %s[%s] stopped: effect %s may have applied (key %s; %s). It is not retried; "
        "settle it with `effectq resolve` or give the effect a reconcile hook, then send the task again.",
        task.name,
        request.id,
        exc.name,
        exc.key,
        exc.reason or "outcome unknown",
    )
    # A fresh one, without the record and the traceback: what a result backend keeps and rebuilds.
    recorded = OutcomeUnknown(exc.key, name=exc.name, reason=exc.reason, namespace=exc.namespace)
    try:
        task.backend.mark_as_failure(request.id, recorded, request=request)
    except Exception as store_exc:  # no result backend, or it failed: the log line above stands
        log_unknown.debug("effectq could not record the failure of %s: %s", request.id, store_exc)
    stop: BaseException = Ignore(f"effect outcome unknown: {exc.key}")
    return stop


def install(
    app: Any,
    store: Store | str,
    *,
    namespace: str = "default",
    in_progress_countdown: float | timedelta = 5.0,
    lease: float | timedelta = 60.0,
    retention: float | timedelta = timedelta(days=7),
    **redis_options: Any,
) -> Installation:
    """Make every effect called inside a task of ``app`` keyed by that task.

    The run id is the task id (stable across broker redelivery and
    ``self.retry()``), or the task's ``effectq_run_id`` option. A task with
    ``effectq_task=True`` runs its body as one effect. When a worker starts, the
    configuration is checked and each problem logged (see :func:`effectq.celery.check`).

    Args:
        app: the Celery app.
        store: an effectq store, or a ``redis://`` URL: each worker process (each
            prefork child) then builds its own connection after the fork.
        namespace: the namespace of a store built from a URL.
        in_progress_countdown: seconds before retrying a task whose effect is in
            flight elsewhere.
        lease: the longest effect lease the app's effects use (for the start-up check).
        retention: the shortest effect retention the app's effects use (for the check).
        **redis_options: passed to :meth:`effectq.RedisStore.from_url`.

    Example:
        >>> effectq.celery.install(app, "redis://127.0.0.1:6379/0", namespace="shop")
    """
    from ..options import seconds

    if getattr(app, _APP_ATTRIBUTE, None) is not None:
        raise ConfigurationError(f"effectq is already installed on {app!r}; uninstall() it first")
    installation = Installation(
        app,
        StoreSource(store, namespace=namespace, **redis_options),
        in_progress_countdown=seconds(in_progress_countdown, option="in_progress_countdown"),
        check_options={"lease": lease, "retention": retention},
    )
    setattr(app, _APP_ATTRIBUTE, installation)
    installation._connect()
    return installation
