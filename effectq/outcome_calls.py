"""The calls of an effect that return its result with how it came (an :class:`~effectq.Outcome`).

A mixin of :class:`~effectq.Effect`: each prepares the call as ``__call__`` does, runs it
the same way with a list to note (value, how it came) in, and builds the outcome from it.
A call that does not ask passes no list, and pays for none of this.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast

from . import switch
from .events import EventKind
from .outcome import Outcome, Seen, Streamed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from ._engine.calls import Call
    from .wrapped import Wrapped

__all__ = ["OutcomeCalls"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class OutcomeCalls(Generic[P, R]):
    """``call_with_outcome``, ``acall_with_outcome`` and ``stream_with_outcome``."""

    if TYPE_CHECKING:  # what Effect has
        name: str
        _invoke_kind: str

        def _prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call: ...
        def _call_sync(
            self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen
        ) -> Any: ...
        async def _call_async(
            self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen
        ) -> Any: ...
        def _stream(
            self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen
        ) -> Iterator[Any]: ...
        def _stream_async(
            self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen
        ) -> AsyncIterator[Any]: ...

    def call_with_outcome(self, *args: P.args, **kwargs: P.kwargs) -> Outcome[R]:
        """Call a synchronous effect; returns its result with how it came (an :class:`Outcome`):
        executed, replayed, reconciled or waited for, with the key and idempotency key."""
        self._expect("sync", "call_with_outcome")
        if switch.on:
            return switch.plain_outcome(cast("Wrapped", self), args, kwargs)
        call = self._prepare(args, kwargs)
        seen: list[tuple[Any, EventKind]] = []
        self._call_sync(call, args, kwargs, seen)
        return Outcome(*seen[0], call.key, call.store.namespace)

    async def acall_with_outcome(
        self: OutcomeCalls[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> Outcome[T]:
        """:meth:`call_with_outcome` for an async effect: ``await effect.acall_with_outcome(...)``."""
        self._expect("async", "acall_with_outcome")
        if switch.on:
            return await switch.plain_outcome_async(cast("Wrapped", self), args, kwargs)
        call = self._prepare(args, kwargs)
        seen: list[tuple[Any, EventKind]] = []
        await self._call_async(call, args, kwargs, seen)
        return Outcome(*seen[0], call.key, call.store.namespace)

    def stream_with_outcome(self, *args: P.args, **kwargs: P.kwargs) -> Streamed[R]:
        """Call a generator effect (sync or async): iterate the returned ``items``; its
        ``outcome`` (the last item, how it came) is known once they ended."""
        if self._invoke_kind not in ("gen", "async_gen"):
            raise TypeError(f"effect {self.name} is not a generator: call call_with_outcome")
        if switch.on:
            return switch.plain_stream(cast("Wrapped", self), args, kwargs)
        call = self._prepare(args, kwargs)
        streamed: Streamed[Any] = Streamed(None, [], call.key, call.store.namespace)
        if self._invoke_kind == "gen":
            streamed.items = self._stream(call, args, kwargs, streamed._end)
        else:
            streamed.items = self._stream_async(call, args, kwargs, streamed._end)
        return streamed

    def _expect(self, kind: str, method: str) -> None:
        if self._invoke_kind != kind:
            other = {"sync": "call_with_outcome", "async": "acall_with_outcome"}.get(
                self._invoke_kind, "stream_with_outcome"
            )
            raise TypeError(f"effect {self.name} is {self._invoke_kind}: call {other}, not {method}")
