"""Posted scripts' replies, as the sync and the asyncio wire keep and settle them: no I/O here.

A posted (pipelined) script's reply is read later; until then the connection owes it,
with what is needed to settle it (the caller's callback) or to run the script again
(its frame and source, should Redis not hold it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ....options import is_time_limit

__all__ = ["MAX_PENDING", "OnReply", "Pending", "deliver_all", "deliver_each", "ordinary"]

_log = logging.getLogger("effectq.store")

OnReply = Callable[[Any], None]
"""Takes a posted script's reply, or the exception that stopped it being read."""

Pending = list[tuple[OnReply, bytes, str | bytes]]
"""Posted scripts whose replies a connection owes: (settle, frame, script source) each."""

MAX_PENDING = 64
"""Posted replies a connection may owe before the next post reads them first."""


def ordinary(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure the wire reports in what it returns, once what was pending is
    settled with it; else (a time limit, a ``BaseException``) it is the caller's, raised."""
    return isinstance(exc, Exception) and not is_time_limit(exc)


def deliver_all(pending: Pending, outcome: Any) -> None:
    deliver_each(pending, [outcome] * len(pending))


def deliver_each(pending: Pending, replies: list[Any]) -> None:
    """Hand each posted script its reply. A settle that raises is logged: it must not fail the
    exchange whose reply came with it, nor keep the others from theirs. A time limit raised in
    one is the task's: raised once every other got its reply."""
    limit: BaseException | None = None
    for (on_reply, _, _), reply in zip(pending, replies, strict=True):
        try:
            on_reply(reply)
        except Exception as exc:
            if is_time_limit(exc):
                limit = limit or exc
            else:
                _log.exception("effectq: settling a posted script's reply failed")
    if limit is not None:
        raise limit
