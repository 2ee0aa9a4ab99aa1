"""Notifications that a record left flight: one pub/sub listener per Redis store.

The scripts publish a record's key when a record that somebody waited on (field
``w``) is completed, released, marked unknown or resolved. Waiters register a
callback per record key; the listener calls it. Notifications are hints: a
waiter re-claims to learn the truth and bounds every wait, so a message lost to
a reconnect, a failover or a slot migration costs latency, never correctness.

Two transports, chosen by the client:

- **one Redis** (and Sentinel): classic ``PUBLISH`` on one channel per namespace,
  ``effectq:{ns}:notify``; one connection per store.
- **Redis Cluster**: sharded ``SPUBLISH`` (Redis 7.0+) on one channel per bucket,
  ``effectq:{ns:bb}:notify``, in the same slot as the bucket's records (a
  script may only publish to a sharded channel of its own slot). A classic
  ``PUBLISH`` is broadcast over the cluster bus to every node; a sharded one
  goes only to the slot's primary and its replicas: with 3 primaries and 3
  replicas, 1 bus message per notification instead of 5, measured with
  ``CLUSTER INFO``. The listener holds one connection per primary, subscribed
  to the bucket channels that primary serves, and re-subscribes from a fresh
  slot map when a slot moves (the server sends ``sunsubscribe``) or a
  connection fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import StoreError

__all__ = ["Notifier"]

log = logging.getLogger("effectq.notify")

_LISTEN_TIMEOUT = 0.5
_RETRY_PAUSE = 0.5
_DATA = ("message", "smessage")
_MOVED = "a slot moved"

_notifiers: weakref.WeakSet[Notifier] = weakref.WeakSet()
_notifiers_lock = threading.Lock()


def _unlock_all() -> None:
    """In a forked child: every notifier's lock made anew. The thread of the parent that held one
    (subscribing, a round trip) is not in the child, and would never release it."""
    global _notifiers_lock
    _notifiers_lock = threading.Lock()
    for notifier in list(_notifiers):
        notifier._lock = threading.Lock()


os.register_at_fork(after_in_child=_unlock_all)


class Notifier:
    """Calls the callbacks registered for a record key when its key is published.

    Args:
        client: the store's client (``redis.Redis`` or ``redis.cluster.RedisCluster``).
        channels: the channels to listen on (one, or one per bucket when sharded).
        sharded: listen with ``SSUBSCRIBE`` on each primary (Redis Cluster).
    """

    def __init__(self, client: Any, channels: Sequence[str], *, sharded: bool) -> None:
        self._client = client
        self._channels = list(channels)
        self._sharded = sharded
        self._lock = threading.Lock()
        self._callbacks: dict[bytes, list[Callable[[], None]]] = {}
        self._feeds: list[Any] = []  # the subscribed pubsub objects of this generation
        self._generation = 0
        self._pid = os.getpid()
        self._closed = False
        self._retry_at = 0.0  # after a failed subscribe, watchers skip trying until then
        with _notifiers_lock:
            _notifiers.add(self)

    def watch(self, record_key: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when ``record_key`` is published; returns the unsubscribe function.

        Never raises: when the subscription fails (Redis unreachable, a slot map
        gone stale during a migration), the watcher is registered anyway, a
        warning is logged, and the waiter's bounded re-checks carry on.
        """
        name = record_key.encode()
        with self._lock:
            if time.monotonic() >= self._retry_at:
                try:
                    self._ensure_listening()
                except StoreError as exc:  # a hint lost: the waiter polls, its call goes on
                    log.warning("%s; waiters poll meanwhile", exc)
                    self._retry_at = time.monotonic() + _RETRY_PAUSE
            self._callbacks.setdefault(name, []).append(callback)

        def unsubscribe() -> None:
            with self._lock:
                found = self._callbacks.get(name)
                if found and callback in found:
                    found.remove(callback)
                    if not found:
                        del self._callbacks[name]

        return unsubscribe

    def close(self) -> None:
        """Stop listening; each listener closes its own connection within half a second.

        The client stays open: it is the caller's.
        """
        with self._lock:
            self._closed = True
            self._drop_feeds()

    # -- subscribing --------------------------------------------------------------------

    def _ensure_listening(self) -> None:
        """Subscribe now, in the caller's thread, so a watcher that looks again misses nothing."""
        if self._pid != os.getpid():  # forked: the parent's threads and sockets are not ours
            self._feeds, self._pid = [], os.getpid()
            self._callbacks.clear()
        if self._feeds or self._closed:
            return
        try:
            self._feeds = self._subscribe()
        except Exception as exc:
            raise StoreError(f"effectq could not subscribe to its notifications: {exc}") from exc
        for pubsub in self._feeds:
            thread = threading.Thread(
                target=self._listen, args=(pubsub, self._generation), name="effectq-notify", daemon=True
            )
            thread.start()

    def _subscribe(self) -> list[Any]:
        if not self._sharded:
            pubsub = self._client.pubsub()
            try:
                pubsub.subscribe(self._channels[0])
                self._confirm(pubsub, 1)
            except Exception:
                _close(pubsub)
                raise
            return [pubsub]
        feeds: list[Any] = []
        try:
            for node, channels in self._by_primary().values():
                pubsub = self._client.get_redis_connection(node).pubsub()
                feeds.append(pubsub)
                for channel in channels:  # one per command: one SSUBSCRIBE may not span slots
                    pubsub.ssubscribe(channel)
                self._confirm(pubsub, len(channels))
        except Exception:
            for pubsub in feeds:
                _close(pubsub)
            self._refresh_slots()  # the next try routes by a fresh slot map
            raise
        return feeds

    def _by_primary(self) -> dict[str, tuple[Any, list[str]]]:
        by_node: dict[str, tuple[Any, list[str]]] = {}
        for channel in self._channels:
            node = self._client.get_node_from_key(channel)
            by_node.setdefault(node.name, (node, []))[1].append(channel)
        return by_node

    def _refresh_slots(self) -> None:
        try:
            self._client.nodes_manager.initialize()
        except Exception as exc:
            log.warning("effectq could not refresh the cluster slot map (%s)", exc)

    def _drop_feeds(self) -> None:
        """End this generation: its listeners see a new one, stop, and close their connections.

        A listener alone reads and closes its connection, so a socket still being read
        is never handed back to a pool.
        """
        self._generation += 1
        self._feeds = []

    def _resubscribe(self, generation: int, why: str) -> None:
        """Start again (a listener lost its feed), retrying until it works or someone else did."""
        pause, first = _RETRY_PAUSE, True
        while True:
            with self._lock:
                if generation != self._generation or self._closed or (self._feeds and not first):
                    return  # someone else re-subscribed meanwhile
                first = False
                log.info("effectq notification listener re-subscribing (%s)", why)
                self._drop_feeds()
                if self._sharded and why == _MOVED:
                    self._refresh_slots()
                try:
                    self._ensure_listening()
                    return
                except StoreError as exc:
                    log.warning("%s; waiters poll meanwhile", exc)
                generation = self._generation
            time.sleep(pause)
            pause = min(pause * 2, 10.0)

    def _confirm(self, pubsub: Any, count: int) -> None:
        """Read ``count`` subscribe confirmations (with the lock held); an error reply raises.

        A notification on a channel subscribed a moment ago may come first: it is delivered.
        """
        while count:
            message = pubsub.get_message(timeout=5.0)
            kind = message.get("type") if message else None
            if kind in _DATA:
                self._deliver(message["data"], locked=True)
                continue
            if kind not in ("subscribe", "ssubscribe"):
                raise StoreError(f"no subscribe confirmation (got {message!r})")
            count -= 1

    # -- listening ----------------------------------------------------------------------

    def _listen(self, pubsub: Any, generation: int) -> None:
        """Dispatch notifications until closed or superseded; only this thread reads and closes ``pubsub``."""
        try:
            while not self._closed and generation == self._generation:
                try:
                    message = pubsub.get_message(timeout=_LISTEN_TIMEOUT)
                except Exception as exc:
                    if self._closed or generation != self._generation:
                        return
                    log.warning("effectq notification listener lost its connection (%s); waiters poll", exc)
                    time.sleep(_RETRY_PAUSE)
                    self._resubscribe(generation, str(exc))
                    return
                if not message:
                    continue
                kind = message.get("type")
                if kind == "sunsubscribe":  # the server moved the channel's slot to another node
                    self._resubscribe(generation, _MOVED)
                    return
                if kind in _DATA:
                    self._deliver(message["data"], locked=False)
        finally:
            _close(pubsub)

    def _deliver(self, record_key: bytes, *, locked: bool) -> None:
        """Call every watcher of ``record_key``; they stay registered until they unsubscribe.

        A waiter woken for a record that someone else then claims goes on waiting on
        the same watch, and must hear that record's next notification too.
        """
        if locked:
            callbacks = list(self._callbacks.get(record_key, ()))
        else:
            with self._lock:
                callbacks = list(self._callbacks.get(record_key, ()))
        for callback in callbacks:
            try:
                callback()
            except Exception:  # pragma: no cover - callbacks only set events
                log.exception("effectq: a waiter callback failed")


def _close(pubsub: Any) -> None:
    with contextlib.suppress(Exception):  # closing a dead connection
        pubsub.close()
