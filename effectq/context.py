"""What an effect (and its key function and reconcile hook) can know about its call."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import NoActiveEffect
from .events import Scope, enter_scopes, exit_scopes
from .keys import effect_marker, idempotency_key

if TYPE_CHECKING:
    from ._runtime.leases import Lease
    from .runs import Run

__all__ = ["EffectContext", "KeyContext", "current_effect"]

_current: ContextVar[EffectContext | None] = ContextVar("effectq.effect", default=None)


@dataclass(frozen=True, slots=True)
class KeyContext:
    """What a key function gets besides the bound arguments.

    Attributes:
        run_id: the run id.
        name: the effect name.
        ordinal: how many calls of this effect came before in this run (0 for the first).
        seq: how many calls of any effect came before in this run.
        run: the bound run (its ``metadata`` holds what an integration attached).
    """

    run_id: str
    name: str
    ordinal: int
    seq: int
    run: Run = field(repr=False)


@dataclass(slots=True)
class EffectContext:
    """The running effect, as ``effectq.current_effect()`` returns it (read it, do not change it).

    Attributes:
        key: the effect key.
        run_id: the run id.
        name: the effect name.
        attempt: 1 for the first dispatch of this key, 2 after a release, ...
        namespace: the store's namespace.
        token: the fencing token this attempt holds.
        ordinal: how many calls of this effect came before in this run.
        args: the bound arguments, by name.
    """

    key: str
    run_id: str
    name: str
    attempt: int
    namespace: str
    token: int
    ordinal: int = 0
    args: Mapping[str, Any] = field(default_factory=dict, repr=False)
    _lease: Lease | None = field(default=None, repr=False, compare=False)
    _scopes: tuple[Scope, ...] = field(default=(), repr=False, compare=False)
    """What tracers make current while the function runs (see :class:`effectq.events.Scope`)."""

    @property
    def idempotency_key(self) -> str:
        """A stable key (a UUID string) to hand to an API that accepts one.

        The same in every attempt, process and redelivery of this effect.
        """
        return idempotency_key(self.namespace, self.key)

    @property
    def marker(self) -> str:
        """``effect_marker(self.key)``: embed it in what the effect creates."""
        return effect_marker(self.key)

    @property
    def lease_lost(self) -> bool:
        """Whether this attempt's claim was taken over; it can no longer record a result.

        A long effect can check it before an irreversible step.
        """
        return self._lease is not None and self._lease.lost


def current_effect() -> EffectContext:
    """The effect running now; raises :class:`~effectq.errors.NoActiveEffect` outside one."""
    ctx = _current.get()
    if ctx is None:
        raise NoActiveEffect("effectq.current_effect() was called outside an effect")
    return ctx


def bind_effect(ctx: EffectContext | None) -> Any:
    """Set the running effect (the engine's business), and enter its scopes (a tracer's span
    made current); returns the token to reset."""
    token = _current.set(ctx)
    if ctx is None or not ctx._scopes:
        return token
    return _Entered(token, ctx._scopes, enter_scopes(ctx._scopes))


def unbind_effect(token: Any) -> None:
    if type(token) is _Entered:
        exit_scopes(token.scopes, token.tokens)
        token = token.token
    _current.reset(token)


class _Entered:
    """What :func:`bind_effect` returns when it entered scopes: they are exited first."""

    __slots__ = ("scopes", "token", "tokens")

    def __init__(self, token: Any, scopes: tuple[Scope, ...], tokens: list[Any]) -> None:
        self.token, self.scopes, self.tokens = token, scopes, tokens
