"""EVALSHA on redis-py's own pooled connections, without its per-command machinery.

A command through ``redis.Redis`` costs some 40 µs of Python beyond the round
trip on loopback: the pool checkout and its observability hooks, argument
encoding, retries, response callbacks. For the scripts every effect runs, that
is more than the scripts cost Redis. The wire frames the ``EVALSHA`` itself
(:mod:`.frames`), writes it with the connection's ``send_packed_command`` and
reads the reply with its parser (hiredis when installed) as its ``read_response``
would, without that call's per-reply bookkeeping (:func:`.redispy.reply_reader`), so
RESP2/RESP3, push messages, TLS and authentication stay redis-py's.

A connection the wire took from the pool stays the wire's: clean ones on an idle
stack, ones a failure may have left a reply on closed and kept apart, opened
again when next taken (see ``Lane._take``); a process that forks starts with
none. A half-read reply never reaches another command.

A script whose reply can wait (an effect's completion, whose outcome the caller
does not see) is *pipelined*: written at once, its reply left pending, read by
the same thread's next exchange on the wire, which writes behind it on the same
connection, or by :func:`flush_pending` (a run's end). Redis runs it when it
arrives, as it would any command; only the wait for its reply is gone (a script
Redis may not hold yet is loaded ahead of it in the same write: see
:mod:`.posted`). A
connection with pending replies belongs to that thread alone: it is never on a
stack, never handed back to the pool, and never written on once its socket
changed (a reply pending on one socket can come on no other).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ..errors import mark_unsent as _unsent
from .clients import pool_args as _pool_args
from .clients import served_pool
from .frames import command as _command
from .frames import frame as frame_script
from .polling import await_readable
from .posted import (
    MAX_PENDING,
    OnReply,
    Pending,
    PendingOnThread,
    ScriptCache,
    deliver_all,
    deliver_each,
    first_unloaded,
    ignore,
    lost,
    ordinary,
)
from .redispy import protect_connection as _protect_connection
from .redispy import reply_reader, socket_of

__all__ = ["Lane", "flush_pending", "lane_for"]

_log = logging.getLogger("effectq.store")
_lanes: weakref.WeakSet[Lane] = weakref.WeakSet()
_lanes_lock = threading.Lock()
_pending = threading.local()
"""Per thread, ``lanes``: the lanes on which this thread owes replies it has not read."""

_IDLE, _BROKEN, _NEW = object(), object(), object()
"""Where :meth:`Lane._take` found a connection: the idle stack, the broken one, the pool."""


def _forget_all() -> None:  # a forked child must not write on, or read from, its parent's sockets
    global _lanes_lock, _pending
    _lanes_lock = threading.Lock()  # another thread of the parent may have held it: it is gone
    for lane in list(_lanes):
        lane._idle = lane._broken = ()
        lane._local = PendingOnThread()
    _pending = threading.local()


def flush_pending() -> None:
    """Read every reply this thread owes on any lane, and settle each (a run's end calls this)."""
    lanes = getattr(_pending, "lanes", None)
    if lanes:
        _pending.lanes = None
        for lane in lanes:
            lane.flush()


os.register_at_fork(after_in_child=_forget_all)


class Lane:
    """Sends scripts on connections of ``pool``; see the module docstring.

    Args:
        pool: the client's ``redis.ConnectionPool``.
        pool_args: what this redis-py's ``get_connection`` needs (old ones want a command name);
            found out by default.
        poll: seconds to wait for each exchange's first reply by polling its socket before the
            read sleeps in it (see :mod:`.polling`); 0, the default, sleeps at once.
    """

    def __init__(self, pool: Any, pool_args: tuple[str, ...] | None = None, *, poll: float = 0.0) -> None:
        import redis

        self._poll = poll
        self._pool = pool
        self._pool_args = _pool_args(pool) if pool_args is None else pool_args
        self._idle: tuple[Any, ...] = ()
        self._broken: tuple[Any, ...] = ()
        self._errors = (redis.ConnectionError, OSError)
        self._timeout = (redis.TimeoutError, TimeoutError)
        self._response_error = redis.ResponseError
        self._noscript = redis.exceptions.NoScriptError
        self._connection_error = redis.ConnectionError
        self._read = reply_reader(pool.connection_class)
        """One reply; an error reply is returned, not raised (the connection is as good as before)."""
        self.scripts = ScriptCache()
        self._local = PendingOnThread()
        with _lanes_lock:
            _lanes.add(self)

    def evalsha(
        self, sha: str, source: str | bytes, keys: Sequence[Any], args: Sequence[Any], *, retry: bool
    ) -> Any:
        """``EVALSHA sha keys args``; loads ``source`` after a NOSCRIPT and runs it again.

        ``retry``: the script may run twice (a retried claim with the same owner,
        a completion with the same token): a connection that turns out dead (a
        Redis restart closed it while idle) is replaced once. A timeout is never
        retried: the script may be running.
        """
        reply = self._exchange(frame_script(sha, keys, args), source, retry, pair=False)
        if isinstance(reply, self._response_error):
            raise reply
        return reply

    def evalsha_wait(
        self,
        sha: str,
        source: str | bytes,
        keys: Sequence[Any],
        args: Sequence[Any],
        *,
        replicas: int,
        timeout_ms: int,
        retry: bool,
    ) -> tuple[Any, int]:
        """``EVALSHA`` then ``WAIT replicas timeout_ms`` on the same connection, in one write.

        ``WAIT`` counts the replicas that acknowledged the writes of its own
        connection, so it must follow the script there. Returns (the script's
        reply, how many replicas acknowledged).
        """
        frame = frame_script(sha, keys, args) + _command(b"WAIT", b"%d" % replicas, b"%d" % timeout_ms)
        reply, acknowledged = self._exchange(frame, source, retry, pair=True)
        if isinstance(reply, self._response_error):
            raise reply
        if isinstance(acknowledged, self._response_error):
            raise acknowledged
        return reply, int(acknowledged)

    def send_pipelined(
        self, sha: str, source: str | bytes, keys: Sequence[Any], args: Sequence[Any], on_reply: OnReply
    ) -> bool:
        """``EVALSHA`` written now; ``settle`` gets its reply when this thread reads it.

        That is at this thread's next exchange on the lane, which writes behind it
        on the same connection, or at :meth:`flush`. The first post of ``sha`` on a
        connection (since it connected, or since the lane met NOSCRIPT) writes
        ``SCRIPT LOAD source`` ahead of it, so that Redis runs it as it reads it. A
        NOSCRIPT reply all the same (the cache flushed since) is answered by loading
        the script and running it again before it is settled; a reply that cannot be
        read settles as the exception that stopped it.
        Returns False, having settled nothing, when the script could not be written
        (no connection could be had, or the write failed: the caller runs it the
        usual way; whatever was pending on that connection is settled with the error).
        A time limit that lands here is raised, once those are settled.
        """
        frame = frame_script(sha, keys, args)
        lanes = getattr(_pending, "lanes", None)  # first: the run's end must find this lane
        if lanes is None:
            _pending.lanes = [self]
        elif self not in lanes:
            lanes.append(self)
        local = self._local
        held = local.conn
        if held is not None and (len(local.pending) >= MAX_PENDING or socket_of(held) is not local.sock):
            self.flush()  # a connection closed meanwhile settles its pending posts as failed
            held = None
        conn = None
        pending: Pending = []
        try:
            if held is None:
                conn, kind = self._take()
                sock = self._ready(conn, kind)
                load = self.scripts.ahead(conn, sock, sha, source)
                self._write(conn, load + frame)
            else:  # taken from the thread's hands before anything can fail
                conn, pending, sock = held, local.pending, local.sock
                local.conn, local.pending, local.sock = None, [], None
                load = self.scripts.ahead(conn, sock, sha, source)
                self._write_behind(conn, load + frame, sock)
            if socket_of(conn) is not sock:  # closed and connected again as it wrote (another
                raise lost(conn, self._connection_error)  # thread's ``pool.disconnect()``)
        except BaseException as exc:
            if conn is not None:
                try:
                    conn.disconnect()
                finally:
                    self._broken += (conn,)
            deliver_all(pending, exc)
            if ordinary(exc):
                return False
            raise
        if load:  # no call from here on: nothing can land in between
            pending += ((ignore, load, source),)
        pending += ((on_reply, frame, source),)
        local.conn, local.pending, local.sock = conn, pending, sock
        return True

    def flush(self) -> None:
        """Read the replies this thread owes on the lane and settle them; the connection is free
        again. A failure settles them with the error; a time limit is raised once they are."""
        local = self._local
        conn = local.conn
        if conn is None:
            return
        pending, sock = local.pending, local.sock
        local.conn, local.pending, local.sock = None, [], None
        try:
            replies = self._read_pending(conn, sock, pending)
            first = first_unloaded(replies, self._noscript)
            if first is not None:
                self._rerun_unloaded(conn, pending, replies, first)
        except BaseException as exc:
            try:
                conn.disconnect()
            finally:
                self._broken += (conn,)
            deliver_all(pending, exc)
            if ordinary(exc):
                return
            raise
        self._idle += (conn,)
        deliver_each(pending, replies)

    def _read_pending(self, conn: Any, sock: Any, pending: Pending) -> list[Any]:
        """The replies ``conn`` owes, which only ``sock`` can bring: a connection closed since
        (``pool.disconnect()``, a client's ``close()``), or opened again, has lost them."""
        if socket_of(conn) is not sock:
            raise lost(conn, self._connection_error)
        if self._poll:
            await_readable(sock, self._poll)
        return [self._read(conn) for _ in pending]

    def _rerun_unloaded(self, conn: Any, pending: Pending, replies: list[Any], first: int) -> None:
        """From ``first``, the first post that met NOSCRIPT (a flushed script cache, a restart), every
        post run again in order, the script loaded: those behind it, and a script written behind
        them, ran before it. (A post is a script that may run twice: a completion with its token.)"""
        for i in range(first, len(pending)):
            _, frame, source = pending[i]
            if not isinstance(replies[i], self._noscript):
                replies[i] = self._send(conn, frame)
            replies[i] = self._loaded(conn, replies[i], frame, source, pair=False)

    def _unloaded(self, answer: Any, pair: bool) -> bool:
        return isinstance(answer[0] if pair else answer, self._noscript)

    def _loaded(self, conn: Any, answer: Any, frame: bytes, source: str | bytes, *, pair: bool) -> Any:
        """``answer``; or, if NOSCRIPT, the answer once the script is loaded and ``frame`` sent again."""
        if not self._unloaded(answer, pair):
            return answer
        self.scripts.missed()
        self._send(conn, _command(b"SCRIPT", b"LOAD", source))
        return (self._send_pair if pair else self._send)(conn, frame)

    def _exchange(self, frame: bytes, source: str | bytes, retry: bool, *, pair: bool) -> Any:
        """Write ``frame`` on a connection of the lane; read one reply, or two (``pair``).

        The connection is taken inside the ``try``: whatever stops the exchange, a
        signal's exception included, it is closed and kept (opened again when next
        taken), never lost to the pool nor handed out with a reply half read.
        """
        if self._local.conn is not None:
            if retry:
                return self._exchange_behind(frame, source, pair)
            self.flush()  # one that may not run twice is not written behind posts (see there)
        send = self._send_pair if pair else self._send
        conn = None
        try:
            conn, kind = self._take()
            self._ready(conn, kind)
            try:
                answer = send(conn, frame)
            except self._timeout:
                raise
            except self._errors:
                if not (retry and kind is _IDLE):
                    raise
                conn.disconnect()  # dead while idle (a Redis restart closed it): opened again, once
                answer = send(conn, frame)
            if isinstance(answer[0] if pair else answer, self._noscript):
                answer = self._loaded(conn, answer, frame, source, pair=pair)
        except BaseException:
            if conn is not None:
                try:
                    conn.disconnect()
                finally:
                    self._broken += (conn,)
            raise
        self._idle += (conn,)
        return answer

    def _exchange_behind(self, frame: bytes, source: str | bytes, pair: bool) -> Any:
        """An exchange on the connection that owes this thread replies: written behind them, in one go.

        The pending replies are read first (they come first), then this one; the pending
        are settled once the connection is clean and back on the stack. A post that
        met NOSCRIPT ran after this script did: the posts from there on run again,
        then this script, so that it sees what they wrote. Hence only a script that
        may run twice (``retry``) is written here; and, its connection broken, it is
        sent again on another.
        """
        local = self._local
        conn, pending, sock = local.conn, local.pending, local.sock
        local.conn, local.pending, local.sock = None, [], None
        written = False
        try:
            if socket_of(conn) is not sock:  # closed meanwhile: its replies are lost
                raise lost(conn, self._connection_error)
            written = True
            self._write(conn, frame)
            replies = self._read_pending(conn, sock, pending)
        except BaseException as exc:
            try:
                conn.disconnect()
            finally:
                self._broken += (conn,)
            deliver_all(pending, exc)
            if not written and isinstance(exc, self._connection_error):
                return self._exchange(frame, source, True, pair=pair)  # nothing of it was written
            if isinstance(exc, self._timeout) or not isinstance(exc, self._errors):
                raise
            try:  # the connection broke: this frame's fate is unknown too
                return self._exchange(frame, source, True, pair=pair)  # as on a dead reused connection
            except BaseException as again:
                _unsent(again, False)  # whatever stopped it this time, the first try may have landed
                raise
        try:
            answer = self._read_pair(conn) if pair else self._read(conn)
            first = first_unloaded(replies, self._noscript)
            if first is not None:
                self._rerun_unloaded(conn, pending, replies, first)
                if not self._unloaded(answer, pair):
                    answer = (self._send_pair if pair else self._send)(conn, frame)  # after them, this time
            if isinstance(answer[0] if pair else answer, self._noscript):
                answer = self._loaded(conn, answer, frame, source, pair=pair)
        except BaseException as exc:  # the pending replies in hand stand; a NOSCRIPT one never ran
            try:
                conn.disconnect()
            finally:
                self._broken += (conn,)
            deliver_each(pending, [exc if isinstance(r, self._noscript) else r for r in replies])
            raise
        self._idle += (conn,)
        deliver_each(pending, replies)
        return answer

    def close(self) -> None:
        """OnReply what this thread owes, and hand the lane's connections back to the pool."""
        self.flush()
        idle, self._idle = self._idle, ()
        broken, self._broken = self._broken, ()
        for conn in broken:
            conn.disconnect()
        for conn in (*idle, *broken):
            self._pool.release(conn)

    # -- connections ---------------------------------------------------------------------
    #
    # A connection is the lane's from the moment it is taken until it is handed back: on
    # ``_idle`` when clean, on ``_broken`` when a failure may have left a reply on it (closed,
    # and closed again when taken, in case a signal cut the first close short). Both are
    # tuples, added to and taken from without a call in between: no signal's exception can
    # land there and lose a connection, and no other thread can see it half taken.

    def _take(self) -> tuple[Any, object]:
        """A connection and where it came from: ``_IDLE``, ``_BROKEN``, or the pool (``_NEW``).

        No call runs between a connection leaving the lane's hands and the caller holding it
        (a signal's exception lands only at a call, a function's start or a loop's jump):
        whatever must be asked of it, :meth:`_ready` asks, inside the caller's ``try``."""
        idle = self._idle
        if idle:
            self._idle = idle[:-1]
            return idle[-1], _IDLE
        broken = self._broken
        if broken:
            self._broken = broken[:-1]
            return broken[-1], _BROKEN
        try:
            conn = self._pool.get_connection(*self._pool_args)
        except Exception as exc:  # nothing was sent
            _unsent(exc)
            raise
        return conn, _NEW

    def _ready(self, conn: Any, kind: object) -> Any:
        """``conn`` connected (a broken one closed first), and the socket it is connected on: a
        failure here means nothing was sent (see :func:`~effectq.store.redis.errors.sent`)."""
        try:
            if kind is _BROKEN:
                conn.disconnect()
            elif kind is _NEW:
                _protect_connection(conn)  # made before the store gave the pool its packer
            sock = socket_of(conn)
            if sock is None:  # closed while idle (``pool.disconnect()``), or new
                conn.connect()
                sock = socket_of(conn)
        except Exception as exc:
            _unsent(exc)
            raise
        return sock

    def _write_behind(self, conn: Any, frame: bytes, sock: Any) -> None:
        """``frame`` written behind the posts whose replies ``conn`` owes on ``sock``: there or
        nowhere. A connection closed since has lost those replies; opened again, the next reply
        on it would be taken for theirs."""
        if socket_of(conn) is not sock:
            raise lost(conn, self._connection_error)
        self._write(conn, frame)

    def _write(self, conn: Any, frame: bytes) -> None:
        """``frame`` written on ``conn``, connected first if it is not (only one that owes
        nothing: see :meth:`_write_behind`). redis-py raises its ``ConnectionError`` or
        ``TimeoutError``, the connection closed."""
        conn.send_packed_command((frame,), False)  # no health check (positional: a cheaper call)

    def _send(self, conn: Any, frame: bytes) -> Any:
        self._write(conn, frame)
        if self._poll:
            await_readable(socket_of(conn), self._poll)
        return self._read(conn)

    def _send_pair(self, conn: Any, frame: bytes) -> tuple[Any, Any]:
        """Two commands written at once; both replies read, so none is left on the socket."""
        first = self._send(conn, frame)
        return first, self._read(conn)

    def _read_pair(self, conn: Any) -> tuple[Any, Any]:
        first = self._read(conn)
        return first, self._read(conn)


def lane_for(client: Any, *, poll: float = 0.0) -> Lane | None:
    """A lane for a client the wire serves (a plain ``redis.Redis`` on a ``redis.ConnectionPool``:
    see :func:`~.clients.served_pool`), else None. ``poll``: see :class:`Lane`."""
    pool = served_pool(client)
    return None if pool is None else Lane(pool, poll=poll)
