"""Whether Redis and the broker answer: a server that does not becomes :class:`Unreachable`."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

__all__ = ["Unreachable", "answering", "reachable"]


class Unreachable(Exception):
    """Redis or the broker did not answer: the run is no evidence either way (one line says which)."""


def _connection_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a server did not answer (redis-py, kombu, pika, sockets)."""
    found: list[type[BaseException]] = [OSError]
    with contextlib.suppress(ImportError):
        import redis.exceptions

        found += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    with contextlib.suppress(ImportError):
        import kombu.exceptions

        found.append(kombu.exceptions.OperationalError)
    with contextlib.suppress(ImportError):
        import pika.exceptions

        found.append(pika.exceptions.AMQPConnectionError)
    return tuple(found)


def _safe(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


@contextlib.contextmanager
def answering(url: str, what: str) -> Iterator[None]:
    """Turn a server that does not answer into :class:`Unreachable`, one line naming it."""
    try:
        yield
    except _connection_errors() as exc:
        raise Unreachable(f"{what} at {_safe(url)} did not answer: {exc}") from exc


def reachable(url: str, what: str) -> None:
    """Raise :class:`Unreachable` unless the Redis or AMQP server at ``url`` answers (5 s at most)."""
    parts = urlsplit(url)
    with answering(url, what):
        if parts.scheme.startswith("amqp"):
            with socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 5672), timeout=5
            ) as conn:
                conn.sendall(b"AMQP\x00\x00\x09\x01")
                if not conn.recv(8):
                    raise ConnectionError("it closed the connection")
            return
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            client.ping()
        finally:
            client.close()
