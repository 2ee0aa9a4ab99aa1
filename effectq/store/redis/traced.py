"""Spans of the scripts effectq's own wire sends, for tracers (see :class:`effectq.events.Tracer`).

The wire (:mod:`.wire`) writes each ``EVALSHA`` on redis-py's connections itself,
past ``Redis.execute_command``, the method Redis instrumentation wraps: without
these, APM would not see the scripts at all. Only the callers on the wire call
here, and only when a tracer is registered; a store built with
``via_execute_command=True`` sends its scripts through redis-py, which that
instrumentation sees, and makes none of these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ...events import end_spans, script_spans

__all__ = ["Peer", "peer_of", "post_traced", "run_traced", "run_traced_async"]

Peer = tuple[str, int, int]
"""Host (or a unix socket's path), port (0 for a socket) and database of a Redis."""

_T = TypeVar("_T")


def peer_of(client: Any) -> Peer | None:
    """The Redis a plain client's pool connects to; None when it has no one address (a Sentinel's)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    host, path = kwargs.get("host"), kwargs.get("path")
    db = kwargs.get("db", 0)
    if isinstance(host, str):
        return host, int(kwargs.get("port", 6379)), int(db)
    if isinstance(path, str):
        return path, 0, int(db)
    return None


def run_traced(script: str, peer: Peer | None, send: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``send(*args, **kwargs)`` inside a span of ``script`` from each tracer."""
    spans = script_spans(script, peer)
    try:
        reply = send(*args, **kwargs)
    except BaseException as exc:
        end_spans(spans, exc)
        raise
    end_spans(spans, None)
    return reply


async def run_traced_async(
    script: str, peer: Peer | None, send: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any
) -> _T:
    """:func:`run_traced`, awaited."""
    spans = script_spans(script, peer)
    try:
        reply = await send(*args, **kwargs)
    except BaseException as exc:
        end_spans(spans, exc)
        raise
    end_spans(spans, None)
    return reply


class NotWritten(Exception):
    """What a posted script's span ends with when the wire could not write it (the caller then
    sends it the usual way, in a span of its own)."""


def post_traced(
    script: str,
    peer: Peer | None,
    post: Callable[[Callable[[Any], None]], bool],
    on_reply: Callable[[Any], None],
) -> bool:
    """``post(on_reply)`` (a pipelined script) inside spans that end when its reply is read."""
    spans = script_spans(script, peer)

    def replied(reply: Any) -> None:
        end_spans(spans, reply if isinstance(reply, BaseException) else None)
        on_reply(reply)

    try:
        written = post(replied)
    except BaseException as exc:
        end_spans(spans, exc)
        raise
    if not written:
        end_spans(spans, NotWritten("the pipelined write failed; sent again the usual way"))
    return written
