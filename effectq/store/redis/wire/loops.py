"""What the asyncio wire keeps on each event loop: no reads or writes on a connection here.

A loop holds two things for the async lanes that run on it, as attributes of its
own, so they live and die with it:

* each lane's stack of idle connections (:func:`idle_stacks`, :func:`hold_on`),
  closed when the loop shuts down its async generators (as ``asyncio.run`` does);
  a loop closed without that leaves them to the garbage collector, which closes
  their sockets;
* per task, the connections that owe it replies to pipelined scripts
  (:func:`pending_on`, :func:`pending_made`, :func:`take_pending`): such a connection
  is on no stack, so no other task can take it.

Only the loop's own thread looks at either. A forked child forgets its parent's:
what a loop holds from an earlier generation is never used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import weakref
from collections.abc import AsyncIterator
from typing import Any

from .posted import Pending

__all__ = ["Owing", "hold_on", "idle_stacks", "pending_made", "pending_on", "take_pending"]

_STACKS = "_effectq_idle_connections"
"""The loop attribute holding, per async lane, its idle connections on that loop."""

_PENDING = "_effectq_pending_replies"
"""The loop attribute holding, per task, the lanes on which it owes replies to posted scripts."""

_generation = 0
"""Bumped in a forked child: stacks of an earlier generation are the parent's, never used."""

Owing = tuple[Any, Pending]
"""A connection that owes a task replies, and the posted scripts they answer."""

_Lanes = weakref.WeakKeyDictionary[Any, list[Any]]
"""Per async lane, its idle connections on one loop."""

_Registry = weakref.WeakKeyDictionary["asyncio.Task[Any]", dict[Any, Owing]]
"""Per task, per async lane, the connection that owes it replies."""


def _forget_all() -> None:  # a forked child must not write on its parent's sockets
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forget_all)


def idle_stacks(loop: asyncio.AbstractEventLoop) -> _Lanes | None:
    """Per async lane, its idle connections on ``loop``; None until :func:`hold_on` gave ``loop``
    stacks in this process."""
    stacks = loop.__dict__.get(_STACKS)
    if stacks is None or stacks[0] != _generation:
        return None
    lanes: _Lanes = stacks[1]
    return lanes


async def hold_on(loop: asyncio.AbstractEventLoop) -> _Lanes:
    """Give ``loop`` its stacks, and an async generator that closes them when the loop shuts
    down its async generators. The generator gets no finalizer: collected with a loop that was
    closed without that shutdown, it must not schedule anything on it."""
    stacks: tuple[int, _Lanes] = (_generation, weakref.WeakKeyDictionary())
    keeper = _close_at_shutdown(stacks)
    setattr(loop, _STACKS, stacks)
    setattr(loop, _STACKS + "_keeper", keeper)
    firstiter, finalizer = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=None)
    try:
        await keeper.__anext__()  # parked; registered with the loop by its firstiter hook
    finally:
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    return stacks[1]


async def _close_at_shutdown(stacks: tuple[int, _Lanes]) -> AsyncIterator[None]:
    generation, lanes = stacks
    try:
        yield
    finally:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # collected with its closed loop: the transports close the sockets
            pass
        else:
            if generation == _generation:  # never a forked parent's sockets
                connections = [conn for idle in list(lanes.values()) for conn in idle]
                for idle in list(lanes.values()):
                    idle.clear()
                for conn in connections:
                    with contextlib.suppress(Exception):
                        await conn.disconnect()


def pending_on(loop: asyncio.AbstractEventLoop) -> _Registry | None:
    """Per task of ``loop``, the connections that owe it replies (only the loop's thread looks)."""
    held = loop.__dict__.get(_PENDING)
    if held is None or held[0] != _generation:
        return None
    registry: _Registry = held[1]
    return registry


def pending_made(loop: asyncio.AbstractEventLoop) -> _Registry:
    """:func:`pending_on`, made for ``loop`` if it has none of this process yet."""
    registry = pending_on(loop)
    if registry is None:
        registry = weakref.WeakKeyDictionary()
        setattr(loop, _PENDING, (_generation, registry))
    return registry


def take_pending(lane: Any) -> Owing | None:
    """The connection on ``lane`` that owes the running task replies, taken from the registry:
    from here on it is the caller's alone, to read and hand back, or to close."""
    loop = asyncio.get_running_loop()
    owing = pending_on(loop)
    if not owing:
        return None
    task = asyncio.current_task(loop)
    mine = owing.get(task) if task is not None else None
    if not mine or task is None:
        return None
    held = mine.pop(lane, None)
    if not mine:
        del owing[task]
    return held
