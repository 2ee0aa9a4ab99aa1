"""The effectq pytest plugin (loaded through the ``pytest11`` entry point).

Fixtures, all prefixed ``effectq_``:

* ``effectq_store``: a fresh store per test, in its own namespace, wrapped in a
  :class:`~effectq.testing.faults.FaultyStore` (``effectq_store.add(Fault(...))``
  injects a fault). Which store: ``--effectq-store=memory|fakeredis|redis``, else
  ``EFFECTQ_TEST_STORE``, else the ini option ``effectq_store`` (default ``memory``).
  The real Redis: ``--effectq-redis-url``, else ``EFFECTQ_TEST_REDIS_URL``, else the
  ini option ``effectq_redis_url`` (default ``redis://127.0.0.1:6379/15``). A real
  Redis namespace is deleted afterwards (SCAN, never FLUSH).
* ``effectq_clock``: ``advance(seconds)`` moves the memory store's clock (leases
  run out at once) and sleeps on the others.
* ``effectq_run``: a run bound for the test, on ``effectq_store``.
* ``effectq_deliver``: ``effectq_deliver(fn, *args, task_id="t1")`` runs ``fn`` as one
  delivery of task ``t1`` (its own run, keyed by the task id); call it again with
  the same task id to simulate a redelivery. A simulated crash ends the delivery
  instead of the test.
* ``effectq_ledger``: a :class:`~effectq.testing.ledger.Ledger` (the remote system),
  with ``effectq_ledger.counts()`` and :func:`~effectq.testing.ledger.assert_exactly_once`.

The fakeredis store and the ledger need ``pip install 'effectq[testing]'``.

Loading this module imports nothing of effectq beyond it: every pytest run in an
environment where effectq is installed loads it, and most use none of its
fixtures. Each fixture imports what it needs when a test asks for it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..runs import Run
    from .faults import FaultyStore
    from .ledger import Ledger

__all__ = ["Delivery", "ManualClock"]

_KINDS = ("memory", "fakeredis", "redis")
_DEFAULT_REDIS = "redis://127.0.0.1:6379/15"
_INSTALL = "pip install 'effectq[testing]'"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("effectq")
    group.addoption(
        "--effectq-store",
        choices=_KINDS,
        default=None,
        help="the store effectq_store gives: memory (default), fakeredis, or redis (a real server)",
    )
    group.addoption(
        "--effectq-redis-url",
        default=None,
        help=f"the real Redis for --effectq-store=redis and its ledger (default {_DEFAULT_REDIS})",
    )
    parser.addini("effectq_store", "the store effectq_store gives: memory, fakeredis or redis", default="")
    parser.addini(
        "effectq_redis_url", f"the real Redis of effectq_store=redis (default {_DEFAULT_REDIS})", default=""
    )


class ManualClock:
    """Milliseconds since the epoch that a test moves forward (for :class:`MemoryStore`)."""

    def __init__(self, *, real: bool) -> None:
        self.real = real
        self._offset_ms = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self._offset_ms

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: at once for the memory store, by sleeping for a real server."""
        if self.real:
            time.sleep(seconds)
        else:
            self._offset_ms += int(seconds * 1000)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one simulated delivery of a task did.

    Attributes:
        task_id: the task id (the run id).
        number: 1 for the first delivery, 2 for the redelivery, ...
        value: what the task returned (``None`` when it raised).
        error: what it raised, a :class:`~effectq.testing.faults.Crash` included.
        run: the run, with its ``stats`` (executed, replayed, ...).
    """

    task_id: str
    number: int
    value: Any
    error: BaseException | None
    run: Run

    @property
    def crashed(self) -> bool:
        """Whether a simulated crash ended this delivery."""
        from .faults import Crash

        return isinstance(self.error, Crash)


def _kind(config: pytest.Config) -> str:
    kind = (
        config.getoption("--effectq-store")
        or os.environ.get("EFFECTQ_TEST_STORE")
        or str(config.getini("effectq_store")).strip()
        or "memory"
    )
    if kind not in _KINDS:
        raise pytest.UsageError(f"the effectq store must be one of {', '.join(_KINDS)}, not {kind!r}")
    return str(kind)


def _redis_url(config: pytest.Config) -> str:
    return str(
        config.getoption("--effectq-redis-url")
        or os.environ.get("EFFECTQ_TEST_REDIS_URL")
        or str(config.getini("effectq_redis_url")).strip()
        or _DEFAULT_REDIS
    )


def _needs(fixture: str, what: str, *modules: str) -> None:
    """Fail the test's setup in one line when a package the fixture needs is not installed."""
    if not all(_installed(module) for module in modules):
        pytest.fail(f"{fixture} needs {what}: {_INSTALL}", pytrace=False)


