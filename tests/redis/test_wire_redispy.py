"""What the wire reads of redis-py beyond its public API holds on the redis-py installed.

effectq.store.redis.wire.redispy is the one module that reads redis-py's private
attributes; each is asserted here, and tox runs this file on the oldest and
newest redis-py of each major line the project supports.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from unittest import mock

import pytest
import redis
import redis.asyncio
from redis._parsers import _RESP2Parser, _RESP3Parser

import effectq
from effectq.store.redis.wire import frames, redispy
from effectq.store.redis.wire.aio import AsyncLane, async_lane_for
from effectq.store.redis.wire.sync import lane_for


def test_socket_of_is_the_socket_a_connection_holds_and_a_new_one_after_a_reconnect(redis_url: str) -> None:
    """A reply is pending on one socket: the wire tells a reconnected connection by its socket."""
    pool = redis.ConnectionPool.from_url(redis_url)
    conn = pool.get_connection("PING") if _needs_name(pool) else pool.get_connection()
    try:
        conn.connect()
        first = redispy.socket_of(conn)
        assert isinstance(first, socket.socket)
        conn.send_packed_command((frames.command(b"PING"),), check_health=False)
        assert conn.read_response() in (b"PONG", "PONG")
        assert redispy.socket_of(conn) is first
        pool.disconnect()  # what a client's close() or a fork guard does to connections in use
        assert redispy.socket_of(conn) is None
        conn.connect()
        assert redispy.socket_of(conn) is not None and redispy.socket_of(conn) is not first
    finally:
        pool.release(conn)
        pool.disconnect()


_PARSERS = [(2, _RESP2Parser), (3, _RESP3Parser), (2, None), (3, None)]
_PARSER_IDS = ["resp2-python", "resp3-python", "resp2-default", "resp3-default"]


def _connection(redis_url: str, **options: object) -> tuple[redis.ConnectionPool, redis.Connection]:
    pool = redis.ConnectionPool.from_url(redis_url, **options)
    conn = pool.get_connection("PING") if _needs_name(pool) else pool.get_connection()
    conn.connect()
    return pool, conn


@pytest.mark.parametrize(("protocol", "parser"), _PARSERS, ids=_PARSER_IDS)
def test_reply_reader_reads_from_the_parser_as_read_response_does(
    redis_url: str, protocol: int, parser: type | None
) -> None:
    """A redis-py connection's replies come from its parser (what read_response reads), with no
    call of read_response; an error reply is returned, and the connection reads on."""
    options: dict[str, object] = {"protocol": protocol}
    if parser is not None:
        options["parser_class"] = parser
    pool, conn = _connection(redis_url, **options)
    read = redispy.reply_reader(pool.connection_class)
    assert callable(conn._parser.read_response)  # what it reads through
    try:
        with mock.patch.object(type(conn), "read_response", side_effect=AssertionError("public path")):
            conn.send_packed_command(
                (
                    frames.command(b"PING")
                    + frames.command(b"NO-SUCH-COMMAND")
                    + frames.command(b"ECHO", b"x"),
                ),
                check_health=False,
            )
            assert read(conn) in (b"PONG", "PONG")
            error = read(conn)
            assert isinstance(error, redis.ResponseError)
            assert read(conn) == b"x"
        assert redispy.socket_of(conn) is not None  # an error reply leaves the connection as it was
    finally:
        pool.release(conn)
        pool.disconnect()


def test_reply_reader_raises_a_timeout_as_redis_py_does_the_connection_closed(redis_url: str) -> None:
    """A reply that does not come within the socket timeout: redis-py's TimeoutError, and the
    connection is closed (no reply may be read later as another's)."""
    pool, conn = _connection(redis_url, socket_timeout=0.05)
    assert callable(conn._host_error)  # what the error's message names
    try:
        for read in (redispy.reply_reader(pool.connection_class), redispy.reply_reader(_Overriding)):
            conn.connect()
            with pytest.raises(redis.TimeoutError):
                read(conn)  # nothing was asked: nothing comes
            assert redispy.socket_of(conn) is None
    finally:
        pool.release(conn)
        pool.disconnect()


@pytest.mark.parametrize("how", ["closed-under-it", "eof"])
def test_reply_reader_raises_a_broken_connection_as_redis_py_does_the_connection_closed(
    redis_url: str, how: str
) -> None:
    """A socket that fails (closed under the connection) or ends (the server closed it): redis-py's
    ConnectionError, and the connection is closed, as read_response leaves it."""
    pool, conn = _connection(redis_url)
    try:
        for read in (redispy.reply_reader(pool.connection_class), redispy.reply_reader(_Overriding)):
            conn.connect()
            sock = redispy.socket_of(conn)
            if how == "eof":
                sock.shutdown(socket.SHUT_RD)
            else:
                sock.close()
            with pytest.raises(redis.ConnectionError):
                read(conn)
            assert redispy.socket_of(conn) is None
    finally:
        pool.release(conn)
        pool.disconnect()


class _Overriding(redis.Connection):
    """A connection class of a user's own that reads replies its own way."""

    reads = 0

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        _Overriding.reads += 1
        return super().read_response(*args, **kwargs)


def test_reply_reader_reads_through_read_response_where_a_class_overrides_it(redis_url: str) -> None:
    """A connection class that overrides read_response keeps what it does there; an error reply
    is returned all the same."""
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=_Overriding)
    conn = pool.get_connection("PING") if _needs_name(pool) else pool.get_connection()
    read = redispy.reply_reader(_Overriding)
    try:
        before = _Overriding.reads
        conn.send_packed_command(
            (frames.command(b"PING") + frames.command(b"NO-SUCH-COMMAND"),), check_health=False
        )
        assert read(conn) in (b"PONG", "PONG")
        assert isinstance(read(conn), redis.ResponseError)
        assert _Overriding.reads == before + 2
    finally:
        pool.release(conn)
        pool.disconnect()


