"""Fault injection at named points of an effect's life, through a store wrapper.

The engine talks to its store at every point where a process can die, so a
:class:`FaultyStore` wrapped around any store injects faults there without
touching the engine:

=====================  ==========================================================
``BEFORE_CLAIM``       before the claim reaches the store: nothing recorded, nothing ran
``AFTER_CLAIM``        the claim landed (dispatched, leased), the function never ran
``AFTER_EFFECT``       the function ran (the side effect happened), nothing recorded
``COMPLETION_LOST``    the completion landed, but its reply never came back
=====================  ==========================================================

What a fault does (:class:`Action`): ``CRASH`` raises :class:`Crash`, a
``BaseException`` with ``effectq_crash = True``, so user code's
``except Exception`` cannot swallow it and the engine writes nothing after it,
as after a real process death; ``ERROR`` raises a
:class:`~effectq.errors.StoreError` (a network failure: the engine retries a
completion, and a claim fails closed); ``KILL`` sends this process a real
``SIGKILL`` (for worker processes).
"""

from __future__ import annotations

import enum
import os
import random
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreError
from ..store.base import Claim, ClaimRequest, Prefetched, Record, ResultState, Store, Unsubscribe

__all__ = ["Action", "Crash", "Fault", "FaultyStore", "Point", "parse_faults"]


class Point(enum.StrEnum):
    """Where in an effect's life a fault strikes."""

    BEFORE_CLAIM = "before_claim"
    AFTER_CLAIM = "after_claim"
    AFTER_EFFECT = "after_effect"
    COMPLETION_LOST = "completion_lost"


class Action(enum.StrEnum):
    """What a fault does."""

    CRASH = "crash"
    ERROR = "error"
    KILL = "kill"


class Crash(BaseException):
    """A simulated process death. The engine records nothing after it (``effectq_crash``).

    Attributes:
        point: where it struck.
        key: the effect key.
    """

    effectq_crash = True

    def __init__(self, point: Point, key: str) -> None:
        self.point = point
        self.key = key
        super().__init__(f"simulated crash {point.value} of {key}")


@dataclass(slots=True)
class Fault:
    """One fault: at ``point``, for effects named ``effect`` (any when empty).

    Attributes:
        point: where it strikes.
        action: what it does.
        effect: only effects of this name (``""``: any).
        times: how many times it strikes (``None``: every time it is drawn).
        probability: the chance it strikes each time it could.
        struck: how many times it struck.
    """

    point: Point
    action: Action = Action.CRASH
    effect: str = ""
    times: int | None = 1
    probability: float = 1.0
    struck: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def draw(self, point: Point, name: str, rng: random.Random) -> bool:
        """Whether this fault strikes now (and count it)."""
        if point is not self.point or (self.effect and self.effect != name):
            return False
        with self._lock:
            if self.times is not None and self.struck >= self.times:
                return False
            if self.probability < 1.0 and rng.random() >= self.probability:
                return False
            self.struck += 1
            return True


class FaultyStore(Store):
    """A store that injects :class:`Fault` s at named points; everything else goes to ``inner``.

    Args:
        inner: the real store.
        faults: the faults to inject.
        seed: seeds the draws of faults with a probability.

    Example:
        >>> store = FaultyStore(MemoryStore(), [Fault(Point.AFTER_EFFECT, effect="payments.charge")])
    """

    def __init__(self, inner: Store, faults: Iterable[Fault] = (), *, seed: int | None = None) -> None:
        self.inner = inner
        self.faults = list(faults)
        self._rng = random.Random(seed)
        self._names: dict[tuple[str, int], str] = {}
        self._names_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r}, {len(self.faults)} faults)"

    @property
    def namespace(self) -> str:
        return self.inner.namespace

    def add(self, fault: Fault) -> Fault:
        """Inject one more fault; returns it (its ``struck`` counts strikes)."""
        self.faults.append(fault)
        return fault

    def _strike(self, point: Point, key: str, name: str) -> None:
        for fault in self.faults:
            if fault.draw(point, name, self._rng):
                _act(fault.action, point, key)

    def _name_of(self, key: str, token: int) -> str:
        with self._names_lock:
            return self._names.pop((key, token), "")

    # -- the primitives -------------------------------------------------------------------

    def claim(self, key: str, request: ClaimRequest) -> Claim:
        self._strike(Point.BEFORE_CLAIM, key, request.name)
        claim = self.inner.claim(key, request)
        with self._names_lock:
            self._names[(key, claim.token)] = request.name
        self._strike(Point.AFTER_CLAIM, key, request.name)
        return claim

    def complete(
        self, key: str, token: int, *, result: bytes | None, result_state: ResultState, retention_ms: int
    ) -> bool:
        name = self._name_of(key, token)
        self._strike(Point.AFTER_EFFECT, key, name)
        done = self.inner.complete(
            key, token, result=result, result_state=result_state, retention_ms=retention_ms
        )
        self._strike(Point.COMPLETION_LOST, key, name)
        return done

    def release(self, key: str, token: int, *, error: str, retention_ms: int, ran: bool = True) -> bool:
        return self.inner.release(key, token, error=error, retention_ms=retention_ms, ran=ran)

    def mark_unknown(self, key: str, token: int, *, error: str, ran: bool = True) -> bool:
        return self.inner.mark_unknown(key, token, error=error, ran=ran)

    def fail(self, key: str, token: int, *, error: str, failure: str, retention_ms: int) -> bool:
        return self.inner.fail(key, token, error=error, failure=failure, retention_ms=retention_ms)

    def dispatch(self, key: str, token: int, *, lease_ms: int, **limits: int) -> int:
        return self.inner.dispatch(key, token, lease_ms=lease_ms, **limits)

    def renew(self, key: str, token: int, *, lease_ms: int) -> bool:
        return self.inner.renew(key, token, lease_ms=lease_ms)

    def resolve(self, key: str, **settlement: Any) -> Record:
        return self.inner.resolve(key, **settlement)

    def get(self, key: str) -> Record | None:
        return self.inner.get(key)

    def watch(self, key: str, callback: Callable[[], None]) -> Unsubscribe:
        return self.inner.watch(key, callback)

    def prefetch(self, run_id: str, hint: Any = None) -> Prefetched | None:
        return self.inner.prefetch(run_id, hint)

    def __getattr__(self, name: str) -> Any:  # close(), client, ... of the inner store
        return getattr(self.inner, name)


def _act(action: Action, point: Point, key: str) -> None:
    if action is Action.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if action is Action.ERROR:
        raise StoreError(f"injected store failure {point.value} of {key!r}")
    raise Crash(point, key)


def parse_faults(spec: str) -> list[Fault]:
    """Faults from text: ``"after_effect:0.05,after_claim:0.05"`` (point, optional probability,
    optional action: ``"after_effect:0.1:kill"``). Each strikes any number of times."""
    faults: list[Fault] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, _, rest = part.partition(":")
        probability, _, action = rest.partition(":")
        faults.append(
            Fault(
                Point(point),
                Action(action or "crash"),
                times=None,
                probability=float(probability or 1.0),
            )
        )
    return faults
