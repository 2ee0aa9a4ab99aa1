"""Lease renewal and deferred writes: one background thread per process.

A running effect holds a lease; the heartbeat renews it every third of the
lease, so only a dead or stalled holder loses it. Holding a lease costs a dict
insert: no thread, timer, wake-up or round trip per call, so a short
effect pays nothing measurable. The thread starts on the first hold and
sleeps until the earliest renewal is due (idle, it looks again every second,
so a new lease rarely has to wake it).

The same thread retries writes that must not be lost when the store blips
after a side effect (a completion, a release), with backoff, for as long as
the process lives. When a store closes, and when the process exits, the
writes still waiting for it are tried once more at once; each that does not
land is logged at ERROR with its key and what an operator must do about it,
instead of vanishing with the thread.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store.base import Store

__all__ = ["Heartbeat", "Lease", "heartbeat"]

log = logging.getLogger("effectq.renew")

IDLE_WAKE = 1.0
"""Longest sleep of the heartbeat with no lease held, in seconds. A lease due later (any lease
over 3 s: renewals come at a third of it) is taken without waking the thread."""
repair_log = logging.getLogger("effectq.repair")


class Lease:
    """A lease the heartbeat keeps alive until :meth:`Heartbeat.drop`."""

    __slots__ = ("active", "due", "key", "lease_ms", "lost", "store", "token")

    def __init__(self, store: Store, key: str, token: int, lease_ms: int, due: float) -> None:
        self.store = store
        self.key = key
        self.token = token
        self.lease_ms = lease_ms
        self.due = due
        self.active = True
        self.lost = False


class _Repair:
    __slots__ = ("advice", "attempt", "error", "store", "until", "what", "write")

    def __init__(
        self, write: Callable[[], object], what: str, until: float, store: object, advice: str
    ) -> None:
        self.write = write
        self.what = what
        self.attempt = 0
        self.until = until
        self.store = store
        self.advice = advice
        self.error: BaseException | None = None


class Heartbeat:
    """Renews held leases and retries deferred writes, on one daemon thread."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """A new heartbeat (and, after a fork, none of the parent's leases: they are not ours)."""
        self._cond = threading.Condition(threading.Lock())
        self._leases: dict[int, Lease] = {}
        self._repairs: list[tuple[float, int, _Repair]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")

    def hold(self, store: Store, key: str, token: int, lease_ms: int) -> Lease:
        """Keep ``key``'s lease (held by ``token``) alive until dropped.

        The common case takes no lock: a dict insert (atomic under the GIL), and
        the thread is woken only if this lease comes due before its next wake-up.
        """
        due = time.monotonic() + lease_ms / 3000.0
        lease = Lease(store, key, token, lease_ms, due)
        self._leases[id(lease)] = lease
        if due < self._wake_at or self._thread is None:
            with self._cond:
                self._wake(due)
        return lease

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease``."""
        lease.active = False
        self._leases.pop(id(lease), None)

    def defer(
        self,
        write: Callable[[], object],
        what: str,
        *,
        for_seconds: float = 3600.0,
        store: object = None,
        advice: str = "",
    ) -> None:
        """Retry ``write`` in the background until it returns, or time runs out.

        Args:
            write: the write; it raises while the store fails.
            what: what it writes, for logs (``"complete of <key>"``).
            for_seconds: how long to keep trying.
            store: the store it writes to: closing that store tries it once more, then drops it.
            advice: what an operator must do if it never lands.
        """
        now = time.monotonic()
        repair = _Repair(write, what, now + for_seconds, store, advice)
        with self._cond:
            heapq.heappush(self._repairs, (now + 0.5, next(self._seq), repair))
            self._wake(now + 0.5)

    def settle_repairs(
        self, store: object = None, *, why: str = "the store closed", within: float = 5.0
    ) -> int:
        """Try the deferred writes to ``store`` (every store: ``None``) once more, now, in this thread.

        Each is dropped afterwards: one that fails again, or that time (``within``
        seconds in all) does not allow, is logged at ERROR with its advice. Called
        by ``RedisStore.close()`` and at the process's exit. Returns how many never
        landed.
        """
        with self._cond:
            mine = [entry for entry in self._repairs if store is None or entry[2].store is store]
            if not mine:
                return 0
            taken = {entry[1] for entry in mine}
            self._repairs = [entry for entry in self._repairs if entry[1] not in taken]
            heapq.heapify(self._repairs)
        deadline = time.monotonic() + within
        lost = 0
        for _, _, repair in sorted(mine):
            if time.monotonic() < deadline:
                repair.attempt += 1
                try:
                    repair.write()
                except Exception as exc:
                    repair.error = exc
                else:
                    repair_log.info("effectq %s succeeded after %d attempts", repair.what, repair.attempt)
                    continue
            lost += 1
            repair_log.error(
                "effectq %s never landed before %s (%d attempts; last: %s). %s",
                repair.what,
                why,
                repair.attempt,
                repair.error or "not tried again: no time left",
                repair.advice,
            )
        return lost

    def _at_exit(self) -> None:
        self.settle_repairs(why="the process exited")

    def pending(self) -> tuple[int, int]:
        """(leases held, repairs queued): for tests and stats."""
        with self._cond:
            return len(self._leases), len(self._repairs)

    def _wake(self, due: float) -> None:
        """Start the thread, or wake it for an earlier due time (called with the lock held)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="effectq-heartbeat", daemon=True)
            self._thread.start()
        elif due < self._wake_at:
            self._cond.notify()

    def _next(self) -> list[Lease | _Repair]:
        """Wait until something is due; return what is (called with the lock held)."""
        while True:
            now = time.monotonic()
            leases = list(self._leases.values())  # one C-level copy: safe beside lock-free holds
            due: list[Lease | _Repair] = [lease for lease in leases if lease.due <= now]
            while self._repairs and self._repairs[0][0] <= now:
                due.append(heapq.heappop(self._repairs)[2])
            if due:
                self._wake_at = float("inf")
                return due
            # Idle, it looks again within IDLE_WAKE rather than sleep for long: a hold due
            # later than that then needs no notify (one per call was a thread wake-up per call).
            wake = min((lease.due for lease in leases), default=now + IDLE_WAKE)
            if self._repairs:
                wake = min(wake, self._repairs[0][0])
            self._wake_at = wake
            self._cond.wait(wake - now)

    def _loop(self) -> None:
        while True:
            with self._cond:
                items = self._next()
                for item in items:  # not due again until renewed or retried
                    if isinstance(item, Lease):
                        item.due = float("inf")
            for item in items:
                if isinstance(item, Lease):
                    self._renew(item)
                else:
                    self._repair(item)

    def _renew(self, lease: Lease) -> None:
        try:
            kept = lease.store.renew(lease.key, lease.token, lease_ms=lease.lease_ms)
        except Exception as exc:
            retry = min(1.0, lease.lease_ms / 10000.0)
            log.warning("effectq renew of %s failed (%s); retrying in %.1fs", lease.key, exc, retry)
            lease.due = time.monotonic() + retry
            return
        if kept:
            lease.due = time.monotonic() + lease.lease_ms / 3000.0
            return
        was_active = lease.active
        lease.lost = True
        self.drop(lease)
        if was_active:
            log.warning(
                "effectq lost the lease of %s (token %s): it was taken over or settled; "
                "this attempt can no longer record its result",
                lease.key,
                lease.token,
            )

    def _repair(self, repair: _Repair) -> None:
        repair.attempt += 1
        try:
            repair.write()
        except Exception as exc:
            repair.error = exc
            now = time.monotonic()
            if now >= repair.until:
                repair_log.error(
                    "effectq gave up %s after %d attempts: %s. %s",
                    repair.what,
                    repair.attempt,
                    exc,
                    repair.advice,
                )
                return
            delay = min(30.0, 0.5 * 2**repair.attempt)
            repair_log.warning("effectq %s failed (%s); retrying in %.0fs", repair.what, exc, delay)
            with self._cond:
                heapq.heappush(self._repairs, (now + delay, next(self._seq), repair))
            return
        repair_log.info("effectq %s succeeded after %d attempts", repair.what, repair.attempt)


heartbeat = Heartbeat()
"""The process's heartbeat."""
atexit.register(heartbeat._at_exit)
