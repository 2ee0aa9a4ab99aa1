"""What the wire needs of redis-py beyond its public API: the one module that reads private attributes.

redis-py's connections have no public way to say whether the socket a reply is
owed on is still the one they hold (a ``pool.disconnect()`` closes it, and the
next write opens another on which that reply never comes), nor to write on an
asyncio connection without awaiting, nor to give the connections already made a
command packer. Each of those reads one private attribute, here alone;
``tests/test_wire_redispy.py`` asserts each on every redis-py the project
supports (tox runs it on the oldest and newest of each major line).
"""

from __future__ import annotations

from typing import Any

from .frames import _PACKER, hiredis_packs

__all__ = ["protect_connection", "protect_pool", "protected_pool_class", "socket_of", "writer_of"]


def socket_of(conn: Any) -> Any:
    """The socket a sync connection is connected on (None when it is not): a reply is owed on
    one socket, and only that socket can bring it."""
    return conn._sock


def writer_of(conn: Any) -> Any:
    """An asyncio connection's ``StreamWriter`` (None when it is not connected): writing on it
    needs no await, so a completion can be written from plain code."""
    return getattr(conn, "_writer", None)


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
