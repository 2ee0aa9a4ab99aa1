"""What the Celery and Dramatiq integrations share.

* :class:`StoreSource`: a ready store, or a Redis URL turned into a store once per
  process, so a prefork child never talks through its parent's socket (and one for a
  single look, the start-up checks, that no process keeps).
* :func:`run_id_for`: the run id of one task execution: the task id / message id,
  or a business key (``"order:{order_id}"``, ``"chord:{request.group}"``, or a
  function of the arguments and the :class:`TaskRequest`).
* :func:`task_effect`: a whole task body as one effect, keyed
  ``<run id>:task:<task name>``: a redelivered task that already completed gets
  its recorded return value back and the body does not run.
* :func:`log_finished`: the line an operator reads when a redelivered or retried
  task short-circuited effects.
* :data:`STOPS_TASK` and :func:`stopped`: the errors that fail a task for good, never
  retried by its retry policy, and the copy of one a result backend keeps.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .effect import Effect, effect
from .errors import AttemptsExhausted, ConfigurationError, EffectqError, OutcomeUnknown, RecordedFailure
from .runs import Run
from .store.base import Store

__all__ = [
    "STOPS_TASK",
    "RunIdSpec",
    "StoreSource",
    "TaskEffectSpec",
    "TaskRequest",
    "listed",
    "log_finished",
    "run_id_for",
    "stopped",
    "task_effect",
    "task_key",
]

log_delivery = logging.getLogger("effectq.delivery")

RunIdSpec = str | Callable[..., str] | None
"""How a task names its run: ``None`` (the task id / message id); a template such as
``"order:{order_id}"`` filled from the arguments by name, whose ``{request.group}``,
``{request.root_id}``, ``{request.parent_id}`` and ``{request.id}`` name the delivery
(see :class:`TaskRequest`); a function called with the task's arguments; or a function
``(args, request)`` (its second parameter named ``request``) called with the arguments by
name and the :class:`TaskRequest`."""

TaskEffectSpec = bool | Mapping[str, Any] | None
"""Whether a whole task is an effect: ``True``, or a mapping of :func:`effectq.effect`
options (``lease``, ``wait``, ``retention``, ``replay_safe``, ``result_type``...)."""

STOPS_TASK: tuple[type[EffectqError], ...] = (OutcomeUnknown, AttemptsExhausted, RecordedFailure)
"""The errors that stop a task: it fails once and its retry policy (Celery's ``autoretry_for``
or ``self.retry``, Dramatiq's Retries) does not retry it, since a retry would only raise the
same error again at once. An operator must act first: settle an unknown outcome, or reset a
parked key (its attempts ran out, or it recorded a terminal failure); each error's message
names the key and the command."""

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.\-/@+]")


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """What a run id may name of a task's delivery besides its arguments (from Celery's
    ``task.request``).

    Attributes:
        id: the task id.
        group: the id of the group the task belongs to: a group's tasks, and a chord's header
            tasks and its callback (the chord's group id); ``None`` outside a group.
        root_id: the id of the first task of the workflow (the first task of a chain).
        parent_id: the id of the task that sent this one (the previous task of a chain).
    """

    id: str
    group: str | None = None
    root_id: str | None = None
    parent_id: str | None = None


_REQUEST_FIELDS = ("id", "group", "root_id", "parent_id")


class _RequestFields:
    """``request`` in a run id template: each field it names must be set for this delivery
    (``"chord:{request.group}"`` for a task outside a group is an error, never ``"chord:None"``)."""

    def __init__(self, request: TaskRequest, spec: str, task: str) -> None:
        self._request, self._spec, self._task = request, spec, task

    def __getattr__(self, name: str) -> str:
        if name not in _REQUEST_FIELDS:
            raise ConfigurationError(
                f"effectq_run_id {self._spec!r} of task {self._task} names request.{name}; "
                f"a run id may name request.{', request.'.join(_REQUEST_FIELDS)}"
            )
        value: str | None = getattr(self._request, name)
        if not value:
            raise ConfigurationError(
                f"effectq_run_id {self._spec!r} of task {self._task} names request.{name}, "
                f"which task {self._request.id} does not have (sent outside a group or workflow?)"
            )
        return value

    def __format__(self, spec: str) -> str:
        raise ConfigurationError(
            f"effectq_run_id {self._spec!r} of task {self._task} names the whole request; "
            f"name one of its fields: request.{', request.'.join(_REQUEST_FIELDS)}"
        )


class StoreSource:
    """A store, or a ``redis://`` URL made into a store in each process that uses it.

    Args:
        store: a ready :class:`~effectq.Store`, or a Redis URL.
        namespace: the namespace of a store built from a URL.
        **redis_options: passed to :meth:`effectq.RedisStore.from_url`.
    """

    def __init__(self, store: Store | str, *, namespace: str = "default", **redis_options: Any) -> None:
        if isinstance(store, str):
            self._url: str | None = store
            self._store: Store | None = None
        elif isinstance(store, Store):
            self._url, self._store = None, store
        else:
            raise ConfigurationError(f"store must be an effectq Store or a redis:// URL, not {store!r}")
        self._namespace = namespace
        self._options = redis_options
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StoreSource({self._url or self._store!r})"

    @property
    def url(self) -> str | None:
        """The URL stores are built from, or ``None`` for a ready store."""
        return self._url

    def get(self) -> Store:
        """This process's store (built on first use, and again after a fork)."""
        store = self._store
        if store is not None and (self._url is None or self._pid == os.getpid()):
            return store
        with self._lock:
            if self._store is None or self._pid != os.getpid():
                from .store.redis import RedisStore

                assert self._url is not None
                self._store = RedisStore.from_url(self._url, namespace=self._namespace, **self._options)
                self._pid = os.getpid()
            return self._store

    @contextlib.contextmanager
    def probe(self) -> Iterator[Store]:
        """A store for one look (the start-up checks): the ready store, or one built from the
        URL for the look and closed after it, so a process that forks workers keeps none."""
        if self._store is not None and self._url is None:
            yield self._store
            return
        from .store.redis import RedisStore

        assert self._url is not None
        store = RedisStore.from_url(self._url, namespace=self._namespace, **self._options)
        try:
            yield store
        finally:
            with contextlib.suppress(Exception):
                store.close()
                store.client.close()

    def reset(self) -> None:
        """Forget a store built from the URL (the next :meth:`get` builds a new one)."""
        if self._url is None:
            return
        with self._lock:
            built, self._store = self._store, None
        close = getattr(built, "close", None)
        if close is not None:
            close()


def run_id_for(
    spec: RunIdSpec,
    fn: Callable[..., Any],
    args: Any,
    kwargs: Any,
    *,
    default: str,
    task: str,
    request: TaskRequest | Callable[[], TaskRequest] | None = None,
) -> str:
    """The run id of one execution of ``fn(*args, **kwargs)`` (see :data:`RunIdSpec`).

    ``request`` is what the template's ``{request.X}`` fields and a ``(args, request)``
    function see, or a function that makes it (called only for a spec, so a task without
    one builds none); without it (``None``) they are an error.
    """
    if spec is None:
        return default
    if callable(request):
        request = request()
    if callable(spec):
        if _takes_request(spec):
            if request is None:
                raise ConfigurationError(
                    f"the run id function of task {task} takes a request; none is known here"
                )
            value = spec(dict(_bind(fn, args, kwargs, task).arguments), request)
        else:
            value = spec(*(args or ()), **(kwargs or {}))
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"the run id function of task {task} returned {value!r}, not a string")
        return value
    if not isinstance(spec, str):
        raise ConfigurationError(
            f"effectq_run_id of task {task} must be a template or a function, not {spec!r}"
        )
    names: dict[str, Any] = {} if request is None else {"request": _RequestFields(request, spec, task)}
    names.update(_bind(fn, args, kwargs, task).arguments)  # an argument named ``request`` wins
    try:
        return spec.format_map(names)
    except ConfigurationError:
        raise
    except (KeyError, IndexError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"effectq_run_id {spec!r} of task {task} names {exc} that the task does not take"
        ) from exc


