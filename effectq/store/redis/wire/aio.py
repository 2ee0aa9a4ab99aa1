"""EVALSHA from an event loop, without a thread hop per script.

An async effect's claim and completion went to a worker thread each
(``asyncio.to_thread``): the hop costs more than the round trip itself. The
async lane writes the lane's own frames on redis-py's asyncio connections,
made with the client's connection settings (host, port or socket path, db,
credentials, TLS, timeouts), and reads each reply with that connection's
parser, in the calling loop.

Connections belong to the loop that made them: the loop itself holds each
lane's small stack of idle ones, and per task the ones that owe it replies
(:mod:`.loops`); a forked child forgets its parent's. A failed exchange
disconnects its connection, so a half-read reply never reaches another
script; a cancelled one too. A connection that turns out dead when taken
from the stack (a Redis restart closed it while idle) is replaced once for
a script that may run twice; a timeout is never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from ..errors import mark_unsent as _unsent
from .clients import asyncio_connections
from .frames import command as _command
from .frames import frame as frame_script
from .loops import Owing, hold_on, idle_stacks, pending_made, take_pending
from .loops import pending_on as _pending_on
from .posted import (
    MAX_PENDING,
    OnReply,
    Pending,
    deliver_all,
    deliver_each,
    first_unloaded,
    ignore,
    lost,
    ordinary,
)
from .redispy import writer_of
from .sync import Lane

__all__ = ["AsyncLane", "async_lane_for", "flush_pending"]


def async_lane_for(client: Any, lane: Lane | None) -> AsyncLane | None:
    """An async lane for a client the sync ``lane`` serves, with settings an asyncio connection
    can take (:func:`~.clients.asyncio_connections`); else None (the async path then hops to a
    thread, as before)."""
    made = None if lane is None else asyncio_connections(client)
    if lane is None or made is None:
        return None
    return AsyncLane(lane, *made)


class AsyncLane:
    """Sends scripts on asyncio connections made like the client's; see the module docstring.

    Args:
        lane: the store's sync lane, whose framing it shares.
        connection_class: the redis.asyncio connection class matching the client's.
        settings: the connection settings.
        keep: how many idle connections each loop keeps.
    """

    def __init__(self, lane: Lane, connection_class: type, settings: dict[str, Any], keep: int = 16) -> None:
        import redis

        self._lane = lane
        self._scripts = lane.scripts  # the same server's cache
        self._class = connection_class
        self._settings = settings
        self._keep = keep
        self._timeout = (redis.TimeoutError, TimeoutError, asyncio.TimeoutError)
        self._errors = (redis.ConnectionError, OSError)
        self._response_error = redis.ResponseError
        self._noscript = redis.exceptions.NoScriptError
        self._write_timeout = redis.TimeoutError
        self._connection_error = redis.ConnectionError

    async def evalsha(
        self, sha: str, source: str | bytes, keys: Sequence[Any], args: Sequence[Any], *, retry: bool
    ) -> Any:
        """``EVALSHA sha keys args``; loads ``source`` after a NOSCRIPT and runs it again.

        ``retry``: the script may run twice; a dead idle connection is then replaced once.
        """
        frame = frame_script(sha, keys, args)
        owing = take_pending(self)
        if owing is not None:
            if retry:
                return await self._exchange_behind(owing, frame, source)
            await self._flush(owing)  # one that may not run twice is not written behind posts
        return await self._exchange(frame, source, retry)

    async def _exchange(self, frame: bytes, source: str | bytes, retry: bool) -> Any:
        conn, reused, idle = await self._opened()
        try:
            reply = await self._send(conn, frame)
        except self._timeout:
            await self._drop(conn)
            raise
        except self._errors:
            await self._drop(conn)
            if not (retry and reused):
                raise
            conn = self._class(**self._settings)
            try:
                reply = await self._send(conn, frame)
            except BaseException:
                await self._drop(conn)
                raise
        except BaseException:  # cancelled, or worse: the reply may still be on its way
            await self._drop(conn)
            raise
        if isinstance(reply, self._noscript):
            try:
                reply = await self._loaded(conn, reply, frame, source)
            except BaseException:
                await self._drop(conn)
                raise
        if not self._kept(conn, idle):
            await self._drop(conn)
        if isinstance(reply, self._response_error):
            raise reply
        return reply

    def send_pipelined(
        self, sha: str, source: str | bytes, keys: Sequence[Any], args: Sequence[Any], on_reply: OnReply
    ) -> bool:
        """``EVALSHA`` written now, without waiting; ``settle`` gets its reply when this task reads it.

        That is at this task's next script on the lane, which writes behind it on
        the same connection, or at :func:`flush_pending` (its run's end). Until
        then the connection belongs to this task. Returns False, having written
        nothing, when the script is better sent the usual way: no task, no idle
        connection at hand, or as many tasks owing replies on this loop as the lane
        keeps connections (thousands of tasks must not hold thousands of connections).
        The first post of ``sha`` on a connection writes ``SCRIPT LOAD`` ahead of it, as
        :meth:`Lane.send_pipelined` does.
        """
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        stacks = idle_stacks(loop) if self.serves(loop) else None
        if task is None or stacks is None:
            return False
        owing = pending_made(loop)
        mine = owing.get(task)
        held = mine.get(self) if mine else None
        pending: Pending
        if held is None:
            idle = stacks.get(self) or []
            if not idle or sum(self in lanes for lanes in owing.values()) >= self._keep:
                return False
            conn, pending = idle[-1], []
        else:
            conn, pending = held
            if len(pending) >= MAX_PENDING:
                return False  # sent the usual way, it reads these first
        writer = writer_of(conn)
        if writer is None or writer.transport.is_closing():
            return False  # the usual way finds out what is wrong with it
        frame = frame_script(sha, keys, args)
        if held is None:
            del idle[-1]  # off the stack before a byte is written (no call: nothing lands between)
        try:  # a load noted but not written is on a transport aborted: never written on again
            load = self._scripts.ahead(conn, writer, sha, source)
            writer.write(load + frame)
        except BaseException as exc:
            writer.transport.abort()  # a frame maybe cut short must reach no other script
            if ordinary(exc):
                return False  # the usual way finds out what is wrong
            raise  # a time limit is the task's; a connection held is found closed when next read
        if load:  # no call: the reply is pending before anyone can read it
            pending += ((ignore, load, source),)
        pending += ((on_reply, frame, source),)
        if held is None:
            owing.setdefault(task, {})[self] = (conn, pending)
        return True

    async def _exchange_behind(self, owing: Owing, frame: bytes, source: str | bytes) -> Any:
        """A script on the connection that owes this task replies: written behind them.

        The pending replies are read first (they come first), then this one; the pending
        are settled once the connection is clean and back on the stack. After a post
        that met NOSCRIPT, the posts from there on run again, then this script (it ran
        before them): only a script that may run twice is written here.
        """
        conn, pending = owing
        if _closed(conn):  # closed meanwhile: its replies are lost; this goes elsewhere
            _abandon(conn, pending, lost(conn, self._connection_error))
            return await self._exchange(frame, source, True)
        try:
            await self._write_behind(conn, frame)
            replies = [await self._read(conn) for _ in pending]
        except BaseException as exc:  # the connection broke: this frame's fate is unknown too
            _abandon(conn, pending, exc)
            if isinstance(exc, self._timeout) or not isinstance(exc, self._errors):
                raise
            try:
                return await self._exchange(frame, source, True)  # as on a dead reused connection
            except BaseException as again:
                _unsent(again, False)  # whatever stopped it this time, the first try may have landed
                raise
        try:
            reply = await self._read(conn)
            first = first_unloaded(replies, self._noscript)
            if first is not None:
                await self._rerun_unloaded(conn, pending, replies, first)
                if not isinstance(reply, self._noscript):
                    reply = await self._send(conn, frame)  # after them, this time
            if isinstance(reply, self._noscript):
                reply = await self._loaded(conn, reply, frame, source)
        except BaseException as exc:  # the pending replies in hand stand; a NOSCRIPT one never ran
            _abandon(conn, [], exc)
            deliver_each(pending, [exc if isinstance(r, self._noscript) else r for r in replies])
            raise
        if not self._kept(conn, self._idle_here()):
            await self._drop(conn)
        deliver_each(pending, replies)
        if isinstance(reply, self._response_error):
            raise reply
        return reply

    async def _flush(self, owing: Owing) -> None:
        """Read the replies ``owing`` holds and settle them; the connection is the lane's again."""
        conn, pending = owing
        try:
            replies = [await self._read(conn) for _ in pending]
            first = first_unloaded(replies, self._noscript)
            if first is not None:
                await self._rerun_unloaded(conn, pending, replies, first)
        except BaseException as exc:
            _abandon(conn, pending, exc)
            if ordinary(exc):
                return
            raise  # a time limit too, once every reply pending is settled
        if not self._kept(conn, self._idle_here()):
            await self._drop(conn)
        deliver_each(pending, replies)

    async def _rerun_unloaded(self, conn: Any, pending: Pending, replies: list[Any], first: int) -> None:
        """From ``first``, the first post that met NOSCRIPT (:func:`~.posted.first_unloaded`), every
        post run again in order, the script loaded (as :meth:`Lane._rerun_unloaded`). The caller
        finds ``first``: a coroutine is made only when there is one."""
        for i in range(first, len(pending)):
            _, sent, script = pending[i]
            if not isinstance(replies[i], self._noscript):
                replies[i] = await self._send(conn, sent)
            replies[i] = await self._loaded(conn, replies[i], sent, script)

    async def _loaded(self, conn: Any, reply: Any, frame: bytes, source: str | bytes) -> Any:
        """``reply``; or, if NOSCRIPT (a flushed script cache), the reply once the script is
        loaded and ``frame`` sent again."""
        if not isinstance(reply, self._noscript):
            return reply
        self._scripts.missed()
        loaded = await self._send(conn, _command(b"SCRIPT", b"LOAD", source))
        if isinstance(loaded, self._response_error):
            raise loaded
        return await self._send(conn, frame)

    async def _read(self, conn: Any) -> Any:
        """One reply; an error reply is returned, not raised."""
        try:
            return await conn.read_response()
        except self._response_error as exc:  # Redis answered: the connection is as good as before
            return exc

    @staticmethod
    def serves(loop: asyncio.AbstractEventLoop) -> bool:
        """Whether ``loop`` can hold the lane's connections (a loop without attributes of its
        own cannot: the scripts then go to a thread)."""
        return hasattr(loop, "__dict__")

    async def _send(self, conn: Any, frame: bytes) -> Any:
        """Write ``frame`` and read one reply; an error reply is returned, not raised."""
        await self._write(conn, frame)
        return await self._read(conn)

    async def _write_behind(self, conn: Any, frame: bytes) -> None:
        """``frame`` written behind the posts whose replies ``conn`` owes: on its open transport or
        nowhere. A connection closed since has lost those replies; opened again, the next reply
        on it would be taken for theirs."""
        if _closed(conn):
            raise lost(conn, self._connection_error)
        await self._write(conn, frame)

    async def _write(self, conn: Any, frame: bytes) -> None:
        """``frame`` handed to the connection's transport, in this task.

        redis-py's ``send_packed_command`` runs each write in a task of its own
        when the connection has a socket timeout (``asyncio.wait_for``): a task
        and a trip round the loop per script. A frame the transport took whole
        is on its way; only one it had to buffer is waited for, within the
        socket timeout. A transport lost before the write raises here, as
        ``drain`` would (and without its two coroutines); one lost as it writes
        closes itself, and the read of the reply raises. An unconnected
        connection connects through redis-py.
        """
        writer = writer_of(conn)
        if writer is None:
            await conn.send_packed_command(frame, check_health=False)
            return
        transport = writer.transport
        try:
            if transport.is_closing():  # lost: a write would be dropped without a word
                raise ConnectionResetError("Connection lost")
            writer.write(frame)
            if transport.get_write_buffer_size():
                async with asyncio.timeout(conn.socket_timeout):
                    await writer.drain()
        except TimeoutError:
            await self._drop(conn)
            raise self._write_timeout("Timeout writing to socket") from None
        except OSError as exc:
            await self._drop(conn)
            where = getattr(conn, "path", None) or f"{conn.host}:{conn.port}"
            raise self._connection_error(f"Error writing to {where}: {exc}") from exc

    async def _opened(self) -> tuple[Any, bool, list[Any]]:
        """A connection, connected; whether it was idle on the loop's stack (else it is new); and
        that stack, to hand it back to. A failure here means nothing was sent (see
        :func:`..errors.sent`)."""
        idle = self._idle_here()
        if idle is None:
            idle = await self._stack()
        if idle:
            conn, reused = idle.pop(), True
        else:
            conn, reused = self._class(**self._settings), False
        if writer_of(conn) is None:
            try:
                await conn.connect()
            except Exception as exc:
                await self._drop(conn)
                _unsent(exc)
                raise
        return conn, reused, idle

    def _kept(self, conn: Any, idle: list[Any] | None) -> bool:
        """``conn``, clean, back on ``idle``, the running loop's stack; False when the stack is full
        (the caller drops it)."""
        if idle is None or len(idle) >= self._keep:
            return False
        idle.append(conn)
        return True

    def _idle_here(self) -> list[Any] | None:
        """This lane's idle connections on the running loop; None until the loop holds stacks."""
        stacks = idle_stacks(asyncio.get_running_loop())
        if stacks is None:
            return None
        return stacks.get(self) or stacks.setdefault(self, [])  # only its thread looks

    async def _stack(self) -> list[Any]:
        """:meth:`_idle_here`, the loop given its stacks first if it holds none yet."""
        loop = asyncio.get_running_loop()
        stacks = idle_stacks(loop)
        if stacks is None:
            stacks = await hold_on(loop)
        return stacks.get(self) or stacks.setdefault(self, [])

    async def _drop(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)


def _closed(conn: Any) -> bool:
    writer = writer_of(conn)
    return writer is None or bool(writer.transport.is_closing())


def _abandon(conn: Any, pending: Pending, exc: BaseException) -> None:
    """A connection that failed owing replies: closed at once (never reused), each pending post
    settled with ``exc``. Synchronous, so a cancelled task still gets it done."""
    writer = writer_of(conn)
    if writer is not None:
        writer.transport.abort()
    deliver_all(pending, exc)


async def flush_pending() -> None:
    """Read every reply the running task owes on any async lane, and settle each (an async run's
    end calls this). A failure settles what it stopped from being read with the error."""
    loop = asyncio.get_running_loop()
    owing = _pending_on(loop)
    task = asyncio.current_task(loop)
    if not owing or task is None:
        return
    mine = owing.pop(task, None)
    if not mine:
        return
    left = list(mine.items())
    try:
        while left:
            lane, held = left[0]
            await lane._flush(held)
            left.pop(0)
    except BaseException as exc:  # cancelled while reading: what is left is settled with it
        for _, (conn, pending) in left[1:]:
            _abandon(conn, pending, exc)
        raise
