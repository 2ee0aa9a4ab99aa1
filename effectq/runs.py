"""Runs: the unit of work (a task, a message, an agent run) effects are keyed by.

A run is bound with ``with effectq.run(run_id, store=store):`` (or ``async with``)
or by the Celery and Dramatiq integrations, which use the task id / message id.
The binding lives in a :class:`contextvars.ContextVar`, so it follows asyncio
tasks and never leaks between tasks of one worker process. Threads you start
yourself do not inherit it: run them in ``contextvars.copy_context()``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .errors import ConfigurationError, NoActiveRun
from .keys import check_run_id
from .store.base import AsyncStore, Store

__all__ = [
    "Run",
    "RunScope",
    "RunStats",
    "active_run",
    "current_run",
    "get_default_store",
    "run",
    "set_default_store",
]

_current: ContextVar[Run | None] = ContextVar("effectq.run", default=None)
_default_store: Store | None = None
_default_lock = threading.Lock()
_ordinals = threading.Lock()
"""Guards every run's call counts (:meth:`Run.next_ordinal`): one lock for all runs, held for two
dict operations, rather than one made per run that most runs take once or twice. A forked child
gets a new one: the thread that held it at the fork is not in the child."""


def _new_ordinals_lock() -> None:
    global _ordinals
    _ordinals = threading.Lock()


os.register_at_fork(after_in_child=_new_ordinals_lock)


@dataclass(slots=True)
class RunStats:
    """What happened to the effects of one run, for logs and integrations."""

    executed: int = 0
    """Effects applied by this run (the function ran and returned)."""
    replayed: int = 0
    """Effects short-circuited with a recorded result."""
    waited: int = 0
    """Calls that waited for the same effect in flight elsewhere."""
    reconciled: int = 0
    """Effects a reconcile hook found already applied."""
    failed: int = 0
    """Calls that raised (the function, or an unknown / in-progress outcome)."""


class Run:
    """One bound run.

    Attributes:
        id: the run id (task id, message id, or a business key).
        store: where this run's effects are recorded.
        metadata: whatever the binder attached (task name, delivery info, ...).
        stats: counters of what the run's effects did.
    """

    __slots__ = (
        "_calls",
        "_pending",
        "_pending_async",
        "_seq",
        "id",
        "metadata",
        "prefetch_tried",
        "prefetched",
        "stats",
        "store",
        "task",
        "thread",
    )

    def __init__(self, run_id: str, store: Store, metadata: Mapping[str, Any] | None = None) -> None:
        self.id = check_run_id(run_id)
        if type(store) not in _subclasses:
            _check_capabilities(store)
        self.store = store
        self.metadata: Mapping[str, Any] = dict(metadata) if metadata else {}
        self.stats = RunStats()
        self._calls: dict[str, int] = {}
        self._seq = 0
        # Stores with replies left to read at the run's end: none until a completion is
        # pipelined (a replayed run never has one), so no list is made before.
        self._pending: list[Store] | tuple[()] = ()
        self._pending_async: list[AsyncStore] | tuple[()] = ()
        self.prefetched: Any = None
        """The run's completed records, fetched at once when a replay shows a redelivery."""
        self.prefetch_tried = False
        self.thread: int | None = None
        """The thread that entered the run's scope, while it is entered: whose scope's end reads
        the replies its effects' completions left unread (see :meth:`RunScope.__exit__`)."""
        self.task: asyncio.Task[Any] | None = None
        """The asyncio task that entered the run's scope with ``async with``, while it is
        entered: whose scope's end reads the replies its async effects left unread."""

    def __repr__(self) -> str:
        return f"Run({self.id!r}, store={self.store!r})"

    def next_ordinal(self, name: str) -> tuple[int, int]:
        """(how many calls of ``name`` came before in this run, how many calls of any effect)."""
        with _ordinals:
            ordinal = self._calls.get(name, 0)
            self._calls[name] = ordinal + 1
            seq = self._seq
            self._seq = seq + 1
        return ordinal, seq

    def pending(self, store: Store) -> None:
        """``store`` got a pipelined completion from the thread that entered the run: the
        run's end reads its reply, if nothing read it before (``store.flush_pending()``)."""
        pending = self._pending
        if store not in pending:
            self._pending = [*pending, store]

    def pending_async(self, store: AsyncStore) -> None:
        """:meth:`pending` for a pipelined completion from the task that entered the run."""
        pending = self._pending_async
        if store not in pending:
            self._pending_async = [*pending, store]

    def calls(self, name: str) -> int:
        """How many calls of the effect or step ``name`` this run has made so far.

        A key function can key an effect by the agent step it belongs to, e.g.
        ``f"{ctx.run_id}:comment:{args['issue']}:{ctx.run.calls('agent.model')}"``: a
        redelivered run replays its steps in the same order, so the count is the same.
        """
        return self._calls.get(name, 0)


