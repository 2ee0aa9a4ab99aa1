"""A redis-py client for a URL (plain, TLS, unix socket, Cluster, Sentinel), its pools protected.

Socket timeouts default to 5 seconds, so a Redis that stops answering becomes a
:class:`~effectq.errors.StoreError` instead of a hang.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError
from ...options import Duration, seconds
from .cluster import cluster_from_url, cluster_pools, is_cluster, is_cluster_url
from .sentinel import is_sentinel_url, sentinel_from_url
from .wire.redispy import protect_pool

__all__ = ["client_from_url", "import_redis", "protect_client"]

_DEFAULT_TIMEOUTS = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}


def client_from_url(url: str, *, wait_replicas: int, replica_timeout: Duration, **kwargs: Any) -> Any:
    """The client :meth:`RedisStore.from_url <effectq.store.redis.RedisStore.from_url>` builds."""
    redis = import_redis()
    options = {**_DEFAULT_TIMEOUTS, **kwargs}
    wait = seconds(replica_timeout, option="replica_timeout")
    if wait_replicas and options.get("socket_timeout") and wait >= options["socket_timeout"]:
        raise ConfigurationError(
            f"replica_timeout ({wait}s) must be below socket_timeout ({options['socket_timeout']}s), "
            f"or the socket gives up before WAIT answers"
        )
    if is_cluster_url(url):
        client = cluster_from_url(url, **options)
    elif is_sentinel_url(url):
        client = sentinel_from_url(url, **options)
    else:
        client = redis.Redis.from_url(url, **options)
    return client


def protect_client(client: Any) -> None:
    """Give the connections ``client`` makes from now on (and those idle in it) a command packer
    that an exception from a signal handler cannot crash: redis-py's own, with hiredis
    installed, can (see :class:`~effectq.store.redis.wire.frames.SignalSafePacker`). Its pool's, a
    Sentinel-managed pool's sentinels' too, or on a cluster every node's known now."""
    pools = cluster_pools(client) if is_cluster(client) else [getattr(client, "connection_pool", None)]
    manager = getattr(pools[0], "sentinel_manager", None) if pools else None
    pools += [getattr(sentinel, "connection_pool", None) for sentinel in getattr(manager, "sentinels", ())]
    for pool in pools:
        if pool is not None:
            protect_pool(pool)


def import_redis() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the Redis store needs redis-py: pip install 'effectq[redis]'") from exc
    return redis
