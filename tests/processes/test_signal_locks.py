"""No exception raised into a task leaves an effectq lock held.

A worker's time limit (Celery's soft time limit) raises from a signal handler
wherever the task's thread is, effectq's own code included. A lock acquired by
Python code (``threading.Condition.__enter__``, ``Event.wait``) can be left
held when the exception lands between the acquire and the ``try`` that would
release it; the next call that needs the lock then waits for ever.

The storm: a child process whose SIGALRM handler raises billiard's
``SoftTimeLimitExceeded`` every 10-200 µs, at most once per step, over the
heartbeat's paths (hold and drop a lease, a deferred write, the pending count,
settling a store's deferred writes) and whole effect calls. A lock left held
hangs the next step: the child's watchdog (``faulthandler``) dumps every
thread and exits, and the parent's own timeout stops a child that hangs
anyway, so a hang fails the test, never CI.

    python -m tests.processes.test_signal_locks SEED [SECONDS]   # one storm, by hand
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 2.0
"""How long each storm lasts."""
WATCHDOG = 20.0
"""How long after the storm's end the child dumps its threads and exits: a lock left held."""
FIXED_SEEDS = (1, 16)
"""Seeds every run tries; ``EFFECTQ_STORM_RUNS=N`` adds N random ones (one by default)."""

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")


def _seeds() -> list[int]:
    extra = int(os.environ.get("EFFECTQ_STORM_RUNS", "1"))
    return [*FIXED_SEEDS, *(random.SystemRandom().randrange(1, 2**31) for _ in range(extra))]


@pytest.mark.parametrize("seed", _seeds())
def test_a_signal_storm_over_the_heartbeat_and_effect_calls_leaves_no_lock_held(seed: int) -> None:
    """Under an exception raised from a signal handler at random moments, every step of the
    heartbeat and of an effect call either finishes or raises, and none leaves a lock held: the
    child finishes its storm, and afterwards holds, defers and settles without blocking."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.processes.test_signal_locks", str(seed), str(SECONDS)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=SECONDS + WATCHDOG + 30.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"seed {seed}: the storm child hung past its own watchdog\n{err[-8000:]}")
    assert proc.returncode == 0, (
        f"seed {seed}: exit {proc.returncode} (a hang dumps its threads)\n{err[-8000:]}"
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report["interrupted"] > 100, report  # the storm did land, many times
    assert report["steps"] > report["interrupted"], report
    assert report["pending_after"] == [0, 0], report  # no lease left held, no write left waiting
    assert report["dispatched_left"] == 0, report  # and every call's record says what happened


# -- the child ------------------------------------------------------------------------------


def _storm(seed: int, seconds: float) -> dict[str, Any]:
    import faulthandler

    faulthandler.dump_traceback_later(seconds + WATCHDOG, exit=True)

    from billiard.exceptions import SoftTimeLimitExceeded

    import effectq
    from effectq._runtime.leases import Lease, heartbeat
    from effectq._runtime.singleflight import flights

    rng = random.Random(seed)
    live = [False]  # the handler raises only while a step runs, once per step
    storming = [True]

    def on_alarm(signum: int, frame: Any) -> None:
        if storming[0]:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(10e-6, 200e-6))
        if live[0]:
            live[0] = False
            raise SoftTimeLimitExceeded()

    store = effectq.MemoryStore(namespace=f"storm{seed}")
    other = effectq.MemoryStore(namespace=f"storm{seed}b")
    written: list[int] = []
    events: list[Any] = []
    unsubscribe = effectq.events.subscribe(events.append)

    @effectq.effect(name="storm.act", lease=0.6)
    def act(n: int) -> int:
        return n

    def hold_and_drop() -> None:
        lease = Lease(store, "k", 1, rng.choice((300, 60_000)))  # a short one wakes the thread
        try:
            heartbeat.keep(lease)
            heartbeat.drop(lease)
        except BaseException:  # as the engine does: cut short anywhere, it drops the lease again
            heartbeat.drop(lease)
            raise

    def defer() -> None:
        heartbeat.defer(lambda: written.append(1) or True, "complete of k", store=store, advice="")

    def settle() -> None:
        heartbeat.settle_repairs(other, why="the storm")

    def pending() -> None:
        heartbeat.pending()

    def listen() -> None:
        effectq.events.subscribe(events.append)()

    calls = itertools.count()

    def call() -> None:
        # A key of its own each time: an interrupted call may leave its in-process flight
        # behind (effect.py), and a later call of that key would wait on it.
        with effectq.run(f"r{next(calls)}", store=store):
            act(1)
        del events[:]

    steps = [hold_and_drop, defer, hold_and_drop, settle, pending, listen, call, call]
    for step in steps:  # warm: the codec is built, the thread started, before the storm
        step()
    raised: dict[str, int] = {}
    odd: list[str] = []
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.001)
    count = interrupted = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        step = steps[count % len(steps)]
        try:
            live[0] = True
            step()
            live[0] = False
        except Exception as exc:  # the time limit, or what effectq made of it
            interrupted += 1
            raised[type(exc).__name__] = raised.get(type(exc).__name__, 0) + 1
            if not isinstance(exc, SoftTimeLimitExceeded):
                odd.append(repr(exc)[:300])
        count += 1
    storming[0] = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    live[0] = False
    unsubscribe()
    # Every lock is free again: each path runs without the storm, and the thread drains.
    for step in steps:
        step()
    deadline = time.monotonic() + 10.0
    while heartbeat.pending() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {
        "seed": seed,
        "steps": count,
        "interrupted": interrupted,
        "raised": raised,
        "pending_after": heartbeat.pending(),
        "flights_left": len(flights._flights),
        "dispatched_left": sum(r.status is effectq.Status.DISPATCHED for r in store.records()),
        "odd": odd[:5],
    }


if __name__ == "__main__":
    print(json.dumps(_storm(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else SECONDS)))
