"""Which redis-py clients the wire serves, and how it asks their pools: no I/O here.

A plain ``redis.Redis`` on a ``redis.ConnectionPool`` takes the wire
(:func:`served_pool`). Subclasses, cluster clients, single-connection clients,
blocking pools (whose bound the lane's held connections would eat into) and
client-side caching (whose invalidations arrive on the connection) go through
redis-py. The async wire serves such a client too when its connections have an
asyncio twin and settings one can take (:func:`asyncio_connections`); else the
async path hops to a thread.
"""

from __future__ import annotations

from typing import Any

from .redispy import async_settings

__all__ = ["asyncio_connections", "plain_pool", "pool_args", "served_pool"]


def plain_pool(client: Any) -> Any | None:
    """The pool of a plain ``redis.Redis`` that is no single-connection client, and caches
    nothing on its connections, else None: what every lane asks of a client first."""
    try:
        import redis
    except ImportError:  # pragma: no cover - a client without redis-py installed
        return None
    if type(client) is not redis.Redis or getattr(client, "connection", None) is not None:
        return None
    pool = getattr(client, "connection_pool", None)
    return None if getattr(pool, "cache", None) is not None else pool


def served_pool(client: Any) -> Any | None:
    """The ``redis.ConnectionPool`` of a client the wire serves (see the module docstring), else None."""
    pool = plain_pool(client)
    if pool is None:
        return None
    import redis

    if type(pool) is not redis.ConnectionPool:
        return None
    base = getattr(redis.connection, "AbstractConnection", redis.connection.Connection)
    if not (isinstance(pool.connection_class, type) and issubclass(pool.connection_class, base)):
        return None
    return pool


def pool_args(pool: Any) -> tuple[str, ...]:
    """What ``pool.get_connection`` needs: redis-py 5 wants a command name, later ones nothing."""
    import inspect

    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    needs_name = parameter is not None and parameter.default is inspect.Parameter.empty
    return ("EVALSHA",) if needs_name else ()


def asyncio_connections(client: Any) -> tuple[type, dict[str, Any]] | None:
    """The redis.asyncio connection class matching the connections of ``client``'s pool, and the
    settings it is made with; None when there is none, or the pool holds a setting the wire
    cannot carry over (a connect hook, a cache)."""
    try:
        import redis
        import redis.asyncio.connection as aconnection
    except ImportError:  # pragma: no cover - redis-py without its asyncio part
        return None
    pool = client.connection_pool
    classes = {
        redis.connection.Connection: aconnection.Connection,
        redis.connection.SSLConnection: aconnection.SSLConnection,
        redis.connection.UnixDomainSocketConnection: aconnection.UnixDomainSocketConnection,
    }
    twin = classes.get(pool.connection_class)
    if twin is None:
        return None
    settings = async_settings(pool.connection_kwargs)
    if settings is None:
        return None
    return twin, settings