def _installed(module: str) -> bool:
    try:
        import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:  # installed, but something it imports is not: show that
            raise
        return False
    return True


@pytest.fixture
def effectq_clock(request: pytest.FixtureRequest) -> ManualClock:
    """The clock of ``effectq_store``: ``advance(seconds)`` lets leases run out."""
    return ManualClock(real=_kind(request.config) != "memory")


@pytest.fixture
def effectq_store(request: pytest.FixtureRequest, effectq_clock: ManualClock) -> Iterator[FaultyStore]:
    """A fresh store in its own namespace, ready for injected faults."""
    kind = _kind(request.config)
    if kind == "fakeredis":
        _needs("effectq_store", "fakeredis with Lua", "fakeredis", "lupa")
    elif kind == "redis":
        _needs("effectq_store", "redis-py", "redis")
    from .faults import FaultyStore

    namespace = f"t{uuid.uuid4().hex[:12]}"
    if kind == "memory":
        from ..store.memory import MemoryStore

        yield FaultyStore(MemoryStore(namespace=namespace, clock=effectq_clock))
        return
    from ..store.redis import RedisStore

    if kind == "fakeredis":
        inner = RedisStore.embedded(namespace=namespace)
        yield FaultyStore(inner)
        inner.close()
        return
    import redis

    from .workers import delete_keys

    client = redis.Redis.from_url(_redis_url(request.config))
    inner = RedisStore(client, namespace=namespace)
    yield FaultyStore(inner)
    inner.close()
    for pattern in (f"effectq:{{{namespace}:*", f"effectq:{{{namespace}}}*"):
        delete_keys(client, pattern)
    client.close()


@pytest.fixture
def effectq_run(effectq_store: FaultyStore) -> Iterator[Run]:
    """A run bound for the whole test, on ``effectq_store``."""
    from ..runs import run as bind_run

    with bind_run(f"test-{uuid.uuid4().hex[:12]}", store=effectq_store) as bound:
        yield bound


@pytest.fixture
def effectq_deliver(effectq_store: FaultyStore) -> Callable[..., Delivery]:
    """``deliver(fn, *args, task_id=..., **kwargs)``: one delivery of a task; repeat it to redeliver."""
    from ..runs import run as bind_run
    from .faults import Crash

    counts: dict[str, int] = {}

    def deliver(fn: Callable[..., Any], *args: Any, task_id: str, **kwargs: Any) -> Delivery:
        counts[task_id] = number = counts.get(task_id, 0) + 1
        with bind_run(task_id, store=effectq_store, delivery=number) as bound:
            try:
                value = fn(*args, **kwargs)
            except (Exception, Crash) as exc:
                return Delivery(task_id, number, None, exc, bound)
        return Delivery(task_id, number, value, None, bound)

    return deliver


@pytest.fixture
def effectq_ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    """A ledger that plays the remote system: fakeredis, or the real Redis with ``--effectq-store=redis``."""
    from .ledger import Ledger

    name = f"l{uuid.uuid4().hex[:12]}"
    if _kind(request.config) == "redis":
        _needs("effectq_ledger", "redis-py", "redis")
        ledger = Ledger.from_url(_redis_url(request.config), name)
    else:
        _needs("effectq_ledger", "fakeredis with Lua", "fakeredis", "lupa")
        import fakeredis

        ledger = Ledger(fakeredis.FakeRedis(), name)
    yield ledger
    ledger.clear()
    ledger.client.close()
