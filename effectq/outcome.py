"""How one call of an effect came by its result: executed, replayed, reconciled or waited for.

What ``Effect.call_with_outcome`` (and its async and streaming twins) return beside the
result, for a caller that wants to tell a first application from a replay (Stripe's
``Idempotent-Replayed`` header) without subscribing to events. How it came is an
:class:`~effectq.events.EventKind`, the same word the events use for that phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .events import EventKind
from .keys import idempotency_key

__all__ = ["OUTCOMES", "Outcome", "Seen", "Streamed", "waited"]

T = TypeVar("T")
S = TypeVar("S")

OUTCOMES = (EventKind.EXECUTED, EventKind.REPLAYED, EventKind.RECONCILED, EventKind.WAITED)
"""The kinds an :class:`Outcome` can have."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """One call's result and how it came.

    Attributes:
        value: what the call returned (for a stream, the last item: what is recorded).
        kind: ``EventKind.EXECUTED`` (this call ran the function), ``REPLAYED`` (the
            recorded result came back; after redaction, the redacted one), ``RECONCILED``
            (the reconcile hook found the effect applied), or ``WAITED`` (this call waited
            for the same effect in flight, in this process or another, and took its result).
        key: the effect key.
        namespace: the store's namespace.
    """

    value: T
    kind: EventKind
    key: str
    namespace: str = ""

    @property
    def executed(self) -> bool:
        """Whether this call ran the function (the side effect happened in this call)."""
        return self.kind is EventKind.EXECUTED

    @property
    def idempotency_key(self) -> str:
        """The idempotency key the function was (or would have been) given for this key."""
        return idempotency_key(self.namespace, self.key)


@dataclass(slots=True)
class Streamed(Generic[S]):
    """A generator effect's call: iterate ``items``; ``outcome`` is known once they ended.

    Attributes:
        items: the stream, as the effect's call returns it (an iterator, or an async one).
    """

    items: S
    _end: list[Any] = field(default_factory=list, repr=False)
    _key: str = field(default="", repr=False)
    _namespace: str = field(default="", repr=False)

    @property
    def outcome(self) -> Outcome[Any]:
        """How the stream came; raises ``RuntimeError`` before its end (or after it failed)."""
        if not self._end:
            raise RuntimeError("the stream has not ended: its outcome is known once its items are consumed")
        value, kind = self._end[0]
        return Outcome(value, kind, self._key, self._namespace)


Seen = list[tuple[Any, EventKind]] | None
"""Where a call whose outcome was asked for puts (value, how it came); None: nobody asked."""


def waited(value: Any, seen: Seen) -> Any:
    """``value``, taken from the leader of the call in flight: noted as waited for, if asked."""
    if seen is not None:
        seen.append((value, EventKind.WAITED))
    return value
