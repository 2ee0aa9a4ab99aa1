"""What the wire needs of redis-py beyond its public API: the one module that reads private attributes.

redis-py's public API covers what the wire does on a connection it holds
(``send_packed_command``, ``read_response``, ``connect``, the pool's
``get_connection`` and ``release``). It has no public way to say whether the
socket a reply is pending on is still the one a connection holds (a
``pool.disconnect()`` closes it, and the next write would open another, on which
that reply never comes), to write on an asyncio connection without awaiting, to
give the connections a pool made already a command packer, or to copy a pool's
connection settings for asyncio connections (its ``connection_kwargs`` mix them
with the sync client's own machinery); and ``read_response`` costs a reply more
than the wire can afford (see :func:`reply_reader`). Those live here alone;
``tests/test_wire_redispy.py`` asserts each on the redis-py installed, and tox
runs it on the oldest and newest of each major line the project supports.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from .frames import _PACKER, hiredis_packs

__all__ = [
    "async_settings",
    "protect_connection",
    "protect_pool",
    "protected_pool_class",
    "reply_reader",
    "socket_of",
    "writer_of",
]


socket_of: Callable[[Any], Any] = attrgetter("_sock")
"""The socket a sync connection is connected on (None when it is not): a reply is pending on
one socket, and only that socket can bring it. (An ``attrgetter``: asked on every call, it
costs a C call, not a Python one.)"""


def reply_reader(connection_class: type) -> Callable[[Any], Any]:
    """How the wire reads one reply on a connection of ``connection_class``: a function of the
    connection. An error reply is returned, not raised (the connection is as good as before);
    otherwise as ``Connection.read_response``: a timeout raises redis-py's ``TimeoutError``, a
    broken socket its ``ConnectionError``, and whatever stops the read (a signal's exception
    too) closes the connection first, so that no reply is left half read on it.

    Where the class reads replies as redis-py's own connections do (it does not override
    ``read_response``), the reply is read from the connection's parser: ``read_response``
    formats its host into an error message before every read, tests the protocol and, for a
    client with health checks, restarts their clock (the wire sends with no health check, and
    a connection it hands back to the pool gets at most one early ``PING``). Otherwise, and on a
    redis-py whose connections have no parser, through ``read_response``.
    """
    import redis

    base = getattr(redis.connection, "AbstractConnection", redis.connection.Connection)
    response_error = redis.ResponseError
    if getattr(connection_class, "read_response", None) is not base.read_response or not hasattr(
        base, "_host_error"
    ):

        def read_public(conn: Any) -> Any:
            try:
                return conn.read_response()
            except response_error as exc:
                return exc

        return read_public
    timeout_error, connection_error = redis.TimeoutError, redis.ConnectionError

    def read_parsed(conn: Any) -> Any:
        try:
            return conn._parser.read_response()
        except BaseException as exc:
            conn.disconnect()
            if isinstance(exc, TimeoutError):  # a socket's timeout (redis-py's is no OSError)
                raise timeout_error(f"Timeout reading from {conn._host_error()}")  # noqa: B904 (as redis-py)
            if isinstance(exc, OSError):
                raise connection_error(f"Error while reading from {conn._host_error()} : {exc.args}")  # noqa: B904
            raise

    return read_parsed


writer_of: Callable[[Any], Any] = attrgetter("_writer")
"""An asyncio connection's ``StreamWriter`` (None when it is not connected): writing on it
needs no await, so a completion can be written from plain code. (An ``attrgetter``, as
:data:`socket_of`.)"""


def protect_pool(pool: Any) -> None:
    """Give the connections of a redis-py ``pool`` the :class:`SignalSafePacker`, where redis-py
    would pack with hiredis and the pool has no packer of its own: every connection it makes
    from now on, and those idle in it now. Connections checked out by another thread keep
    redis-py's packer (the lane gives its own one when it takes it)."""
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict) or kwargs.get("command_packer") is not None:
        return
    if not hiredis_packs(getattr(pool, "connection_class", None)):
        return
    kwargs["command_packer"] = _PACKER
    for conn in list(getattr(pool, "_available_connections", ())):
        protect_connection(conn)


_protected_classes: dict[type, type] = {}


def protected_pool_class(base: type | None = None) -> type:
    """A subclass of ``base`` (``redis.ConnectionPool``) whose pools :func:`protect_pool` themselves
    when made: for clients that make their pools as they go (a cluster, one per node)."""
    import redis

    base = base or redis.ConnectionPool
    made = _protected_classes.get(base)
    if made is None:

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)  # type: ignore[misc]
            protect_pool(self)

        made = _protected_classes[base] = type(base.__name__, (base,), {"__init__": __init__})
    return made


def protect_connection(conn: Any) -> None:
    """:func:`protect_pool` for one connection made before it: redis-py's hiredis packer replaced."""
    packer = getattr(conn, "_command_packer", None)
    if packer is not None and type(packer).__name__ == "HiredisRespSerializer":
        conn._command_packer = _PACKER


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
        "command_packer",
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
"""The sync client's own machinery (retries, health checks, maintenance hooks, a command packer:
asyncio connections pack in Python): the lane does its own single retry of a dead idle
connection and needs none of it."""


def async_settings(connection_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The settings an asyncio connection made like the pool's connections takes; None when the
    pool holds one the wire cannot carry over (a connect hook, a cache)."""
    settings: dict[str, Any] = {}
    for name, value in connection_kwargs.items():
        if name in _AS_THEY_ARE:
            settings[name] = value
        elif name not in _LEFT_OUT and value is not None:
            return None
    return settings
