"""A TCP relay to Redis that loses the reply of a chosen request, as a network that drops it would.

The request reaches Redis and runs; its reply, and everything after it on that
connection, never comes back, so the client's read times out and it gives the
connection up (its next request goes out on a new connection, which the relay
passes through). Or, with ``close``, the relay closes the client's connection
cleanly the moment that reply comes (a Redis killed or failed over after the write,
a proxy dropping the connection): the client reads the end of the stream. Which
request: the first that carries a marker, say the SHA of the script whose reply is
to be lost.
"""

from __future__ import annotations

import socket
from importlib import resources

import redis

from effectq.chaos.proxy import Proxy


def script_sha(client: redis.Redis, name: str) -> bytes:
    """Load effectq's ``name`` script on the server (so no NOSCRIPT answers its first call), and
    return its SHA, as ``EVALSHA`` carries it."""
    source = resources.files("effectq.store.redis").joinpath("lua", f"{name}.lua").read_text("utf-8")
    sha = client.script_load(source)
    return (sha if isinstance(sha, str) else sha.decode()).encode()


class LossyProxy(Proxy):
    """A :class:`~effectq.chaos.proxy.Proxy` to Redis; :meth:`lose_reply_to` arms the loss."""

    def __init__(self, host: str, port: int) -> None:
        self._marker: bytes | None = None
        self._left = 0
        self._muted: set[socket.socket] = set()  # upstream sockets whose replies are lost
        self._close = False
        self.answered = 0
        """With ``close``: how many lost replies Redis sent before the relay closed (each ran)."""
        self.lost = 0
        """How many requests' replies were lost so far."""
        super().__init__(host, port)

    @classmethod
    def for_url(cls, url: str) -> tuple[LossyProxy, str]:
        proxy, through = super().for_url(url)
        assert isinstance(proxy, LossyProxy)
        return proxy, through

    def lose_reply_to(self, marker: bytes, times: int = 1, *, close: bool = False) -> None:
        """Lose the replies of the next ``times`` requests that carry ``marker``; ``close``: by
        closing the client's connection as each comes, instead of holding it back."""
        with self._lock:
            self._marker, self._left, self._close = marker, times, close

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            replies = source.getpeername()[1] == self.upstream[1]
            while data := source.recv(65536):
                with self._lock:
                    if replies and source in self._muted:
                        if self._close:
                            self.answered += 1
                            break  # both ends closed below: the client reads the end of the stream
                        continue
                    if not replies and self._left and self._marker is not None and self._marker in data:
                        self._left -= 1
                        self.lost += 1
                        self._muted.add(target)  # before the request leaves: its reply cannot come first
                target.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source, target)
