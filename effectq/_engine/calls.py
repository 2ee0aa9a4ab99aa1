"""What one call of an effect carries: its :class:`Call`, the owner id it claims with, and
the event it emits at each step (the public :class:`Applied` lives here too).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

from .. import events
from ..context import EffectContext
from ..events import EventKind
from ..store.base import ClaimRequest

if TYPE_CHECKING:
    from ..codec import ResultCodec
    from ..options import EffectOptions
    from ..runs import Run
    from ..store.base import Store


_owners = itertools.count(1)


_owner_prefix = ""


def _name_process() -> None:
    global _owner_prefix
    _owner_prefix = f"{socket.gethostname()}:{os.getpid()}:"


_name_process()
os.register_at_fork(after_in_child=_name_process)


def new_owner() -> str:
    """A unique id of one call: ``host:pid:n``."""
    return f"{_owner_prefix}{next(_owners)}"


class Applied:
    """What a reconcile hook returns to say "applied" for an effect whose result is ``None``.

    A hook returns the found result, or ``None`` for "not applied". When the
    result itself is ``None`` (or when the found value is not the result), return
    ``effectq.Applied(value)``.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Applied({self.value!r})"


class Callee(Protocol):
    """What the engine needs of an effect (:class:`effectq.Effect` is one): its name, options
    and codec. The engine never imports the decorator's module, which imports the engine."""

    @property
    def name(self) -> str: ...

    @property
    def options(self) -> EffectOptions: ...

    @property
    def codec(self) -> ResultCodec: ...


class Call:
    """Everything one call of an effect needs, computed before anything is claimed."""

    __slots__ = ("arguments", "effect", "input_hash", "key", "ordinal", "request", "run", "scopes", "store")

    def __init__(
        self,
        effect: Callee,
        run: Run,
        store: Store,
        key: str,
        input_hash: str,
        arguments: dict[str, Any],
        ordinal: int,
        request: ClaimRequest,
    ) -> None:
        self.effect = effect
        self.run = run
        self.store = store
        self.key = key
        self.input_hash = input_hash
        self.arguments = arguments
        self.ordinal = ordinal
        self.request = request
        self.scopes: tuple[events.Scope, ...] = ()
        """The function's scopes while it runs (tracers'), ended by its execute step's event."""

    def open_scopes(self, ctx: EffectContext) -> None:
        """Ask the tracers for the scopes of the function about to run in ``ctx``."""
        ctx._scopes = self.scopes = events.open_scopes(
            self.effect.name, self.key, self.run.id, self.store.namespace, ctx.attempt
        )

    def context(self, token: int, attempt: int, lease: Any = None) -> EffectContext:
        # Positional, in EffectContext's field order (keywords cost a dict per call).
        return EffectContext(
            self.key,  # key
            self.run.id,  # run_id
            self.effect.name,  # name
            attempt,  # attempt
            self.store.namespace,  # namespace
            token,  # token
            self.ordinal,  # ordinal
            self.arguments,  # args
            lease,  # _lease
        )


def _emit(
    call: Call,
    kind: EventKind,
    started_ns: int,
    attempt: int = 0,
    *,
    error: str = "",
    step: str = "",
    ended_ns: int | None = None,
) -> None:
    # The tuple read directly: calling events.listeners() costs more than the rest of an unheard event.
    if not events._listeners and not call.scopes:
        return
    event = events.Event(  # positional, in Event's field order (keywords cost a dict per event)
        kind,  # kind
        call.effect.name,  # name
        call.key,  # key
        call.run.id,  # run_id
        call.store.namespace,  # namespace
        attempt,  # attempt
        started_ns,  # started_ns
        ((ended_ns or time.time_ns()) - started_ns) / 1e9,  # duration
        error,  # error
        step or events.STEPS[kind],  # step
    )
    scopes = call.scopes
    if scopes and event.step == "execute":  # the function's outcome: its scopes end with it
        call.scopes = ()
        events.end_scopes(scopes, event)
    events.emit(event)
