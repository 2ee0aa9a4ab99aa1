"""Redis Cluster: recognising a cluster client, building one from a URL, checking the servers.

redis-py has no URL form for several seed nodes; this module adds the one other
libraries use for Sentinel (``redis+sentinel://h1:p1,h2:p2``), for Cluster::

    redis+cluster://[user:password@]host[:port][,host[:port]...][?option=value&...]
    rediss+cluster://...   (TLS)

Every host is a seed node (the client discovers the rest from any of them);
query options are redis-py's URL options, parsed by redis-py.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ...errors import ConfigurationError, StoreError
from .wire.redispy import protected_pool_class

__all__ = ["check_cluster", "cluster_from_url", "cluster_pools", "is_cluster", "is_cluster_url"]

_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
MIN_VERSION = (7, 0)
"""Sharded pub/sub (``SPUBLISH``), which the scripts use on Cluster, came in Redis 7.0."""


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a ``redis.cluster.RedisCluster``."""
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - depends on the environment
        return False
    return isinstance(client, RedisCluster)


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` uses a ``redis+cluster://`` or ``rediss+cluster://`` scheme."""
    return url.split("://", 1)[0].lower() in _SCHEMES


def seed_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """Split a cluster URL into a redis-py URL for the first seed, and every seed's (host, port).

    Raises:
        ConfigurationError: the URL names no host, or a port is not a number.
    """
    parts = urlsplit(url)
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ConfigurationError(f"not a Redis Cluster URL (redis+cluster://...): {url!r}")
    credentials, _, hosts = parts.netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for item in filter(None, hosts.split(",")):
        host, port = host_port(item, url)
        seeds.append((host, port))
    if not seeds:
        raise ConfigurationError(f"a Redis Cluster URL needs at least one host:port: {url!r}")
    first = hosts.split(",")[0]
    netloc = f"{credentials}@{first}" if credentials else first
    return urlunsplit((scheme, netloc, parts.path, parts.query, "")), seeds


def host_port(item: str, url: str, *, default: int = 6379, kind: str = "Redis Cluster") -> tuple[str, int]:
    """``host[:port]`` or ``[IPv6][:port]`` of a multi-host URL (``kind`` names it in errors)."""
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = item.partition(":")
    if port_text and not port_text.isdigit():
        raise ConfigurationError(f"bad port {port_text!r} in {kind} URL {url!r}")
    if not host:
        raise ConfigurationError(f"empty host in {kind} URL {url!r}")
    return host, int(port_text) if port_text else default


def cluster_from_url(url: str, **kwargs: Any) -> Any:
    """A ``redis.cluster.RedisCluster`` for a ``redis+cluster://`` URL (see the module docstring).

    Every node's pool gives its connections the lane's signal-safe command packer
    (:class:`~effectq.store.redis.wire.frames.SignalSafePacker`), the ones the client opens as it
    starts included."""
    from redis.cluster import ClusterNode, RedisCluster

    first, seeds = seed_nodes(url)
    nodes = [ClusterNode(host, port) for host, port in seeds[1:]]  # type: ignore[no-untyped-call]
    kwargs["connection_pool_class"] = protected_pool_class(kwargs.get("connection_pool_class"))
    return RedisCluster.from_url(first, startup_nodes=nodes, **kwargs)


def cluster_pools(client: Any) -> list[Any]:
    """The connection pools of a cluster client's nodes, as it knows them now."""
    nodes = getattr(client, "get_nodes", None)
    found = [getattr(node.redis_connection, "connection_pool", None) for node in nodes()] if nodes else []
    return [pool for pool in found if pool is not None]


def check_cluster(client: Any) -> None:
    """Refuse a cluster whose servers cannot run the scripts (one round trip, at construction).

    Raises:
        ConfigurationError: a node runs a Redis older than 7.0.
    """
    try:
        versions = client.info("server", target_nodes=client.ALL_NODES)
    except Exception as exc:
        raise StoreError(f"effectq could not reach the Redis Cluster: {exc}") from exc
    for node, info in _per_node(versions).items():
        version = str(info.get("redis_version", "0"))
        if _parse(version) < MIN_VERSION:
            raise ConfigurationError(
                f"effectq on Redis Cluster needs Redis 7.0 or newer (sharded pub/sub); "
                f"node {node} runs {version}"
            )


def _per_node(reply: Any) -> dict[str, dict[str, Any]]:
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
        return reply
    return {"?": reply}


def _parse(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers)