def test_writer_of_writes_without_awaiting(redis_url: str) -> None:
    """An asyncio connection's writer takes a frame from plain code; its reply reads as usual."""

    async def main() -> None:
        conn = redis.asyncio.Connection(**redis.asyncio.ConnectionPool.from_url(redis_url).connection_kwargs)
        assert redispy.writer_of(conn) is None
        await conn.connect()
        try:
            writer = redispy.writer_of(conn)
            assert isinstance(writer, asyncio.StreamWriter)
            writer.write(frames.command(b"PING"))
            assert await conn.read_response() in (b"PONG", "PONG")
        finally:
            await conn.disconnect()
        assert redispy.writer_of(conn) is None

    asyncio.run(main())


def test_connections_take_an_attribute_of_the_wire_s_own() -> None:
    """The wire notes on each connection which scripts it had Redis load there (posted.py)."""
    from effectq.store.redis.wire.posted import ScriptCache

    cache, link = ScriptCache(), object()
    for conn in (redis.Connection(), redis.asyncio.Connection()):
        assert cache.ahead(conn, link, "f" * 40, "return 1").startswith(b"*3\r\n$6\r\nSCRIPT\r\n")
        assert cache.ahead(conn, link, "f" * 40, "return 1") == b""


def test_a_default_client_gets_both_wires(redis_url: str) -> None:
    """Every setting this redis-py's pool holds by default is one the asyncio wire carries over or
    leaves out: a client made the usual way gets the sync and the async wire."""
    for client in (redis.Redis.from_url(redis_url), effectq.RedisStore.from_url(redis_url).client):
        lane = lane_for(client)
        assert lane is not None
        assert isinstance(async_lane_for(client, lane), AsyncLane), client.connection_pool.connection_kwargs
        client.close()


@pytest.mark.skipif(not frames.hiredis_packs(redis.connection.Connection), reason="redis-py packs in Python")
def test_protect_pool_gives_idle_connections_the_signal_safe_packer(redis_url: str) -> None:
    """A pool's idle connections, made before the store protected it, get its packer too."""
    pool = redis.ConnectionPool.from_url(redis_url)
    conn = pool.get_connection("PING") if _needs_name(pool) else pool.get_connection()
    pool.release(conn)
    assert type(conn._command_packer).__name__ == "HiredisRespSerializer"
    redispy.protect_pool(pool)
    assert isinstance(conn._command_packer, frames.SignalSafePacker)
    made = pool.get_connection("PING") if _needs_name(pool) else pool.get_connection()
    try:
        assert isinstance(made._command_packer, frames.SignalSafePacker)
        assert made is conn
        other = pool.get_connection("PING") if _needs_name(pool) else pool.get_connection()
        assert isinstance(other._command_packer, frames.SignalSafePacker)
        pool.release(other)
    finally:
        pool.release(made)
        pool.disconnect()


def _needs_name(pool: redis.ConnectionPool) -> bool:
    import inspect

    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty
