"""Holding a script in Redis for as long as a test needs, whatever the machine's load.

``CLIENT PAUSE ... WRITE`` with a timeout no test reaches, ended by an explicit
``CLIENT UNPAUSE``: a script sent meanwhile waits in Redis (reads still pass, so
the test can see it waiting). A test waits until the script is held, instead of
sleeping and hoping it was written before a short pause ran out. Only on a
server of the test's own (``private_redis``): never on the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import redis

WITHIN = 30.0
"""How long a script may take to reach Redis (a deadline, never a measure)."""
_SCRIPTS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall"}


@contextlib.contextmanager
def writes_paused(admin: redis.Redis) -> Iterator[None]:
    """Scripts wait in Redis until the block ends (or an earlier :func:`unpause`)."""
    admin.execute_command("CLIENT", "PAUSE", 600_000, "WRITE")
    try:
        yield
    finally:
        unpause(admin)


def unpause(admin: redis.Redis) -> None:
    admin.execute_command("CLIENT", "UNPAUSE")


def held(admin: redis.Redis) -> bool:
    """A client's script waits in the pause (Redis lists it as blocked)."""
    return any("b" in str(c.get("flags", "")) and c.get("cmd") in _SCRIPTS for c in admin.client_list())


def until_held(admin: redis.Redis, within: float = WITHIN) -> None:
    deadline = time.monotonic() + within
    while not held(admin):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no script reached the paused Redis within {within:.0f}s")
        time.sleep(0.01)


async def until_held_async(admin: redis.Redis, within: float = WITHIN) -> None:
    """:func:`until_held` from an event loop: it keeps running, so its script can go out."""
    deadline = time.monotonic() + within
    while not held(admin):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no script reached the paused Redis within {within:.0f}s")
        await asyncio.sleep(0.01)
