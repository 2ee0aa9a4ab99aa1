"""Lease renewal and deferred writes: one background thread per process.

A running effect holds a lease; the heartbeat renews it every third of the
lease, so only a dead or stalled holder loses it. Holding a lease costs a dict
insert: no thread, timer, wake-up or round trip per call, so a short
effect pays nothing measurable. The thread starts on the first hold and
sleeps until the earliest renewal is due (idle, it looks again every second,
so a new lease rarely has to wake it).

The same thread retries writes that must not be lost when the store blips
after a side effect (a completion, a release), with jittered backoff, for as
long as the process lives. A write the store refuses (the record was taken
over or settled meanwhile) is logged as refused, with what that means and
what to check. When a store closes, and when the process exits, the writes
still waiting for it are tried once more at once; each that does not land is
logged at ERROR with its key and what an operator must do about it, instead
of vanishing with the thread.

No lock is taken on a caller's path. A worker's time limit raises from a
signal handler wherever the task is, and a lock acquired in Python code (a
``threading.Condition``, an ``Event``) is left held when the exception lands
between the acquire and the ``try`` that releases it: the next caller would
wait for ever. So a caller only does what the interpreter does in one step: a
dict insert or removal (a lease, a deferred write) and a put on a
``queue.SimpleQueue``, whose get is the thread's sleep. The thread owns its
schedule; a deferred write belongs to whoever removes it from the dict (the
thread, to try it; or a store closing, to settle it).
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..options import is_time_limit

if TYPE_CHECKING:
    from ..store.base import Store

__all__ = ["Heartbeat", "Lease", "backoff", "heartbeat"]

log = logging.getLogger("effectq.renew")
repair_log = logging.getLogger("effectq.repair")

IDLE_WAKE = 1.0
"""Longest sleep of the heartbeat with no lease held, in seconds. A lease due later (any lease
over 3 s: renewals come at a third of it) is taken without waking the thread."""

BACKOFF_BASE = 0.5
"""The first retry of a deferred write comes within this many seconds; each later one within
twice the last bound, up to :data:`BACKOFF_CAP`."""
BACKOFF_CAP = 30.0


def backoff(attempt: int, rng: random.Random) -> float:
    """Seconds to wait before trying a deferred write again, after ``attempt`` tries (0: the first).

    Full jitter: uniform over (0, min(:data:`BACKOFF_CAP`, :data:`BACKOFF_BASE` * 2**attempt)],
    so the workers a store blip failed together do not all retry together.
    """
    return min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(attempt, 16)) * (1.0 - rng.random())


class Lease:
    """A lease the heartbeat keeps alive from :meth:`Heartbeat.keep` until :meth:`Heartbeat.drop`.

    Making one registers nothing, so a caller can make it first, then keep it inside
    the ``try`` whose handler drops it.
    """

    __slots__ = ("active", "due", "key", "lease_ms", "lost", "store", "token")

    def __init__(self, store: Store, key: str, token: int, lease_ms: int, due: float = 0.0) -> None:
        self.store = store
        self.key = key
        self.token = token
        self.lease_ms = lease_ms
        self.due = due
        self.active = True
        self.lost = False


class _Repair:
    __slots__ = ("advice", "attempt", "error", "refused", "refused_level", "store", "until", "what", "write")

    def __init__(
        self,
        write: Callable[[], object],
        what: str,
        until: float,
        store: object,
        advice: str,
        refused: str,
        refused_level: int,
    ) -> None:
        self.write = write
        self.what = what
        self.attempt = 0
        self.until = until
        self.store = store
        self.advice = advice
        self.refused = refused
        self.refused_level = refused_level
        self.error: BaseException | None = None


class Heartbeat:
    """Renews held leases and retries deferred writes, on one daemon thread."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """A new heartbeat (and, after a fork, none of the parent's leases: they are not ours)."""
        self._leases: dict[Lease, None] = {}  # held leases, as a set: one C-level step to add or remove
        self._repairs: dict[int, _Repair] = {}  # queued or being tried, by sequence number
        self._inbox: queue.SimpleQueue[tuple[float, int] | None] = queue.SimpleQueue()
        self._seq = itertools.count()
        self._trying: int | None = None  # the repair the thread is trying now
        self._thread: threading.Thread | None = None  # the thread last started
        self._beating: threading.Thread | None = None  # the thread that runs (it says so itself)
        self._wake_at = float("inf")
        self._rng = random.Random()  # a forked child draws its own jitter, not its parent's

    def hold(self, store: Store, key: str, token: int, lease_ms: int) -> Lease:
        """Keep ``key``'s lease (held by ``token``) alive until dropped."""
        return self.keep(Lease(store, key, token, lease_ms))

    def keep(self, lease: Lease) -> Lease:
        """Keep ``lease`` alive until dropped.

        A dict insert (atomic under the GIL); the thread is woken only if this lease
        comes due before its next wake-up.
        """
        lease.due = due = time.monotonic() + lease.lease_ms / 3000.0
        self._leases[lease] = None
        if due < self._wake_at or self._beating is None:
            self._ring()
        return lease

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (again: nothing)."""
        self._leases.pop(lease, None)
        lease.active = False

    def defer(
        self,
        write: Callable[[], object],
        what: str,
        *,
        for_seconds: float = 3600.0,
        store: object = None,
        advice: str = "",
        refused: str = "",
        refused_level: int = logging.WARNING,
        after: float | None = None,
    ) -> None:
        """Retry ``write`` in the background until it lands, the store refuses it, or time runs out.

        Args:
            write: the write; it raises while the store fails, and returns False (or 0)
                when the store refuses it (the record is no longer this writer's).
            what: what it writes, for logs (``"complete of <key>"``).
            for_seconds: how long to keep trying.
            store: the store it writes to: closing that store tries it once more, then drops it.
            advice: what an operator must do if it never lands.
            refused: what a refusal means and what to check, for the log.
            refused_level: the level a refusal is logged at.
            after: seconds before the first try; by default a random pause of up to
                :data:`BACKOFF_BASE` (the store just failed: let a blip pass).
        """
        now = time.monotonic()
        due = now + (backoff(0, self._rng) if after is None else after)
        seq = next(self._seq)
        self._repairs[seq] = _Repair(write, what, now + for_seconds, store, advice, refused, refused_level)
        self._inbox.put((due, seq))
        self._ensure()

    def settle_repairs(
        self, store: object = None, *, why: str = "the store closed", within: float = 5.0
    ) -> int:
        """Try the deferred writes to ``store`` (every store: ``None``) once more, now, in this thread.

        Each is dropped afterwards: one that fails again, or that time (``within``
        seconds in all) does not allow, is logged at ERROR with its advice. Called
        by ``RedisStore.close()`` and at the process's exit. Returns how many never
        landed.
        """
        taken: list[tuple[int, _Repair]] = []
        for seq, repair in list(self._repairs.items()):  # one C-level copy
            if (store is None or repair.store is store) and self._repairs.pop(seq, None) is repair:
                taken.append((seq, repair))  # ours now: the thread skips it
        deadline = time.monotonic() + within
        lost = 0
        try:
            while taken:
                repair = taken[0][1]
                if time.monotonic() < deadline:
                    repair.attempt += 1
                    try:
                        done = repair.write()
                    except Exception as exc:
                        if is_time_limit(exc):  # the caller's, not the write's: raised, the rest kept
                            raise
                        repair.error = exc
                    else:
                        del taken[0]
                        self._landed(repair, done)
                        continue
                del taken[0]
                lost += 1
                repair_log.error(
                    "effectq %s never landed before %s (%d attempts; last: %s). %s",
                    repair.what,
                    why,
                    repair.attempt,
                    repair.error or "not tried again: no time left",
                    repair.advice,
                )
        finally:  # cut short (a time limit, ^C): what was not tried goes back to the thread
            for seq, repair in taken:
                self._repairs[seq] = repair
                self._inbox.put((0.0, seq))
        return lost

    def _at_exit(self) -> None:
        self.settle_repairs(why="the process exited")

    def pending(self) -> tuple[int, int]:
        """(leases held, deferred writes not yet landed, the one being tried included)."""
        trying = self._trying
        repairs = len(self._repairs)
        if trying is not None and trying not in self._repairs:
            repairs += 1
        return len(self._leases), repairs

    # -- the thread ---------------------------------------------------------------------

    def _ring(self) -> None:
        """Wake the thread (starting it if it is not running)."""
        self._inbox.put(None)
        self._ensure()

    def _ensure(self) -> None:
        """Start the thread unless it runs.

        ``Thread.is_alive()`` is asked only until the thread says it runs: an exception
        raised into it at the wrong moment marks a running thread stopped (CPython's
        ``_wait_for_tstate_lock``), and a start cut short may leave a thread that never
        runs. Either way another is started; two callers may race here too. Each thread
        stops once it is not the heartbeat's latest, so one keeps running.
        """
        thread = self._thread
        if thread is None or (self._beating is not thread and not thread.is_alive()):
            thread = threading.Thread(target=self._loop, name="effectq-heartbeat", daemon=True)
            self._thread = thread
            thread.start()

    def _loop(self) -> None:
        me = threading.current_thread()
        if self._thread is me:
            self._beating = me
        try:
            self._beat(me)
        finally:
            if self._beating is me:
                self._beating = None

    def _beat(self, me: threading.Thread) -> None:
        schedule: list[tuple[float, int]] = []  # (due, repair's sequence number): this thread's own
        inbox = self._inbox
        while self._thread is me:
            self._wake_at = float("inf")  # while busy, every hold rings; set before the leases are read
            while True:
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    heapq.heappush(schedule, item)
            now = time.monotonic()
            leases = list(self._leases)  # one C-level copy: safe beside lock-free holds
            due = [lease for lease in leases if lease.due <= now]
            repairs: list[int] = []
            while schedule and schedule[0][0] <= now:
                repairs.append(heapq.heappop(schedule)[1])
            if not due and not repairs:
                # Idle, it looks again within IDLE_WAKE rather than sleep for long: a hold due
                # later than that then needs no wake-up (one per call was a thread wake-up per call).
                wake = min((lease.due for lease in leases), default=now + IDLE_WAKE)
                if schedule:
                    wake = min(wake, schedule[0][0])
                self._wake_at = wake
                del leases, due  # asleep, it holds no lease: a store nobody holds any more can go
                try:
                    item = inbox.get(timeout=max(0.0, wake - now))
                except queue.Empty:
                    continue
                if item is not None:
                    heapq.heappush(schedule, item)
                continue
            self._renew_due(due)  # its loop variable dies with its frame: asleep, no lease is held
            for seq in repairs:
                self._repair(seq, schedule)
        for item in schedule:  # another thread took over: it gets what this one had scheduled
            inbox.put(item)

    def _renew_due(self, due: list[Lease]) -> None:
        for lease in due:  # not due again until renewed or retried
            lease.due = float("inf")
        for lease in due:
            self._renew(lease)

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

    def _repair(self, seq: int, schedule: list[tuple[float, int]]) -> None:
        self._trying = seq  # before it leaves the dict, so pending() never misses it
        repair = self._repairs.pop(seq, None)
        if repair is None:  # settled by its store's close, or dropped
            self._trying = None
            return
        repair.attempt += 1
        try:
            done = repair.write()
        except Exception as exc:
            repair.error = exc
            now = time.monotonic()
            if now >= repair.until:
                self._trying = None
                repair_log.error(
                    "effectq gave up %s after %d attempts: %s. %s",
                    repair.what,
                    repair.attempt,
                    exc,
                    repair.advice,
                )
                return
            delay = backoff(repair.attempt, self._rng)
            self._repairs[seq] = repair
            heapq.heappush(schedule, (now + delay, seq))
            self._trying = None
            repair_log.warning("effectq %s failed (%s); retrying in %.1fs", repair.what, exc, delay)
            return
        self._trying = None
        self._landed(repair, done)

    @staticmethod
    def _landed(repair: _Repair, done: object) -> None:
        """Log a write's outcome: it landed, or the store refused it (False, 0)."""
        if done is None or done:
            repair_log.info("effectq %s succeeded after %d attempts", repair.what, repair.attempt)
            return
        repair_log.log(
            repair.refused_level,
            "effectq %s was refused after %d attempts: %s",
            repair.what,
            repair.attempt,
            repair.refused
            or "the record is no longer this writer's (taken over or settled meanwhile); that record stands",
        )


heartbeat = Heartbeat()
"""The process's heartbeat."""
atexit.register(heartbeat._at_exit)