class RunScope:
    """Binds a :class:`Run` for a ``with`` or ``async with`` block (see :func:`run`)."""

    __slots__ = ("_run", "_token")

    def __init__(self, bound: Run) -> None:
        self._run = bound
        self._token: Token[Run | None] | None = None

    @property
    def run(self) -> Run:
        return self._run

    def __enter__(self) -> Run:
        if self._token is not None:
            raise RuntimeError("this run scope is already entered; call effectq.run() again")
        self._token = _current.set(self._run)
        self._run.thread = threading.get_ident()
        return self._run

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Unbind the run, once every completion its effects wrote has been answered.

        An effect's completion is written before the effect returns, and its reply
        read by the next script on that connection; the last ones are read here, so
        that a task is acknowledged only after Redis confirmed each completion.
        """
        token, self._token = self._token, None
        bound = self._run
        bound.thread = bound.task = None
        try:
            pending = bound._pending
            if pending:
                bound._pending = ()
                for store in pending:
                    store.flush_pending()
        finally:
            if token is not None:
                _current.reset(token)

    async def __aenter__(self) -> Run:
        bound = self.__enter__()
        bound.task = asyncio.current_task()
        return bound

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """:meth:`__exit__`, once the replies this task's async effects left unread are read."""
        bound = self._run
        try:
            pending = bound._pending_async
            if pending and bound.task is not None:
                bound._pending_async = ()
                for store in pending:
                    await store.flush_pending()
        finally:
            self.__exit__(exc_type, exc, tb)


_CAPABILITIES = ("prefetch", "complete_pipelined", "flush_pending", "async_store")


_subclasses: set[type] = set()
"""Store classes seen to subclass :class:`~effectq.store.base.Store` (so their runs skip the check)."""


def _check_capabilities(store: object) -> None:
    """A store that does not subclass :class:`~effectq.store.base.Store` (a wrapper that
    forwards, say) must still have every optional capability the engine may call."""
    if Store in type(store).__mro__:  # every capability has its default
        _subclasses.add(type(store))
        return
    missing = [name for name in _CAPABILITIES if not hasattr(store, name)]
    if missing:
        raise ConfigurationError(
            f"{type(store).__qualname__} does not subclass effectq.Store and has no "
            f"{', '.join(missing)}: subclass it (class MyStore(effectq.Store): ...), which gives "
            "the optional capabilities their defaults"
        )


def run(run_id: str, *, store: Store | None = None, **metadata: Any) -> RunScope:
    """Bind a run: every effect called inside is keyed by ``run_id``.

    Args:
        run_id: the identity of this unit of work, stable across redeliveries
            (a task id, a message id, or a business key such as ``"order:42"``).
        store: where effects are recorded; defaults to :func:`set_default_store`'s.
        **metadata: kept on the run for integrations and logs.

    Example:
        >>> with effectq.run("welcome-email:42", store=store):
        ...     send_email("a@example.com", "Welcome")
    """
    chosen = store if store is not None else get_default_store()
    if chosen is None:
        raise ConfigurationError(
            "effectq.run() needs a store: pass store=..., or call effectq.set_default_store(...) once"
        )
    return RunScope(Run(run_id, chosen, metadata))


def current_run() -> Run:
    """The bound run; raises :class:`~effectq.errors.NoActiveRun` outside one."""
    bound = _current.get()
    if bound is None:
        raise NoActiveRun()
    return bound


def active_run() -> Run | None:
    """The bound run, or ``None``."""
    return _current.get()


def set_default_store(store: Store | None) -> None:
    """Set the store :func:`run` uses when none is passed (``None`` clears it)."""
    global _default_store
    with _default_lock:
        _default_store = store


def get_default_store() -> Store | None:
    """The store set by :func:`set_default_store`, or ``None``."""
    return _default_store
