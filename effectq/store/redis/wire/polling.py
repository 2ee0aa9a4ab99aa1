"""Waiting for a reply by polling its socket for a while before sleeping in the read.

A thread that sleeps in ``recv`` until Redis answers pays for being woken: on a virtual
machine whose idle CPU halts, that is tens of microseconds per round trip, often more than
Redis' own work, and the Python that runs right after it runs slower, its caches cold. A
thread that polls the socket (``poll`` with no timeout, in a loop) sees the reply as it
comes. It costs the waiting thread's CPU for as long as it polls, so it is opt-in
(``RedisStore(poll_replies=...)``) and bounded: past the budget, the read sleeps as usual.

Polling only waits: it reads nothing, so whatever stops it (a time limit raised from a
signal handler) leaves the connection as a read stopped before its first byte would. A
socket that is not the standard library's own (gevent's, eventlet's: polling would hold
their hub; or a TLS socket, whose decrypted bytes its file descriptor does not show) is
never polled.
"""

from __future__ import annotations

import _socket
import select
import socket
import time
from typing import Any

__all__ = ["await_readable"]

_poll = getattr(select, "poll", None)  # taken at import: gevent removes it when it patches select
_POLLIN = getattr(select, "POLLIN", 1)
_plain = socket.socket
_clock = time.perf_counter


def await_readable(sock: Any, budget: float) -> None:
    """Return once ``sock`` has bytes (or an error) to read, or after ``budget`` seconds."""
    if _poll is None or type(sock) is not _plain or not isinstance(sock, _socket.socket):
        return
    poller = _poll()
    poller.register(sock, _POLLIN)
    end = _clock() + budget
    while not poller.poll(0):
        if _clock() >= end:
            return
