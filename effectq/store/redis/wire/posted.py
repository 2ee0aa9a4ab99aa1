"""Posted scripts' replies, as the sync and the asyncio wire keep and settle them: no I/O here.

A posted (pipelined) script's reply is read later; until then the connection owes it,
with what is needed to settle it (the caller's callback) or to run the script again
(its frame and source, should Redis not hold it).

A posted script must not meet NOSCRIPT: that reply is read only later, and the script
runs only then, once loaded, while the caller counts it written. So the first post
of a script on a connection since it connected, and the first since the lane met
NOSCRIPT anywhere (a flushed script cache), writes ``SCRIPT LOAD`` ahead of the
``EVALSHA`` in the same write (:class:`ScriptCache`): Redis has cached the script by
the time it reads the call. A flush by someone else between that write and a later
post on the same connection is met as NOSCRIPT where the reply is read (see the
lanes' ``_rerun_unloaded``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ....options import is_time_limit
from .frames import command

__all__ = [
    "MAX_PENDING",
    "OnReply",
    "Pending",
    "PendingOnThread",
    "ScriptCache",
    "deliver_all",
    "deliver_each",
    "first_unloaded",
    "ignore",
    "lost",
    "ordinary",
]

_log = logging.getLogger("effectq.store")

OnReply = Callable[[Any], None]
"""Takes a posted script's reply, or the exception that stopped it being read."""

Pending = list[tuple[OnReply, bytes, str | bytes]]
"""Posted scripts whose replies a connection owes: (settle, frame, script source) each."""

MAX_PENDING = 64
"""Posted replies a connection may owe before the next post reads them first."""


class PendingOnThread(threading.local):
    """Per thread, on one sync lane: ``conn``, a connection owing replies to posts; ``pending``,
    their settles; ``sock``, the socket they were written on, the only one they can come on.
    Each thread starts with none (``__init__`` runs once per thread): no lookup of them misses."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.pending: Pending = []
        self.sock: Any = None


_SENT = "_effectq_scripts_sent"
"""A connection's attribute: (the socket or writer it was on, :attr:`ScriptCache.misses` then,
the digests it has had loaded ahead of a post there). redis-py's connections take attributes
of their own (``tests/redis/test_wire_redispy.py`` asserts it on each redis-py supported)."""


class ScriptCache:
    """What a lane knows of Redis' script cache: which scripts each connection had it load.

    One per sync lane, shared by its async lane (the same server). ``misses`` counts
    the NOSCRIPT replies the lane met: each says the cache was flushed (by an
    operator, a restart the connection did not notice yet), so every connection
    loads its posted scripts again.
    """

    __slots__ = ("misses",)

    def __init__(self) -> None:
        self.misses = 0

    def ahead(self, conn: Any, link: Any, sha: str, source: str | bytes) -> bytes:
        """What a post of ``sha`` on ``conn``, connected on ``link`` (its socket, its writer),
        writes ahead of its call: ``SCRIPT LOAD source`` the first time, from then on nothing."""
        sent = getattr(conn, _SENT, None)
        if sent is not None and sent[0] is link and sent[1] == self.misses:
            if sha in sent[2]:
                return b""
            sent[2].add(sha)
        else:  # connected since, or the cache flushed since: whatever it loaded may be gone
            setattr(conn, _SENT, (link, self.misses, {sha}))
        return command(b"SCRIPT", b"LOAD", source)

    def missed(self) -> None:
        """A NOSCRIPT met: Redis' cache holds none of the scripts any connection had it load."""
        self.misses += 1


def ignore(reply: Any) -> None:
    """Settles the reply of a ``SCRIPT LOAD`` written ahead of a post: the post's own reply says
    whether the script ran (a load refused, by an ACL say, changes nothing for it)."""


def ordinary(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure the wire reports in what it returns, once what was pending is
    settled with it; else (a time limit, a ``BaseException``) it is the caller's, raised."""
    return isinstance(exc, Exception) and not is_time_limit(exc)


def first_unloaded(replies: list[Any], noscript: type[BaseException]) -> int | None:
    """Where the first reply that says NOSCRIPT is among a connection's pending ``replies``: from
    that post on, every post runs again, the script loaded (the lanes' ``_rerun_unloaded``)."""
    for i, reply in enumerate(replies):  # a loop, not next() of a generator: asked after every read
        if isinstance(reply, noscript):
            return i
    return None


def lost(conn: Any, connection_error: type[Exception]) -> Exception:
    """What a connection closed while replies were pending on it raises, and settles them with
    (a reply pending on one socket can come on no other)."""
    where = getattr(conn, "path", None) or f"{conn.host}:{conn.port}"
    return connection_error(f"the connection to {where} was closed while replies were pending on it")


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
