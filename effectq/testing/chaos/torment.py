"""The fault loop: :meth:`Chaos.torment` faults the workers until every task has finished.

It reads the ledger's events as they come (deliveries, copies, finished tasks), strikes the
workers as :class:`~effectq.testing.chaos.options.Options` says, tends them (resumes the paused,
finishes the shutdowns, restarts the dead), and sends again what a broker lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..ledger import Ledger
from ..workers import Producer, WorkerProcess
from .options import Options
from .proxy import Proxy
from .reach import answering, reachable
from .redis_server import RedisServer
from .report import Report
from .user import UserProducer

__all__ = ["CALM_AFTER", "Chaos"]

log = logging.getLogger("effectq.chaos")

CALM_AFTER = 0.6
"""Faults stop after this share of the timeout, so the last tasks can finish."""


class Chaos:
    """One run's faults and bookkeeping: :meth:`torment` faults the workers until every task finished.

    A broker can lose a message outright (kombu's Redis transport, when a worker
    dies between popping a task and registering it as unacked): when nothing has
    happened for ``stall`` seconds (:data:`~effectq.testing.chaos.options.STALL` by default), the
    unfinished tasks are sent again, as an application's own reconciler would. The run is keyed by a
    business key, so a resent task is the same run and its effects still apply once.
    """

    def __init__(
        self,
        options: Options,
        rng: random.Random,
        ledger: Ledger,
        producer: Producer | UserProducer,
        report: Report,
        started: float,
        server: RedisServer | None,
        proxy: Proxy | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.options = options
        self.rng = rng
        self.ledger = ledger
        self.producer = producer
        self.report = report
        self.started = started
        self.server = server
        self.proxy = proxy
        self.progress = progress
        self.finished: set[int] = set()
        self.running: dict[int, int] = {}  # pid -> the task it runs (from the ledger's start/stop events)
        self.paused: dict[str, float] = {}  # worker name -> when to resume it
        self.stopping: dict[str, float] = {}  # worker name -> when its shutdown's grace runs out
        self.store_frozen_until = 0.0
        self.store_proxies: dict[str, Proxy] = {}
        self.partitioned: dict[str, float] = {}  # worker name -> when its path to the store heals
        self.cursor = 0
        self.strikes = 0
        self.groups: dict[int, tuple[str, list[int]]] = {}  # callback task -> (its chord's group id, header)
        self.called_again: set[int] = set()  # the callbacks sent again (once each)
        self.failed: list[int] = []  # tasks Celery gave up on (acked as failed), to send again

    def send(self, task_no: int, *, countdown: float = 0.0) -> None:
        o = self.options
        self.producer.send(task_no, o.effects, pause=o.pause, retry_after=o.retry_after, countdown=countdown)

    def torment(self, workers: list[WorkerProcess], idle: list[WorkerProcess]) -> None:
        """Fault the workers until every task has finished (or the timeout)."""
        o, report = self.options, self.report
        now = time.monotonic()
        last_event = last_line = now

        def every(seconds: float | None) -> float:
            return now + seconds if seconds else float("inf")

        next_kill = now + self.rng.uniform(*o.kill_every) if o.kill_every else float("inf")
        next_restart, next_cut = every(o.redis_restart), every(o.cut)
        # the first SIGSTOP, store freeze or partition comes with the first task in flight
        next_stop, next_freeze, next_partition = (
            now if s else float("inf") for s in (o.sigstop, o.store_pause, o.partition)
        )
        frozen_for = max(o.lease * 2, o.lease + 3.0)
        while len(self.finished) < o.units:
            time.sleep(0.2)
            now = time.monotonic()
            if now - self.started > o.timeout:
                report.timed_out = True
                break
            with answering(o.redis_url, "Redis (the ledger)"):
                events, self.cursor = self.ledger.events_since(self.cursor)
            if events:
                last_event = now
            elif now - last_event > o.stall and o.chord:
                self._resend_callbacks()
                last_event = now
            elif now - last_event > o.stall and now >= self.store_frozen_until:
                broker = self.producer.config.broker
                reachable(broker, "the broker")
                with answering(broker, "the broker"):
                    unfinished = [t for t in range(o.tasks) if t not in self.finished]
                    for task_no in unfinished:
                        self.send(task_no)
                report.resent += len(unfinished)
                last_event = now
            self._count(events)
            self._resend_failed()
            if self.progress is not None and o.progress and now - last_line >= o.progress:
                last_line = now
                self.progress(self._progress_line(now))
            if self.server is not None and self.store_frozen_until and now >= self.store_frozen_until:
                self.server.resume()
                self.store_frozen_until = 0.0
            self._tend(workers, idle, now)
            if report.deaths > 5 * (o.workers + o.idle_workers) and not report.deliveries:
                report.timed_out = True  # the workers die as they start: their logs say why
                break
            if now - self.started > o.timeout * CALM_AFTER:
                if not report.calmed:  # let the stragglers finish: a liveness matter, not a safety one
                    report.calmed = now - self.started
                continue
            alive = [
                w for w in workers if w.alive and w.name not in self.paused and w.name not in self.stopping
            ]
            if now >= next_kill and o.kill_every and alive:
                kind = o.kill_with[self.strikes % len(o.kill_with)]
                if self._fault(kind, alive, now):
                    self.strikes += 1
                # No busy victim now: the next moment is drawn again. Waiting for one instead would
                # strike each task as it starts, before its first effect: the last task, killed at
                # every redelivery, never finished until the faults stopped.
                next_kill = now + self.rng.uniform(*o.kill_every)
            frozen = [w for w in alive if self._busy(w)] if o.target == "busy" else alive
            if now >= next_stop and o.sigstop and frozen:
                victim = self.rng.choice(frozen)
                victim.pause()
                self.paused[victim.name] = now + frozen_for
                report.pauses += 1
                next_stop = now + o.sigstop
            if (
                now >= next_restart
                and self.server is not None
                and o.redis_restart
                and not self.store_frozen_until
            ):
                self.server.restart()
                next_restart = time.monotonic() + o.redis_restart
            if (
                now >= next_freeze
                and self.server is not None
                and o.store_pause
                and not self.store_frozen_until
                and any(self._busy(w) for w in alive)  # while effects are in flight
            ):
                self.server.pause()
                self.store_frozen_until = now + frozen_for
                report.store_pauses += 1
                next_freeze = now + o.store_pause + frozen_for
            if now >= next_partition and o.partition:
                cut_off = [w for w in alive if w.name not in self.partitioned and self._busy(w)]
                if cut_off:
                    victim = self.rng.choice(cut_off)
                    self.store_proxies[victim.name].hold()
                    self.partitioned[victim.name] = now + frozen_for
                    report.partitions += 1
                    next_partition = now + o.partition
            if now >= next_cut and self.proxy is not None and o.cut:
                self.proxy.cut()
                next_cut = now + o.cut
        for worker in workers:
            if worker.paused:
                worker.resume()
        for proxy in self.store_proxies.values():
            proxy.release()
        if self.server is not None and self.store_frozen_until:
            self.server.resume()
        if not report.timed_out:
            self._drain()
        report.finished = len(self.finished)

    def _drain(self) -> None:
        """Wait (``stall`` seconds at most) for the executions still running when the last task
        finished: a copy a frozen or cut-off worker resumes may still apply, and counts."""
        deadline = time.monotonic() + self.options.stall
        while True:
            with answering(self.options.redis_url, "Redis (the ledger)"):
                events, self.cursor = self.ledger.events_since(self.cursor)
            self._count(events)
            if not any(_running(pid) for pid in self.running) or time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    def _resend_failed(self) -> None:
        """Send again, at once, the unfinished tasks Celery gave up on: acked as failed (a solo
        worker's cold shutdown raises into its task), nothing delivers them again, so an
        application's reconciler would; without this they would wait for the stall."""
        lost = [t for t in dict.fromkeys(self.failed) if t not in self.finished and not self.options.chord]
        self.failed.clear()
        if lost:
            with answering(self.producer.config.broker, "the broker"):
                for task_no in lost:
                    self.send(task_no)
            self.report.resent += len(lost)

    def _resend_callbacks(self) -> None:
        """Send again the callbacks of chords whose header tasks all finished, in their chord's group.

        Celery's Redis result backend claims a chord's dispatch before it sends the callback: a
        worker killed holding the claim leaves the chord without a callback when the copy of its
        header task comes back before the claim expires. The callback keyed by its group id applies
        its effect once however many times it is sent. (Header tasks are not sent again: a header
        task sent alone belongs to no chord; RabbitMQ redelivers them.)"""
        lost = [
            (callback, group)
            for callback, (group, header) in self.groups.items()
            if callback not in self.finished | self.called_again and all(t in self.finished for t in header)
        ]
        self.called_again.update(callback for callback, _ in lost)
        broker = self.producer.config.broker
        with answering(broker, "the broker"):
            for callback, group in lost:
                assert isinstance(self.producer, Producer)
                self.producer.send_callback(callback, group)
        self.report.resent += len(lost)

    def _count(self, events: list[dict[str, Any]]) -> None:
        report = self.report
        for event in events:
            kind, pid = event["kind"], int(event.get("pid", 0))
            if kind == "start":
                report.deliveries += 1
                report.retries += int(event.get("retries", 0)) > 0
                task = event["task"]
                others = [p for p, t in self.running.items() if t == task and p != pid and _running(p)]
                if others:
                    report.copies += 1
                    log.debug("task %s started in process %s while %s still ran it", task, pid, others)
                self.running[pid] = task
            elif kind == "stop":
                self.running.pop(pid, None)
            elif kind in ("done", "unknown") and event["task"] not in self.finished:
                self.finished.add(event["task"])
                report.replayed += int(event.get("replayed", 0))
                report.reconciled += int(event.get("reconciled", 0))
                report.unknown += kind == "unknown"
            elif kind == "fenced":
                report.fenced += 1
            elif kind == "retry":
                report.retry_asks += 1
            elif kind == "wrong":
                report.wrong += 1
            elif kind == "time_limit":
                report.time_limits += 1
            elif kind == "failed":
                self.failed.append(event["task"])

    def _tend(self, workers: list[WorkerProcess], idle: list[WorkerProcess], now: float) -> None:
        """Resume the paused, finish the shutdowns, restart the dead."""
        report = self.report
        for worker in [*workers, *idle]:
            if worker.name in self.paused and now >= self.paused[worker.name]:
                worker.resume()
                del self.paused[worker.name]
            if worker.name in self.partitioned and now >= self.partitioned[worker.name]:
                self.store_proxies[worker.name].release()
                del self.partitioned[worker.name]
            if worker.name in self.stopping:
                if worker.alive and now < self.stopping[worker.name]:
                    continue
                if worker.alive:  # the grace ran out: what an orchestrator does next
                    worker.kill()
                    report.grace_kills += 1
                del self.stopping[worker.name]
                worker.start()
            elif not worker.alive:
                report.deaths += 1
                worker.start()

    def _fault(self, kind: str, alive: list[WorkerProcess], now: float) -> bool:
        """Strike one worker with ``kind`` (see :data:`~effectq.testing.chaos.options.KILL_WITH`);
        False when no victim fits yet."""
        o, report = self.options, self.report
        candidates = alive
        if o.target == "busy" or kind == "child":
            busy = [w for w in alive if self._busy(w)]
            candidates = busy or ([] if o.target == "busy" else alive)
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        if kind == "child":
            children = _children(victim.pid)
            running = [p for p in children if p in self.running]
            chosen = running if o.target == "busy" else children
            if not chosen:
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.rng.choice(chosen), signal.SIGKILL)
            report.child_kills += 1
        elif kind in ("term", "quit"):
            assert victim.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.pid, signal.SIGTERM if kind == "term" else signal.SIGQUIT)
            self.stopping[victim.name] = now + o.grace
            if kind == "term":
                report.terms += 1
            else:
                report.quits += 1
        else:
            victim.kill()
            victim.start()
            report.kills += 1
        return True

    def _busy(self, worker: WorkerProcess) -> bool:
        """Whether the worker (or one of its children) runs a task now."""
        if worker.pid is None:
            return False
        return any(p in self.running for p in (worker.pid, *_children(worker.pid)))

    def _progress_line(self, now: float) -> str:
        r = self.report
        counts = self.ledger.counts()
        duplicates = sum(n - 1 for n in counts.values() if n > 1)
        kills = r.kills + r.child_kills + r.terms + r.quits
        return (
            f"effectq chaos {now - self.started:5.0f}s: "
            f"{len(self.finished)}/{self.options.units} tasks done, "
            f"{kills} kills, {max(0, r.deliveries - len(self.finished))} redeliveries, "
            f"{r.copies} copies, {duplicates} duplicates so far"
        )


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a SIGSTOPped process still runs)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        if not Path("/proc/self/stat").exists():  # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    return state not in (b"Z", b"X")


def _children(pid: int | None) -> list[int]:
    """The live children of ``pid`` (a prefork worker's pool processes)."""
    if pid is None:
        return []
    found: list[int] = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = entry.read_bytes().rsplit(b")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
                found.append(int(entry.parent.name))
    return found
