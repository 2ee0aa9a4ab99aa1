"""What the Celery and Dramatiq integrations share.

* :class:`StoreSource`: a ready store, or a Redis URL turned into a store once per
  process, so a prefork child never talks through its parent's socket (and one for a
  single look, the start-up checks, that no process keeps).
* :func:`run_id_for`: the run id of one task execution: the task id / message id,
  or a business key (``"order:{order_id}"``, or a function of the arguments).
* :func:`task_effect`: a whole task body as one effect, keyed
  ``<run id>:task:<task name>``: a redelivered task that already completed gets
  its recorded return value back and the body does not run.
* :func:`log_finished`: the line an operator reads when a redelivered or retried
  task short-circuited effects.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .effect import Effect, effect
from .errors import ConfigurationError
from .runs import Run
from .store.base import Store

__all__ = [
    "RunIdSpec",
    "StoreSource",
    "TaskEffectSpec",
    "listed",
    "log_finished",
    "run_id_for",
    "task_effect",
    "task_key",
]

log_delivery = logging.getLogger("effectq.delivery")

RunIdSpec = str | Callable[..., str] | None
"""How a task names its run: ``None`` (the task id / message id), a template such as
``"order:{order_id}"`` filled from the arguments by name, or a function called with the
task's arguments that returns the run id."""

TaskEffectSpec = bool | Mapping[str, Any] | None
"""Whether a whole task is an effect: ``True``, or a mapping of :func:`effectq.effect`
options (``lease``, ``wait``, ``retention``, ``replay_safe``, ``result_type``...)."""

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.\-/@+]")


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
    spec: RunIdSpec, fn: Callable[..., Any], args: Any, kwargs: Any, *, default: str, task: str
) -> str:
    """The run id of one execution of ``fn(*args, **kwargs)`` (see :data:`RunIdSpec`)."""
    if spec is None:
        return default
    if callable(spec):
        value = spec(*(args or ()), **(kwargs or {}))
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"the run id function of task {task} returned {value!r}, not a string")
        return value
    if not isinstance(spec, str):
        raise ConfigurationError(
            f"effectq_run_id of task {task} must be a template or a function, not {spec!r}"
        )
    try:
        bound = inspect.signature(fn).bind(*(args or ()), **(kwargs or {}))
    except TypeError as exc:
        raise ConfigurationError(f"task {task}: the arguments do not fit its signature ({exc})") from exc
    bound.apply_defaults()
    try:
        return spec.format_map(bound.arguments)
    except (KeyError, IndexError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"effectq_run_id {spec!r} of task {task} names {exc} that the task does not take"
        ) from exc


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


def log_finished(run: Run, what: str, *, redelivered: bool) -> None:
    """Log how a task's effects went, at INFO when some were short-circuited."""
    stats = run.stats
    short = stats.replayed + stats.reconciled
    if short:
        log_delivery.info(
            "effectq %s (run %s)%s short-circuited %d effect(s): %d replayed, %d reconciled, %d executed",
            what,
            run.id,
            " was delivered again and" if redelivered else "",
            short,
            stats.replayed,
            stats.reconciled,
            stats.executed,
        )
    elif stats.executed or stats.failed:
        log_delivery.debug(
            "effectq %s (run %s): %d executed, %d failed", what, run.id, stats.executed, stats.failed
        )


def listed(names: list[str]) -> str:
    """Task or actor names for a start-up warning: the first five, then how many more."""
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
