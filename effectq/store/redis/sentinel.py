"""Redis Sentinel: a client from a URL, and the lane on a Sentinel-managed pool.

redis-py finds the primary through Sentinel (``redis.sentinel.Sentinel.master_for``)
but has no URL for it; this module reads the form other libraries use::

    redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db][?option=value&...]
    rediss+sentinel://...   (TLS, to the data nodes and to the sentinels)

The hosts are sentinels (port 26379 by default); ``service`` is the name they
monitor; the credentials and query options are the data nodes', parsed by
redis-py. ``sentinel_username`` and ``sentinel_password`` (query options or
keyword arguments) are the sentinels' own, for sentinels run with
``requirepass``; ``sentinel_kwargs`` (a keyword argument) sets anything else
for them. The sentinels get the data nodes' socket timeouts, as redis-py does,
and on TLS their ``ssl_*`` options.

A connection of the pool asks the sentinels for the primary when it connects, and
talks to that server until it fails. A primary that dies takes its connections
with it. One that is still alive when another is promoted (``SENTINEL FAILOVER``,
a partition) keeps its connections, and takes their writes, until Sentinel turns
it into a replica, seconds later, closing them (docs/deployment.md, "Sentinel",
says what is lost meanwhile). A connection that meets a replica anyway (a primary
demoted by hand, a sentinel that had not heard of the failover) is answered
``READONLY``: redis-py's own commands reconnect on that; the store's lane reads its
replies itself, so :class:`SentinelLane` does the same for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ...errors import ConfigurationError
from .cluster import host_port
from .wire.clients import plain_pool
from .wire.redispy import reply_reader
from .wire.sync import _BROKEN, _IDLE, Lane

__all__ = ["SentinelLane", "is_sentinel_url", "sentinel_from_url", "sentinel_lane_for", "split_sentinel_url"]

_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
_PORT = 26379
_OWN = ("sentinel_username", "sentinel_password")
"""Options for the sentinels themselves, taken out before redis-py reads the rest."""
_NOT_PRIMARY = "WAIT cannot be used with replica"
"""How a replica refuses the ``WAIT`` sent behind a script (the script itself may only read)."""


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` uses a ``redis+sentinel://`` or ``rediss+sentinel://`` scheme."""
    return url.split("://", 1)[0].lower() in _SCHEMES


def split_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, str]:
    """(every sentinel's (host, port), the service name, a redis-py URL for the data nodes).

    The data nodes' URL keeps the credentials, the db and the query options, with
    the first sentinel standing in for the host (redis-py's parser wants one).

    Raises:
        ConfigurationError: no sentinel, no service name, a bad port or db.
    """
    parts = urlsplit(url)
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ConfigurationError(f"not a Redis Sentinel URL (redis+sentinel://...): {url!r}")
    credentials, _, hosts = parts.netloc.rpartition("@")
    sentinels = [
        host_port(item, url, default=_PORT, kind="Redis Sentinel") for item in hosts.split(",") if item
    ]
    if not sentinels:
        raise ConfigurationError(f"a Redis Sentinel URL needs at least one sentinel host:port: {url!r}")
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if not segments or len(segments) > 2:
        raise ConfigurationError(f"a Redis Sentinel URL ends in /service_name or /service_name/db: {url!r}")
    service, db = segments[0], segments[1:]
    if db and not db[0].isdigit():
        raise ConfigurationError(f"bad db {db[0]!r} in Redis Sentinel URL {url!r}")
    first = hosts.split(",")[0]
    netloc = f"{credentials}@{first}" if credentials else first
    path = f"/{db[0]}" if db else ""
    return sentinels, service, urlunsplit((scheme, netloc, path, parts.query, ""))


