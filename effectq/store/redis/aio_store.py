"""The async half of :class:`~effectq.store.redis.RedisStore`: its claim and completions sent on
the async wire (:mod:`.wire.aio`) from the calling event loop, and the
:class:`~effectq.store.base.AsyncStore` the engine awaits in place of a thread hop.

The sync sending is :mod:`.scripts`; what each script's arguments and replies mean stays in :mod:`.store`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from ... import events
from ...errors import StoreError
from ..base import AsyncStore, Claim, ClaimRequest, Prefetched, ResultState
from .errors import raise_failure
from .layout import Layout
from .replies import decode_claim
from .scripts import RETRY_SAFE
from .traced import Peer, post_traced, run_traced_async
from .wire import aio
from .wire.aio import AsyncLane

__all__ = ["AsyncScripts", "OnTheLoop"]


class _Host(Protocol):
    """What the async half uses of the store it is mixed into."""

    _async_lane: AsyncLane | None
    _peer: Peer | None
    _sources: dict[str, str]
    _scripts: dict[str, Any]

    def _run(self, name: str, key: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

    def _run_async(self, name: str, key: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

    def _claim_args(self, key: str, request: ClaimRequest) -> tuple[Layout, list[Any]]: ...

    def _complete_args(
        self, key: str, token: int, result: bytes | None, result_state: ResultState, retention_ms: int
    ) -> tuple[Sequence[str], list[Any]]: ...

    def _settled(self, key: str, settle: Callable[[bool | StoreError], None]) -> Callable[[Any], None]: ...


class AsyncScripts:
    """The store's scripts from an event loop, for :class:`~effectq.store.redis.RedisStore` to inherit."""

    _async_lane: AsyncLane | None
    _on_loop: OnTheLoop | None

    async def _claim_async(self: _Host, key: str, request: ClaimRequest) -> Claim:
        layout, args = self._claim_args(key, request)
        return decode_claim(key, await self._run_async("claim", key, layout.script_keys, args))

    async def _complete_async(
        self: _Host,
        key: str,
        token: int,
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool:
        keys, args = self._complete_args(key, token, result, result_state, retention_ms)
        return bool(await self._run_async("complete", key, keys, args))

    def _complete_pipelined_async(
        self: _Host,
        key: str,
        token: int,
        on_reply: Callable[[bool | StoreError], None],
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool:
        """:meth:`complete_pipelined` on the async lane, from a task in an event loop: the reply is
        read by the task's next script on this store or at its run's end
        (:func:`~effectq.store.redis.wire.aio.flush_pending`)."""
        lane = self._async_lane
        if lane is None:
            return False
        keys, args = self._complete_args(key, token, result, result_state, retention_ms)
        sha, source = self._scripts["complete"].sha, self._sources["complete"]
        if events._tracers:  # as in complete_pipelined
            post = functools.partial(lane.send_pipelined, sha, source, keys, args)
            return post_traced("complete", self._peer, post, self._settled(key, on_reply))
        return lane.send_pipelined(sha, source, keys, args, self._settled(key, on_reply))

    async def _run_async(self: _Host, name: str, key: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        lane = self._async_lane
        assert lane is not None
        if not AsyncLane.serves(asyncio.get_running_loop()):
            return await asyncio.to_thread(self._run, name, key, keys, args)
        send = lane.evalsha
        if events._tracers:  # APM cannot see the wire (see traced.py): a span of effectq's own
            send = functools.partial(run_traced_async, name, self._peer, send)
        try:
            return await send(
                self._scripts[name].sha, self._sources[name], keys, args, retry=name in RETRY_SAFE
            )
        except Exception as exc:
            raise_failure(name, key, exc)

    def async_store(self) -> AsyncStore | None:
        """``claim``, ``complete`` and ``complete_pipelined`` sent from the calling loop (the
        engine awaits them in place of ``asyncio.to_thread(primitive, ...)``); None where they
        would hop to a thread anyway (replicas to wait for, a client the async wire cannot
        serve), or where ``claim`` or ``complete`` is set on the instance (a test's spy, say).
        A subclass's own ``claim`` or ``complete`` keeps its thread."""
        if "claim" in self.__dict__ or "complete" in self.__dict__:
            return None
        return self._on_loop


class _Twinned(Protocol):
    """What :class:`OnTheLoop` takes of its store: the primitives, and their twins on the async wire."""

    @property
    def claim(self) -> Callable[..., Claim]: ...

    @property
    def complete(self) -> Callable[..., bool]: ...

    @property
    def _claim_async(self) -> Callable[..., Coroutine[Any, Any, Claim]]: ...

    @property
    def _complete_async(self) -> Callable[..., Coroutine[Any, Any, bool]]: ...

    @property
    def _complete_pipelined_async(self) -> Callable[..., bool]: ...

    @property
    def prefetch(self) -> Callable[..., Prefetched | None]: ...

    def _prefetched(self, run_id: str, hint: Any) -> Prefetched | None: ...


class OnTheLoop:
    """A RedisStore's :class:`~effectq.store.base.AsyncStore`: its scripts sent on the async
    wire from the calling loop; a subclass's own ``claim`` or ``complete`` in a thread."""

    __slots__ = ("_own_prefetch", "_store", "claim", "complete", "complete_pipelined")

    def __init__(self, store: _Twinned, own_claim: bool, own_complete: bool, own_prefetch: bool) -> None:
        self._store = store
        self._own_prefetch = own_prefetch
        self.claim: Callable[..., Coroutine[Any, Any, Claim]] = (
            store._claim_async if own_claim else _in_thread(store.claim)
        )
        self.complete: Callable[..., Coroutine[Any, Any, bool]] = (
            store._complete_async if own_complete else _in_thread(store.complete)
        )
        # a subclass's own complete is the one to call: never pipelined past it
        self.complete_pipelined: Callable[..., bool] = (
            store._complete_pipelined_async if own_complete else _not_pipelined
        )

    flush_pending = staticmethod(aio.flush_pending)  # the wire's own: no coroutine around it

    async def prefetch(self, run_id: str, hint: Any = None) -> Prefetched | None:
        """The store's ``prefetch``: read here when the claim's reply brought every record (no
        I/O), in a worker thread when some need a round trip (or a subclass has its own)."""
        store = self._store
        if self._own_prefetch:
            found = store._prefetched(run_id, hint)
            if found is not None:
                return found
        return await asyncio.to_thread(store.prefetch, run_id, hint)


def _not_pipelined(*args: Any, **completion: Any) -> bool:
    return False


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    async def in_thread(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return in_thread
