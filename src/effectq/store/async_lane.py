"""EVALSHA from an event loop, without a thread hop per script.

An async effect's claim and completion went to a worker thread each
(``asyncio.to_thread``): the hop costs more than the round trip itself. The
async lane writes the lane's own frames on redis-py's asyncio connections,
made with the client's connection settings (host, port or socket path, db,
credentials, TLS, timeouts), and reads each reply with that connection's
parser, in the calling loop.

Connections belong to the loop that made them: the loop itself holds each
lane's small stack of idle ones (so they live and die with it), closed when
the loop shuts down its async generators (as ``asyncio.run`` does); a loop
closed without that leaves them to the garbage collector, which closes their
sockets. A forked child forgets its parent's. A failed exchange
disconnects its connection, so a half-read reply never reaches another
script; a cancelled one too. A connection that turns out dead when taken
from the stack (a Redis restart closed it while idle) is replaced once for
a script that may run twice; a timeout is never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from .lane import Lane, _command

__all__ = ["AsyncLane", "async_lane_for"]

_AS_THEY_ARE = frozenset(
    {
        "host",
        "port",
        "db",
        "path",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "client_name",
        "lib_name",
        "lib_version",
        "protocol",
        "encoding",
        "encoding_errors",
        "decode_responses",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_password",
    }
)
"""Connection settings an asyncio connection takes as the client's pool holds them."""

_LEFT_OUT = frozenset(
    {
        "retry",
        "retry_on_error",
        "retry_on_timeout",
        "health_check_interval",
        "socket_read_size",
        "driver_info",
        "event_dispatcher",
        "legacy_responses",
        "himport_registry",
        "maint_notifications_config",
        "maint_notifications_pool_handler",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
    }
)
"""The sync client's own machinery (retries, health checks, maintenance hooks): the lane does
its own single retry of a dead idle connection and needs none of it."""

_STACKS = "_effectq_idle_connections"
"""The loop attribute holding, per async lane, its idle connections on that loop."""

_generation = 0
"""Bumped in a forked child: stacks of an earlier generation are the parent's, never used."""


def _forget_all() -> None:  # a forked child must not write on its parent's sockets
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forget_all)


def async_lane_for(client: Any, lane: Lane | None) -> AsyncLane | None:
    """An async lane for a client the sync ``lane`` serves, with settings an asyncio connection
    can take; else None (the async path then hops to a thread, as before)."""
    if lane is None:
        return None
    try:
        import redis
        import redis.asyncio.connection as aconnection
    except ImportError:  # pragma: no cover - redis-py without its asyncio part
        return None
    pool = client.connection_pool
    kind = pool.connection_class
    classes = {
        redis.connection.Connection: aconnection.Connection,
        redis.connection.SSLConnection: aconnection.SSLConnection,
        redis.connection.UnixDomainSocketConnection: aconnection.UnixDomainSocketConnection,
    }
    if kind not in classes:
        return None
    settings: dict[str, Any] = {}
    for name, value in pool.connection_kwargs.items():
        if name in _AS_THEY_ARE:
            settings[name] = value
        elif name not in _LEFT_OUT and value is not None:
            return None  # a setting the lane cannot carry over (a connect hook, a cache): keep the thread
    return AsyncLane(lane, classes[kind], settings)


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
        self._class = connection_class
        self._settings = settings
        self._keep = keep
        self._timeout = (redis.TimeoutError, TimeoutError, asyncio.TimeoutError)
        self._errors = (redis.ConnectionError, OSError)
        self._response_error = redis.ResponseError
        self._noscript = redis.exceptions.NoScriptError

    async def evalsha(
        self, sha: str, source: str | bytes, keys: Sequence[Any], args: Sequence[Any], *, retry: bool
    ) -> Any:
        """``EVALSHA sha keys args``; loads ``source`` after a NOSCRIPT and runs it again.

        ``retry``: the script may run twice; a dead idle connection is then replaced once.
        """
        frame = self._lane._frame(sha, keys, args)
        conn, reused = await self._take()
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
        try:
            if isinstance(reply, self._noscript):
                loaded = await self._send(conn, _command(b"SCRIPT", b"LOAD", source))
                if isinstance(loaded, self._response_error):
                    raise loaded
                reply = await self._send(conn, frame)
        except BaseException:
            await self._drop(conn)
            raise
        await self._give(conn)
        if isinstance(reply, self._response_error):
            raise reply
        return reply

    @staticmethod
    def serves(loop: asyncio.AbstractEventLoop) -> bool:
        """Whether ``loop`` can hold the lane's connections (a loop without attributes of its
        own cannot: the scripts then go to a thread)."""
        return hasattr(loop, "__dict__")

    async def _send(self, conn: Any, frame: bytes) -> Any:
        """Write ``frame`` and read one reply; an error reply is returned, not raised."""
        await conn.send_packed_command(frame, check_health=False)
        try:
            return await conn.read_response()
        except self._response_error as exc:  # Redis answered: the connection is as good as before
            return exc

    async def _take(self) -> tuple[Any, bool]:
        idle = await self._stack()
        if idle:
            return idle.pop(), True
        return self._class(**self._settings), False

    async def _give(self, conn: Any) -> None:
        idle = await self._stack()
        if len(idle) < self._keep:
            idle.append(conn)
        else:
            await self._drop(conn)

    async def _stack(self) -> list[Any]:
        """This lane's idle connections on the running loop, which holds them."""
        loop = asyncio.get_running_loop()
        stacks = loop.__dict__.get(_STACKS)
        if stacks is None or stacks[0] != _generation:
            stacks = await _hold_on(loop)
        return stacks[1].setdefault(self, [])  # only this loop's thread touches its stacks

    async def _drop(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)


_Stacks = tuple[int, "weakref.WeakKeyDictionary[AsyncLane, list[Any]]"]


async def _hold_on(loop: asyncio.AbstractEventLoop) -> _Stacks:
    """Give ``loop`` its stacks, and an async generator that closes them when the loop shuts
    down its async generators. The generator gets no finalizer: collected with a loop that was
    closed without that shutdown, it must not schedule anything on it."""
    stacks: _Stacks = (_generation, weakref.WeakKeyDictionary())
    keeper = _close_at_shutdown(stacks)
    setattr(loop, _STACKS, stacks)
    setattr(loop, _STACKS + "_keeper", keeper)
    firstiter, finalizer = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=None)
    try:
        await keeper.__anext__()  # parked; registered with the loop by its firstiter hook
    finally:
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    return stacks


async def _close_at_shutdown(stacks: _Stacks) -> AsyncIterator[None]:
    generation, lanes = stacks
    try:
        yield
    finally:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # collected with its closed loop: the transports close the sockets
            pass
        else:
            if generation == _generation:  # never a forked parent's sockets
                connections = [conn for idle in list(lanes.values()) for conn in idle]
                for idle in list(lanes.values()):
                    idle.clear()
            for conn in connections:
                with contextlib.suppress(Exception):
                    await conn.disconnect()