def _bind(fn: Callable[..., Any], args: Any, kwargs: Any, task: str) -> inspect.BoundArguments:
    try:
        bound = inspect.signature(fn).bind(*(args or ()), **(kwargs or {}))
    except TypeError as exc:
        raise ConfigurationError(f"task {task}: the arguments do not fit its signature ({exc})") from exc
    bound.apply_defaults()
    return bound


def _takes_request(fn: Callable[..., Any]) -> bool:
    """Whether a run id function has the ``(args, request)`` form: two parameters, the second
    named ``request``. Any other function is called with the task's arguments."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return (
        len(parameters) == 2
        and all(p.kind in positional for p in parameters)
        and parameters[1].name == "request"
    )


def task_key(run_id: str, task: str) -> str:
    """The effect key of a whole task: ``<run id>:task:<task name>``."""
    return f"{run_id}:task:{task}"


def task_effect(fn: Callable[..., Any], task: str, spec: TaskEffectSpec) -> Effect[..., Any]:
    """Wrap a task body as one effect keyed by :func:`task_key`.

    It is ``replay_safe`` unless the spec says otherwise: a task killed halfway is
    run again when redelivered (the effects inside it guard themselves), while a
    task that completed is not.
    """
    options: dict[str, Any] = {"replay_safe": True}
    if isinstance(spec, Mapping):
        for forbidden in ("key", "name", "key_args"):
            if forbidden in spec:
                raise ConfigurationError(
                    f"effectq_task of {task}: {forbidden!r} is fixed (the task's identity)"
                )
        options.update(spec)
    elif spec is not True:
        raise ConfigurationError(
            f"effectq_task of {task} must be True or a mapping of effect options, not {spec!r}"
        )
    name = "task." + _UNSAFE_NAME.sub("_", task)[:190]
    return effect(name=name, key=lambda _args, ctx: task_key(ctx.run_id, task), **options)(fn)


def log_finished(run: Run, what: str | Callable[[], str], *, redelivered: bool) -> None:
    """Log how a task's effects went, at INFO when some were short-circuited.

    ``what`` names the task, or is a function that does, called only when a line is logged.
    """
    stats = run.stats
    short = stats.replayed + stats.reconciled
    if short:
        log_delivery.info(
            "effectq %s (run %s)%s short-circuited %d effect(s): %d replayed, %d reconciled, %d executed",
            what() if callable(what) else what,
            run.id,
            " was delivered again and" if redelivered else "",
            short,
            stats.replayed,
            stats.reconciled,
            stats.executed,
        )
    elif (stats.executed or stats.failed) and log_delivery.isEnabledFor(logging.DEBUG):
        log_delivery.debug(
            "effectq %s (run %s): %d executed, %d failed",
            what() if callable(what) else what,
            run.id,
            stats.executed,
            stats.failed,
        )


def stopped(exc: EffectqError) -> EffectqError:
    """A fresh copy of a :data:`STOPS_TASK` error, made from its arguments: without the stored
    record, the cause or the traceback, as a result backend keeps and rebuilds it."""
    return type(exc)(*exc.args)


def listed(names: list[str]) -> str:
    """Task or actor names for a start-up warning: the first five, then how many more."""
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