def sentinel_from_url(url: str, **kwargs: Any) -> Any:
    """A ``redis.Redis`` on the primary of a ``redis+sentinel://`` URL (see the module docstring).

    Keyword arguments are the data nodes' connection options, as for
    ``redis.Redis.from_url``; the URL's own options win over them, as there.
    """
    from redis.connection import parse_url
    from redis.sentinel import Sentinel

    sentinels, service, data_url = split_sentinel_url(url)
    try:
        options = {**kwargs, **parse_url(data_url)}  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ConfigurationError(f"{exc}: {url!r}") from None
    for name in ("host", "port", "connection_class"):
        options.pop(name, None)  # the sentinels name the primary; redis-py picks the class from ``ssl``
    tls = data_url.startswith("rediss:")
    if tls:
        options["ssl"] = True
    own = {name.removeprefix("sentinel_"): options.pop(name) for name in _OWN if options.get(name)}
    given = options.pop("sentinel_kwargs", None) or {}
    shared = {k: v for k, v in options.items() if k.startswith("socket_") or (tls and k.startswith("ssl"))}
    watchers = Sentinel(sentinels, sentinel_kwargs={**shared, **own, **given})  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis-py 8.2
    return watchers.master_for(service, **options)  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis-py 8.2


class SentinelLane(Lane):
    """The lane on a pool whose connections find the primary through Sentinel.

    A connection that meets a replica (``READONLY`` to a script, or a refused
    ``WAIT``) was left on a demoted primary: the call fails with a
    ``redis.ConnectionError`` (a :class:`~effectq.errors.StoreError` for the
    store's caller; nothing was written, a replica takes no writes), and every
    idle connection the lane holds is closed, so the next call connects afresh
    and asks the sentinels where the primary is now. An idle connection to any
    other address than the primary the pool last found is closed when taken.
    """

    def __init__(self, pool: Any, pool_args: tuple[str, ...] | None = None, *, poll: float = 0.0) -> None:
        import redis

        super().__init__(pool, pool_args, poll=poll)
        self._readonly = redis.exceptions.ReadOnlyError
        self._read = reply_reader(redis.connection.Connection)
        """One reply, read as by any redis-py connection: ``SentinelManagedConnection`` would turn
        a ``READONLY`` reply into a ConnectionError of its own, which the lane does itself
        (:meth:`_left_behind`), once it has read every reply the connection owes."""

    def evalsha(
        self, sha: str, source: str | bytes, keys: Sequence[Any], args: Sequence[Any], *, retry: bool
    ) -> Any:
        try:
            return super().evalsha(sha, source, keys, args, retry=retry)
        except self._response_error as exc:
            if self._on_replica(exc):
                raise self._left_behind(exc) from exc
            raise

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
        try:
            return super().evalsha_wait(
                sha, source, keys, args, replicas=replicas, timeout_ms=timeout_ms, retry=retry
            )
        except self._response_error as exc:
            if self._on_replica(exc):
                raise self._left_behind(exc) from exc
            raise

    def _on_replica(self, exc: Exception) -> bool:
        return isinstance(exc, self._readonly) or str(exc).startswith(_NOT_PRIMARY)

    def _left_behind(self, exc: Exception) -> Exception:
        """The ConnectionError a reply from a replica means, every idle connection closed."""
        self._broken += self._idle  # closed when next taken: it then asks the sentinels again
        self._idle = ()
        service = getattr(self._pool, "service_name", "?")
        return self._connection_error(f"the primary of {service!r} is now a replica: {exc}")

    def _ready(self, conn: Any, kind: object) -> Any:
        if kind is _IDLE and (conn.host, conn.port) != self._pool.master_address:
            kind = _BROKEN  # made before the pool last asked the sentinels: another server's
        return super()._ready(conn, kind)


def sentinel_lane_for(client: Any, *, poll: float = 0.0) -> SentinelLane | None:
    """A :class:`SentinelLane` for a plain ``redis.Redis`` on the primary's
    ``SentinelConnectionPool`` (``Sentinel.master_for``), else None: what
    :func:`~effectq.store.redis.wire.sync.lane_for` refuses, other clients included, stays
    on redis-py's command path."""
    pool = plain_pool(client)
    if pool is None:
        return None
    from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

    if type(pool) is not SentinelConnectionPool or not pool.is_master:
        return None
    kind = pool.connection_class
    if not (isinstance(kind, type) and issubclass(kind, SentinelManagedConnection)):
        return None
    return SentinelLane(pool, poll=poll)
