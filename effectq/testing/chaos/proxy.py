"""A TCP proxy whose connections the chaos runner cuts or holds: a network fault mid-task.

Workers reach the broker through it; :meth:`Proxy.cut` closes every connection at
once (the broker sees the consumer vanish and delivers its unacked messages
again; the worker reconnects through the proxy). :meth:`Proxy.hold` stops
forwarding without closing anything, until :meth:`Proxy.release`: a partition,
where requests wait unanswered (how one worker loses its path to the store's
Redis while the others keep theirs). Only this run's workers use it, so nothing
else on the server is disturbed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Proxy"]


class Proxy:
    """Forward ``127.0.0.1:<port>`` to ``host:port``.

    Args:
        host: the upstream host.
        port: the upstream port.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._flowing = threading.Event()
        self._flowing.set()
        self.cuts = 0
        self.holds = 0
        threading.Thread(target=self._accept, name="effectq-chaos-proxy", daemon=True).start()

    @classmethod
    def for_url(cls, url: str) -> tuple[Proxy, str]:
        """A proxy to the server of ``url``, and the same URL pointing at the proxy."""
        parts = urlsplit(url)
        default = 5672 if parts.scheme.startswith("amqp") else 6379
        proxy = cls(parts.hostname or "127.0.0.1", parts.port or default)
        auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return proxy, urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while self._flowing.wait() and (data := source.recv(65536)):
                self._flowing.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source, target)

    def _drop(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> int:
        """Close every open connection; returns how many sockets were closed."""
        with self._lock:
            victims = list(self._open)
        self._drop(*victims)
        self.cuts += 1
        return len(victims)

    def hold(self) -> None:
        """Stop forwarding: connections stay open, what is sent waits (a partition)."""
        self._flowing.clear()
        self.holds += 1

    def release(self) -> None:
        """Forward again what waited, and what comes."""
        self._flowing.set()

    def close(self) -> None:
        """Stop listening and cut everything."""
        self._closed = True
        self._flowing.set()
        self._listener.close()
        self.cut()
